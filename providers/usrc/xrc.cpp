// XRC domains (ibv_open_xrcd): the scope in which an XRC target QP
// (XRC_RECV) hands its requests to the XRC SRQ each names. Opened on the
// same file (the inode of attr->fd), two opens in a process share one
// domain, as the kernel shares one between processes; usrc has no kernel,
// so the domain, and the targets and SRQs in it, are this process's, and a
// target reaches the SRQs of its own context (docs/design.md).
//
// A target QP can be opened again by its number (ibv_open_qp) from any
// context of this process with an XRC domain on the same file: a handle of
// that context on the QP, which stays in the context that created it. As
// the kernel's shared QPs, every handle may modify, query and destroy it,
// gets its async events, and the QP is destroyed with its last handle.
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "usrc/boundary.h"
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

bool add_tgt(Qp *qp) {
  Domains &d = domains();
  std::lock_guard g(d.mu);
  int e = 0;
  return no_throw([&] { qp->xrcd->dom->tgts[qp->vqp.qp.qp_num] = qp; }, &e);
}

ibv_qp *open_qp(ibv_context *ibctx, ibv_qp_open_attr *a) {
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  auto fail = [](int e) -> ibv_qp * {
    errno = e;
    return nullptr;
  };
  // (libibverbs' rules for the mask: unknown bits EOPNOTSUPP, a missing
  // field EINVAL.)
  if (!a) return fail(EINVAL);
  if (a->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED) return fail(EOPNOTSUPP);
  if ((a->comp_mask & kNeeded) != kNeeded || !a->xrcd || a->xrcd->context != ibctx ||
      a->qp_type != IBV_QPT_XRC_RECV)
    return fail(EINVAL);
  Xrcd *x = to_xrcd(a->xrcd);
  auto *h = new (std::nothrow) Qp{};
  if (!h) return fail(ENOMEM);
  Qp *real = nullptr;
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    auto it = x->dom->tgts.find(a->qp_num);
    if (it == x->dom->tgts.end()) {
      delete h;
      return fail(EINVAL);   // no target of that number in the domain
    }
    real = it->second;
    std::lock_guard ge(real->ctx->engine().mu);
    int e = 0;
    if (!no_throw([&] { real->opened.push_back(h); }, &e)) {
      delete h;
      return fail(e);
    }
    // (The QP's context lives while the handle does, though the one that
    // created it be closed.)
    real->ctx->ref();
  }
  x->users++;
  h->real = real;
  h->ctx = real->ctx;
  h->t = real->t;
  h->xrcd = x;
  h->vqp.xrcd = &x->vx;
  h->vqp.comp_mask = VERBS_QP_XRCD;
  ibv_qp &q = h->vqp.qp;
  q.context = ibctx;
  q.qp_context = (a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? a->qp_context : nullptr;
  q.qp_num = a->qp_num;
  q.qp_type = IBV_QPT_XRC_RECV;
  q.state = IBV_QPS_UNKNOWN;   // (as libibverbs' opens: query_qp tells)
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return &q;
}

int close_tgt_handle(Qp *h) {
  Qp *real = h->real;
  Context *owner = real->ctx;
  bool last;
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    {
      std::lock_guard ge(owner->engine().mu);
      if (h == real) real->closed = true;
      else std::erase(real->opened, h);
      last = real->closed && real->opened.empty();
    }
    // (No more opens of it: the domain outlives the QP, as the handle's
    // use of its XRC domain is given up last.)
    if (last) h->xrcd->dom->tgts.erase(real->vqp.qp.qp_num);
  }
  Xrcd *x = h->xrcd;
  if (h != real) delete h;
  if (last) destroy_qp_now(real);
  x->users--;
  if (h != real) Context::unref(owner);   // (after the QP's destruction in it)
  return 0;
}

int get_srq_num(ibv_srq *ibsrq, uint32_t *srq_num) {
  Srq *srq = to_srq(ibsrq);
  if (srq->vsrq.srq_type != IBV_SRQT_XRC) return EINVAL;
  *srq_num = srq->vsrq.srq_num;
  return 0;
}

}  // namespace usrc
