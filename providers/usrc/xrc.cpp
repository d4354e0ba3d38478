// XRC domains (ibv_open_xrcd): the scope in which an XRC target QP
// (XRC_RECV) hands its requests to the XRC SRQ each names. Opened on the
// same file (the inode of attr->fd), two opens in a process share one
// domain, as the kernel shares one between processes; usrc has no kernel,
// so the domain, and the targets and SRQs in it, are this process's, and a
// target reaches the SRQs of its own context (docs/design.md).
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <new>

#include "usrc/usrc.h"

namespace usrc {

namespace {

struct Domains {
  std::mutex mu;
  std::map<std::pair<dev_t, ino_t>, XrcDomain *> by_inode;
};
Domains &domains() {
  static Domains d;
  return d;
}

}  // namespace

ibv_xrcd *open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr) {
  constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  const int oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ? attr->oflags : 0;
  auto *x = new (std::nothrow) Xrcd{};
  auto fail = [&](int e) -> ibv_xrcd * {
    delete x;
    errno = e;
    return nullptr;
  };
  if (!x) return fail(ENOMEM);
  if ((attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || (oflags & ~(O_CREAT | O_EXCL)))
    return fail(EINVAL);
  x->ctx = &impl(ibctx);
  if (attr->fd == -1) {
    // No file: a domain of its own (O_CREAT is required, as the kernel's).
    if (!(oflags & O_CREAT)) return fail(EINVAL);
    if (!(x->dom = new (std::nothrow) XrcDomain{})) return fail(ENOMEM);
    x->dom->opens = 1;
  } else {
    struct stat st;
    if (fstat(attr->fd, &st) != 0) return fail(EBADF);
    Domains &d = domains();
    std::lock_guard g(d.mu);
    auto it = d.by_inode.find({st.st_dev, st.st_ino});
    if (it == d.by_inode.end() && !(oflags & O_CREAT)) return fail(EINVAL);   // none yet, and not to be made
    if (it != d.by_inode.end() && (oflags & O_EXCL)) return fail(EEXIST);
    if (it != d.by_inode.end()) {
      x->dom = it->second;
    } else {
      if (!(x->dom = new (std::nothrow) XrcDomain{})) return fail(ENOMEM);
      x->dom->inode = {st.st_dev, st.st_ino};
      x->dom->shared = true;
      d.by_inode[x->dom->inode] = x->dom;
    }
    x->dom->opens++;
  }
  x->vx.xrcd.context = ibctx;
  x->vx.comp_mask = 0;
  return &x->vx.xrcd;
}

int close_xrcd(ibv_xrcd *ibx) {
  Xrcd *x = to_xrcd(ibx);
  if (x->users.load()) return EBUSY;   // its SRQs and target QPs
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    if (--x->dom->opens == 0) {
      if (x->dom->shared) d.by_inode.erase(x->dom->inode);
      delete x->dom;
    }
  }
  delete x;
  return 0;
}

int get_srq_num(ibv_srq *ibsrq, uint32_t *srq_num) {
  Srq *srq = to_srq(ibsrq);
  if (srq->vsrq.srq_type != IBV_SRQT_XRC) return EINVAL;
  *srq_num = srq->vsrq.srq_num;
  return 0;
}

}  // namespace usrc
