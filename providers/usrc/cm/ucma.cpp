// The emulated rdma_cm character device (docs/cm.md). librdmacm opens
// /dev/infiniband/rdma_cm with open(2), checks with fstat(2) that it is a
// character device, then writes commands to it and closes it; usrc has no
// kernel CM, so when this library is preloaded (`usrc exec`), it supplies
// open, write, close and fstat: an open of that path gives an eventfd of
// the process (readable while a CM event is queued, as the kernel's file
// is), whose writes the in-process Cm executes. Every other call goes
// straight to libc, after one relaxed load while no such fd is open.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "usrc/cm/host.h"

namespace usrc::cm {
namespace {

constexpr const char *kCdev = "/dev/infiniband/rdma_cm";

std::atomic<int> g_open{0};   // emulated fds open
std::mutex g_mu;
std::unordered_map<int, std::shared_ptr<File>> g_files;

template <class F>
F real(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

std::shared_ptr<File> file_of(int fd) {
  if (g_open.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard g(g_mu);
  auto it = g_files.find(fd);
  return it == g_files.end() ? nullptr : it->second;
}

int open_cdev(int flags) {
  int e = 0;
  Cm *cm = process_cm(&e);
  if (!cm) {
    errno = e;
    return -1;
  }
  int fd = eventfd(0, (flags & O_CLOEXEC) ? EFD_CLOEXEC : 0);
  if (fd < 0) return -1;
  if (flags & O_NONBLOCK) fcntl(fd, F_SETFL, O_NONBLOCK);
  std::lock_guard g(g_mu);
  g_files[fd] = cm->open(fd);
  g_open.fetch_add(1, std::memory_order_relaxed);
  return fd;
}

int open_impl(const char *path, int flags, mode_t mode, const char *sym) {
  if (path && std::strcmp(path, kCdev) == 0) return open_cdev(flags);
  static auto fn = real<int (*)(const char *, int, ...)>(sym);
  return fn(path, flags, mode);
}

}  // namespace
}  // namespace usrc::cm

using namespace usrc::cm;

extern "C" __attribute__((visibility("default"))) int usrc_cm_open(const char *path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  return open_impl(path, flags, mode, "open");
}

extern "C" __attribute__((visibility("default"))) int usrc_cm_open64(const char *path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  return open_impl(path, flags, mode, "open64");
}

extern "C" __attribute__((visibility("default"))) ssize_t usrc_cm_write(int fd, const void *buf, size_t n) {
  static auto fn = real<ssize_t (*)(int, const void *, size_t)>("write");
  auto f = file_of(fd);
  if (!f) return fn(fd, buf, n);
  int e = 0;
  Cm *cm = process_cm(&e);
  f->nonblocking = fcntl(fd, F_GETFL) & O_NONBLOCK;
  ssize_t r = cm->write(f.get(), buf, n, [](int other) { return file_of(other).get(); });
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}

extern "C" __attribute__((visibility("default"))) int usrc_cm_close(int fd) {
  static auto fn = real<int (*)(int)>("close");
  if (g_open.load(std::memory_order_relaxed) != 0) {
    std::shared_ptr<File> f;
    {
      std::lock_guard g(g_mu);
      auto it = g_files.find(fd);
      if (it != g_files.end()) {
        f = std::move(it->second);
        g_files.erase(it);
        g_open.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (f) {
      int e = 0;
      process_cm(&e)->close(f.get());
    }
  }
  return fn(fd);
}

namespace {
void as_cdev(int fd, struct stat *st) {
  if (file_of(fd)) {
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = makedev(10, 58);   // any: librdmacm compares only a number the kernel gave it
  }
}
}  // namespace

extern "C" __attribute__((visibility("default"))) int usrc_cm_fstat(int fd, struct stat *st) {
  static auto fn = real<int (*)(int, struct stat *)>("fstat");
  int r = fn(fd, st);
  if (r == 0) as_cdev(fd, st);
  return r;
}

extern "C" __attribute__((visibility("default"))) int usrc_cm_fstat64(int fd, struct stat64 *st) {
  static auto fn = real<int (*)(int, struct stat64 *)>("fstat64");
  int r = fn(fd, st);
  if (r == 0) as_cdev(fd, reinterpret_cast<struct stat *>(st));
  return r;
}

// Exported under libc's own versions of these calls (usrc.map, written by
// CMake for the architecture's glibc base version), so the references of
// stock binaries and libraries bind to them when this library is preloaded.
#define USRC_STR2(x) #x
#define USRC_STR(x) USRC_STR2(x)
__asm__(".symver usrc_cm_open,open@@" USRC_STR(USRC_GLIBC_BASE));
__asm__(".symver usrc_cm_open64,open64@@" USRC_STR(USRC_GLIBC_BASE));
__asm__(".symver usrc_cm_write,write@@" USRC_STR(USRC_GLIBC_BASE));
__asm__(".symver usrc_cm_close,close@@" USRC_STR(USRC_GLIBC_BASE));
__asm__(".symver usrc_cm_fstat,fstat@@GLIBC_2.33");
__asm__(".symver usrc_cm_fstat64,fstat64@@GLIBC_2.33");
