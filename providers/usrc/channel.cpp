// Completion channels. libibverbs creates them by writing a command to the
// kernel, which usrc does not have, and never asks the provider. So when
// this library is preloaded (`usrc exec` does that), it exports
// ibv_create_comp_channel / ibv_destroy_comp_channel itself: for a usrc
// context the channel's fd is one end of a datagram socket pair whose other
// end receives the CQ pointers of completion events; any other context is
// passed on to libibverbs. Without the preload the stock call fails cleanly
// (the context's command fd is read-only), and the application never gets
// a channel whose fd it does not own.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "usrc/boundary.h"
#include "usrc/usrc.h"

extern "C" const verbs_device_ops usrc_device_ops;

namespace usrc {

namespace {
std::mutex g_mu;
std::unordered_map<ibv_comp_channel *, int> g_writers;

bool is_usrc(ibv_context *ctx) {
  const auto *vdev = reinterpret_cast<const verbs_device *>(ctx->device);
  return vdev->ops && vdev->ops->name && std::strcmp(vdev->ops->name, "usrc") == 0;
}

template <class F>
F next_symbol(const char *name) {
  return reinterpret_cast<F>(dlvsym(RTLD_NEXT, name, "IBVERBS_1.0"));
}
}  // namespace

int channel_writer(ibv_comp_channel *ch) {
  std::lock_guard g(g_mu);
  auto it = g_writers.find(ch);
  return it == g_writers.end() ? -1 : it->second;
}

}  // namespace usrc

using namespace usrc;

extern "C" __attribute__((visibility("default"))) ibv_comp_channel *
usrc_create_comp_channel(ibv_context *ctx) {
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  if (!is_usrc(ctx)) {
    auto real = next_symbol<ibv_comp_channel *(*)(ibv_context *)>("ibv_create_comp_channel");
    if (!real) {
      errno = ENOSYS;
      return nullptr;
    }
    return real(ctx);
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  // malloc: the stock ibv_destroy_comp_channel would free() it.
  auto *ch = static_cast<ibv_comp_channel *>(calloc(1, sizeof(ibv_comp_channel)));
  if (!ch) {
    close(sv[0]);
    close(sv[1]);
    errno = ENOMEM;
    return nullptr;
  }
  ch->context = ctx;
  ch->fd = sv[0];
  ch->refcnt = 0;
  std::lock_guard g(g_mu);
  int e = 0;
  if (!no_throw([&] { g_writers[ch] = sv[1]; }, &e)) {   // (boundary.h)
    close(sv[0]);
    close(sv[1]);
    free(ch);
    errno = e;
    return nullptr;
  }
  return ch;
}

extern "C" __attribute__((visibility("default"))) int usrc_destroy_comp_channel(
    ibv_comp_channel *ch) {
  int wfd;
  {
    std::lock_guard g(g_mu);
    auto it = g_writers.find(ch);
    if (it == g_writers.end()) {
      auto real = next_symbol<int (*)(ibv_comp_channel *)>("ibv_destroy_comp_channel");
      return real ? real(ch) : ENOSYS;
    }
    // Same rule as libibverbs: a channel still used by a CQ is busy.
    pthread_mutex_lock(&ch->context->mutex);
    bool busy = ch->refcnt != 0;
    pthread_mutex_unlock(&ch->context->mutex);
    if (busy) return EBUSY;
    wfd = it->second;
    g_writers.erase(it);
  }
  close(ch->fd);
  close(wfd);
  free(ch);
  return 0;
}

// Exported as ibv_create_comp_channel@IBVERBS_1.0 (see usrc.map), the
// version stock binaries link against, so a preloaded copy interposes.
__asm__(".symver usrc_create_comp_channel,ibv_create_comp_channel@@IBVERBS_1.0");
__asm__(".symver usrc_destroy_comp_channel,ibv_destroy_comp_channel@@IBVERBS_1.0");
