#include "usrc/net/rtnl.h"

#include <libmnl/libmnl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace usrc::net {

Rtnl::~Rtnl() {
  if (nl_) mnl_socket_close(nl_);
}

bool Rtnl::open(unsigned groups) {
  nl_ = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (!nl_) return false;
  buf_.resize(kBuffer);
  if (mnl_socket_bind(nl_, groups, MNL_SOCKET_AUTOPID) < 0) {
    const int e = errno;
    mnl_socket_close(nl_);
    nl_ = nullptr;
    errno = e;
    return false;
  }
  return true;
}

int Rtnl::fd() const { return nl_ ? mnl_socket_get_fd(nl_) : -1; }

bool Rtnl::request(uint16_t type, uint16_t flags, const void *hdr, size_t len) {
  if (!nl_) return false;
  alignas(nlmsghdr) char buf[256];
  if (mnl_nlmsg_size(len) > sizeof buf) return false;
  nlmsghdr *h = mnl_nlmsg_put_header(buf);
  h->nlmsg_type = type;
  h->nlmsg_flags = NLM_F_REQUEST | flags;
  h->nlmsg_seq = ++seq_;
  memcpy(mnl_nlmsg_put_extra_header(h, len), hdr, len);
  return mnl_socket_sendto(nl_, h, h->nlmsg_len) == ssize_t(h->nlmsg_len);
}

bool Rtnl::read(const std::function<void(const nlmsghdr *)> &each) {
  if (!nl_) return true;
  bool complete = true;
  for (;;) {
    const ssize_t n = mnl_socket_recvfrom(nl_, buf_.data(), buf_.size());
    if (n < 0 && errno == ENOBUFS) {
      complete = false;
      continue;
    }
    if (n <= 0) return complete;
    // Notifications (sequence 0) and answers alike; the end of a dump and
    // the kernel's errors end the walk of this buffer only; a dump the
    // table changed under (NLM_F_DUMP_INTR) is as good as lost.
    auto cb = [](const nlmsghdr *h, void *f) {
      (*static_cast<const std::function<void(const nlmsghdr *)> *>(f))(h);
      return int(MNL_CB_OK);
    };
    if (mnl_cb_run(buf_.data(), size_t(n), 0, 0, cb, const_cast<std::function<void(const nlmsghdr *)> *>(&each)) < 0 &&
        errno == EINTR)
      complete = false;
  }
}

}  // namespace usrc::net
