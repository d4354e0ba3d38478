// Shared receive queues (IBA 10.2.9): the WQEs live in an rc::RecvQueue
// that the QPs created on the SRQ take from (rc::Qp::rq); the engine's lock
// guards it.
#include <cerrno>
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "usrc/boundary.h"
#include "usrc/common/random.h"
#include "usrc/usrc.h"

namespace usrc {

ibv_srq *create_srq(ibv_pd *ibpd, ibv_srq_init_attr *ia) {
  ibv_srq_attr &a = ia->attr;
  if (a.max_wr > rc::kMaxWr || a.max_sge > rc::kMaxSge) {
    errno = EINVAL;
    return nullptr;
  }
  Context &c = impl(ibpd->context);
  auto *srq = new (std::nothrow) Srq{};
  if (!srq) {
    errno = ENOMEM;
    return nullptr;
  }
  int e = ENOMEM;
  // (From a parent domain's allocators, if it has them.)
  if (!no_throw([&] { srq->q.init(std::max(a.max_wr, 1u), to_pd(ibpd)->buffers(), rc::BufferKind::srq); }, &e)) {
    delete srq;
    errno = e;
    return nullptr;
  }
  srq->ctx = &c;
  srq->q.user = srq;
  {
    std::lock_guard g(c.engine().mu);
    if (!no_throw([&] { c.engine().add_srq(&srq->q); }, &e)) {
      delete srq;
      errno = e;
      return nullptr;
    }
  }
  srq->vsrq.srq_type = IBV_SRQT_BASIC;
  // (libibverbs' ibv_create_srq sets these too; ibv_create_srq_ex's way
  // to us does not.)
  ibv_srq &s = srq->vsrq.srq;
  s.context = ibpd->context;
  s.pd = ibpd;
  s.srq_context = ia->srq_context;
  s.events_completed = 0;
  pthread_mutex_init(&s.mutex, nullptr);
  pthread_cond_init(&s.cond, nullptr);
  // What the SRQ really has (the caller reads it back); srq_limit is set
  // by modify_srq only.
  a.max_wr = srq->q.capacity();
  a.max_sge = rc::kMaxSge;
  to_pd(ibpd)->users++;
  return &s;
}

ibv_srq *create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *ia) {
  // Basic, XRC and tag matching SRQs.
  constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ |
                              IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_TM;
  const ibv_srq_type type = (ia->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? ia->srq_type : IBV_SRQT_BASIC;
  if ((ia->comp_mask & ~kKnown) || (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!(ia->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !ia->pd || ia->pd->context != ibctx) {
    errno = EINVAL;
    return nullptr;
  }
  // An XRC SRQ (IBA 10.2.9.2): of an XRC domain, with a CQ of its own for
  // the receives of every target QP that names it.
  const bool xrc = type == IBV_SRQT_XRC;
  if (xrc && (!(ia->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(ia->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !ia->xrcd ||
              !ia->cq || ia->xrcd->context != ibctx || ia->cq->context != ibctx)) {
    errno = EINVAL;
    return nullptr;
  }
  // A tag matching SRQ (rc/tm.h): its list's size and the list operations
  // of one ibv_post_srq_ops within the device's limits (tm_caps), a CQ for
  // their completions.
  const bool tm = type == IBV_SRQT_TM;
  const ibv_tm_cap &tc = ia->tm_cap;
  if (tm && (!(ia->comp_mask & IBV_SRQ_INIT_ATTR_TM) || !(ia->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !ia->cq ||
             ia->cq->context != ibctx || tc.max_num_tags == 0 || tc.max_num_tags > rc::kTmMaxTags ||
             tc.max_ops == 0 || tc.max_ops > rc::kTmMaxOps)) {
    errno = EINVAL;
    return nullptr;
  }
  std::unique_ptr<rc::TagList> list;
  int err = ENOMEM;
  if (tm && !no_throw([&] { list = std::make_unique<rc::TagList>(tc.max_num_tags); }, &err)) {
    errno = err;
    return nullptr;
  }
  ibv_srq_init_attr a{ia->srq_context, ia->attr};
  ibv_srq *s = create_srq(ia->pd, &a);
  if (!s) return nullptr;
  ia->attr = a.attr;
  if (tm) {
    Srq *srq = to_srq(s);
    list->max_ops = tc.max_ops;
    list->cq = &to_cq(ia->cq)->ring;
    srq->tm = std::move(list);
    {
      std::lock_guard g(srq->ctx->engine().mu);
      srq->q.tm = srq->tm.get();
    }
    srq->vsrq.srq_type = IBV_SRQT_TM;
    srq->vsrq.cq = ia->cq;
    to_cq(ia->cq)->qps++;
  }
  if (xrc) {
    Srq *srq = to_srq(s);
    Xrcd *x = to_xrcd(ia->xrcd);
    rc::Engine &e = srq->ctx->engine();
    std::lock_guard g(e.mu);
    // Its number (the XRCETH's): the context's slot above a 12-bit index
    // (as a QPN), unique per device on the host (xrc.cpp); the index from
    // a random start.
    uint32_t idx = random_u32(), n = 0;
    for (uint32_t k = 0; k < kQpsPerSlot && !n; k++, idx++)
      if (!e.has_xrc_srq(e.slot() << kQpnIndexBits | (idx & (kQpsPerSlot - 1))))
        n = e.slot() << kQpnIndexBits | (idx & (kQpsPerSlot - 1));
    int err = n ? ENOMEM : ENOSPC;
    if (!n || !no_throw([&] { e.add_xrc_srq(n, {&srq->q, &to_cq(ia->cq)->ring, prot_pd(ia->pd), x->dom}); }, &err)) {
      e.remove_srq(&srq->q);
      unuse(to_pd(ia->pd));
      delete srq;
      errno = err;
      return nullptr;
    }
    srq->vsrq.srq_type = IBV_SRQT_XRC;
    srq->vsrq.xrcd = &x->vx;
    srq->vsrq.cq = ia->cq;
    srq->vsrq.srq_num = n;
    srq->ctx->xrc_publish(*srq, *x->dom);   // (a domain opened on a file: for other processes too)
    x->users++;
    to_cq(ia->cq)->qps++;
  }
  return s;
}

int modify_srq(ibv_srq *ibsrq, ibv_srq_attr *attr, int mask) {
  Srq *srq = to_srq(ibsrq);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  rc::RecvQueue &q = srq->q;
  // A new array is made before the lock is taken (it may come from a
  // parent domain's allocator); the old one is freed after it is released.
  rc::Buffer<rc::RecvWqe> slots;
  if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr && attr->max_wr <= rc::kMaxWr) {
    int e = ENOMEM;
    if (!no_throw([&] { slots = rc::Buffer<rc::RecvWqe>(attr->max_wr, q.slots.source(), rc::BufferKind::srq); }, &e))
      return e;
  }
  std::lock_guard g(srq->ctx->engine().mu);
  // A new size holds what is posted; a limit is below the size, and not
  // above what is posted (it would be reached at once).
  const uint32_t size = (mask & IBV_SRQ_MAX_WR) ? attr->max_wr : q.capacity();
  if ((mask & IBV_SRQ_MAX_WR) && (size > rc::kMaxWr || size < q.size() || size == 0)) return EINVAL;
  if ((mask & IBV_SRQ_LIMIT) && (attr->srq_limit >= size || attr->srq_limit > q.size())) return EINVAL;
  if ((mask & IBV_SRQ_MAX_WR) && size != q.capacity()) rc::Engine::resize(q, slots);
  if (mask & IBV_SRQ_LIMIT) q.limit = attr->srq_limit;
  return 0;
}

int query_srq(ibv_srq *ibsrq, ibv_srq_attr *attr) {
  Srq *srq = to_srq(ibsrq);
  std::lock_guard g(srq->ctx->engine().mu);
  attr->max_wr = srq->q.capacity();
  attr->max_sge = rc::kMaxSge;
  attr->srq_limit = srq->q.limit;
  return 0;
}

int destroy_srq(ibv_srq *ibsrq) {
  Srq *srq = to_srq(ibsrq);
  if (srq->qps.load()) return EBUSY;   // QPs still take from it
  {
    std::lock_guard g(srq->ctx->engine().mu);
    srq->ctx->engine().remove_srq(&srq->q);
    if (srq->vsrq.srq_type == IBV_SRQT_XRC) {
      srq->ctx->xrc_withdraw(*srq, *to_xrcd(&srq->vsrq.xrcd->xrcd)->dom);
      srq->ctx->engine().remove_xrc_srq(srq->vsrq.srq_num);
    }
  }
  if (srq->vsrq.srq_type == IBV_SRQT_XRC) to_xrcd(&srq->vsrq.xrcd->xrcd)->users--;
  if (srq->vsrq.srq_type == IBV_SRQT_XRC || srq->vsrq.srq_type == IBV_SRQT_TM) to_cq(srq->vsrq.cq)->qps--;
  unuse(to_pd(ibsrq->pd));
  delete srq;
  return 0;
}

// Receives are checked as a QP's are (map_recv_sges): one that fails a
// check completes with a local protection error on the QP whose message
// uses it.
int post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad) {
  Srq *srq = to_srq(ibsrq);
  Context &c = *srq->ctx;
  const Pd *pd = prot_pd(ibsrq->pd);   // (a parent domain's SRQ: its PD's keys)
  int err = 0;
  std::lock_guard g(c.engine().mu);
  for (; wr; wr = wr->next) {
    rc::RecvWr *w = rc::Engine::recv_slot(srq->q);
    if (!w) {
      err = ENOMEM;
      break;
    }
    uint64_t len;
    if (wr->num_sge < 0 || wr->num_sge > static_cast<int>(rc::kMaxSge)) {
      err = EINVAL;
      break;
    }
    const bool ok = map_recv_sges(c, pd, *wr, w, &len);
    rc::Engine::post_recv_slot(srq->q, len, !ok);
  }
  if (!srq->waiting.empty()) c.xrc_drain(*srq);   // (forwarded packets waited for these)
  if (err && bad) *bad = wr;
  return err;
}

// Tag list operations (man ibv_post_srq_ops) on a TM SRQ, each done at
// once, under the engine's lock, in order; its completion (signaled, or
// an error) is on the SRQ's CQ before the call returns. An operation that
// cannot be taken stops the list there (*bad): EINVAL (bad input: an
// unknown opcode, flag or handle, too many SGEs or none given), ENOMEM
// (the list is full, more than max_ops operations, no room in the CQ).
// A DEL of a tag that is no longer posted (a message consumed it)
// completes with IBV_WC_TM_ERR.
int post_srq_ops(ibv_srq *ibsrq, ibv_ops_wr *wr, ibv_ops_wr **bad) {
  Srq *srq = to_srq(ibsrq);
  if (!srq->tm) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  Context &c = *srq->ctx;
  rc::TagList &l = *srq->tm;
  const Pd *pd = prot_pd(ibsrq->pd);
  int err = 0;
  std::lock_guard g(c.engine().mu);
  for (uint32_t n = 0; wr; wr = wr->next, n++) {
    const ibv_ops_wr &w = *wr;
    const uint32_t h = w.tm.handle;
    // (From C, the opcode may be any value: read as an int, not as the
    // enum, whose values end at 3.)
    int op;
    static_assert(sizeof op == sizeof w.opcode);
    std::memcpy(&op, &w.opcode, sizeof op);
    if ((w.flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) ||
        (op == IBV_WR_TAG_ADD && (w.tm.add.num_sge < 0 || w.tm.add.num_sge > int(rc::kMaxSge) ||
                                  (w.tm.add.num_sge && !w.tm.add.sg_list))) ||
        (op == IBV_WR_TAG_DEL && h >= l.e.size()) ||
        (op != IBV_WR_TAG_ADD && op != IBV_WR_TAG_DEL && op != IBV_WR_TAG_SYNC)) {
      err = EINVAL;
      break;
    }
    if (n == l.max_ops || l.cq->full() || (op == IBV_WR_TAG_ADD && l.free == rc::TagList::kNone)) {
      err = ENOMEM;
      break;
    }
    if (w.flags & IBV_OPS_TM_SYNC) l.sync(w.tm.unexpected_cnt);
    rc::Completion cpl{w.wr_id, rc::WcStatus::success, rc::WcOpcode::tm_sync, false, false, 0, 0, 0, 0, 0, now_ns()};
    if (op == IBV_WR_TAG_ADD) {
      rc::TagList::Entry &e = *l.add();
      const ibv_recv_wr rw{w.tm.add.recv_wr_id, nullptr, w.tm.add.sg_list, w.tm.add.num_sge};
      uint64_t len;
      // (An SGE that fails its checks: posted bad, as post_srq_recv's, and
      // the message that takes it fails.)
      e.wqe.bad = !map_recv_sges(c, pd, rw, &e.wqe.wr, &len);
      e.wqe.length = static_cast<uint32_t>(std::min<uint64_t>(len, rc::kMaxMsgSize));
      e.tag = w.tm.add.tag;
      e.mask = w.tm.add.mask;
      wr->tm.handle = static_cast<uint32_t>(&e - l.e.data());
      cpl.opcode = rc::WcOpcode::tm_add;
    } else if (op == IBV_WR_TAG_DEL) {
      cpl.opcode = rc::WcOpcode::tm_del;
      if (l.e[h].posted) l.remove(h);
      else cpl.status = rc::WcStatus::tm_err;
    }
    // The counts differ: the application has unexpected messages to
    // handle, and then a TAG_SYNC to post (its tags added meanwhile wait).
    if (op != IBV_WR_TAG_SYNC && !l.in_sync()) cpl.tm_flags = rc::kWcTmSyncReq;
    if ((w.flags & IBV_OPS_SIGNALED) || cpl.status != rc::WcStatus::success) l.cq->push(cpl);
  }
  if (err && bad) *bad = wr;
  return err;
}

}  // namespace usrc
