// The extended send API (ibv_wr_start ... ibv_wr_complete, man ibv_wr_post).
// Builders fill ibv_send_wr entries of the QP's batch; ibv_wr_complete posts
// the whole batch through the same checks as ibv_post_send, or none of it.
#include <cerrno>
#include <cstring>

#include "usrc/boundary.h"
#include "usrc/usrc.h"

namespace usrc {

namespace {

constexpr uint64_t kSupportedOps =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
    IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
    IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_ATOMIC_WRITE;

void fail(Qp *qp, int err) {
  if (!qp->batch_err) qp->batch_err = err;
}

// Starts the next work request of the batch; nullptr after an error.
ibv_send_wr *begin(ibv_qp_ex *x, ibv_wr_opcode op) {
  Qp *qp = to_qp(x);
  if (qp->batch_err) return nullptr;
  if (qp->nbatch >= qp->attr.cap.max_send_wr) {
    fail(qp, ENOMEM);   // more than the send queue can ever hold
    return nullptr;
  }
  if (qp->nbatch == qp->batch.size()) {
    int e = 0;
    if (!no_throw([&] { qp->batch.emplace_back(); }, &e)) {
      fail(qp, e);   // (no memory for a longer batch: ibv_wr_complete says so)
      return nullptr;
    }
  }
  Qp::PendingWr &p = qp->batch[qp->nbatch++];
  p.wr = {};
  p.wr.wr_id = x->wr_id;
  p.wr.send_flags = x->wr_flags;
  p.wr.opcode = op;
  p.inl_len = -1;
  return &p.wr;
}

// The work request that set_sge/set_inline_data complete.
Qp::PendingWr *current(ibv_qp_ex *x) {
  Qp *qp = to_qp(x);
  if (qp->batch_err) return nullptr;
  if (qp->nbatch == 0) {
    fail(qp, EINVAL);   // a setter with no work request to set
    return nullptr;
  }
  return &qp->batch[qp->nbatch - 1];
}

void wr_send(ibv_qp_ex *x) { begin(x, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex *x, __be32 imm) {
  if (ibv_send_wr *w = begin(x, IBV_WR_SEND_WITH_IMM)) w->imm_data = imm;
}

void rdma(ibv_qp_ex *x, ibv_wr_opcode op, uint32_t rkey, uint64_t va, __be32 imm) {
  if (ibv_send_wr *w = begin(x, op)) {
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = va;
    w->imm_data = imm;
  }
}
void wr_rdma_write(ibv_qp_ex *x, uint32_t rkey, uint64_t va) {
  rdma(x, IBV_WR_RDMA_WRITE, rkey, va, 0);
}
void wr_rdma_write_imm(ibv_qp_ex *x, uint32_t rkey, uint64_t va, __be32 imm) {
  rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, va, imm);
}
void wr_rdma_read(ibv_qp_ex *x, uint32_t rkey, uint64_t va) {
  rdma(x, IBV_WR_RDMA_READ, rkey, va, 0);
}

void atomic(ibv_qp_ex *x, ibv_wr_opcode op, uint32_t rkey, uint64_t va, uint64_t cmp_add,
            uint64_t swap) {
  if (ibv_send_wr *w = begin(x, op)) {
    w->wr.atomic.rkey = rkey;
    w->wr.atomic.remote_addr = va;
    w->wr.atomic.compare_add = cmp_add;
    w->wr.atomic.swap = swap;
  }
}
void wr_atomic_cmp_swp(ibv_qp_ex *x, uint32_t rkey, uint64_t va, uint64_t cmp, uint64_t swap) {
  atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, va, cmp, swap);
}
void wr_atomic_fetch_add(ibv_qp_ex *x, uint32_t rkey, uint64_t va, uint64_t add) {
  atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, va, add, 0);
}

void wr_bind_mw(ibv_qp_ex *x, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *info) {
  if (ibv_send_wr *w = begin(x, IBV_WR_BIND_MW)) {
    w->bind_mw.mw = mw;
    w->bind_mw.rkey = rkey;
    w->bind_mw.bind_info = *info;
  }
}
void wr_local_inv(ibv_qp_ex *x, uint32_t rkey) {
  if (ibv_send_wr *w = begin(x, IBV_WR_LOCAL_INV)) w->invalidate_rkey = rkey;
}
void wr_send_inv(ibv_qp_ex *x, uint32_t rkey) {
  if (ibv_send_wr *w = begin(x, IBV_WR_SEND_WITH_INV)) w->invalidate_rkey = rkey;
}

void wr_set_sge(ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (Qp::PendingWr *p = current(x)) {
    p->sge[0] = {addr, length, lkey};
    p->wr.num_sge = 1;
    p->inl_len = -1;
  }
}

void wr_set_sge_list(ibv_qp_ex *x, size_t n, const ibv_sge *list) {
  Qp::PendingWr *p = current(x);
  if (!p) return;
  if (n > rc::kMaxSge) return fail(to_qp(x), EINVAL);
  std::memcpy(p->sge, list, n * sizeof *list);
  p->wr.num_sge = static_cast<int>(n);
  p->inl_len = -1;
}

// Inline data is copied at once: the caller may reuse its buffer on return.
void wr_set_inline_data_list(ibv_qp_ex *x, size_t n, const ibv_data_buf *bufs) {
  Qp::PendingWr *p = current(x);
  if (!p) return;
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    if (bufs[i].length > rc::kMaxInline - len) return fail(to_qp(x), EINVAL);
    std::memcpy(p->inl + len, bufs[i].addr, bufs[i].length);
    len += bufs[i].length;
  }
  p->inl_len = static_cast<int32_t>(len);
  p->wr.num_sge = 1;
  p->wr.send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex *x, void *addr, size_t length) {
  ibv_data_buf b{addr, length};
  wr_set_inline_data_list(x, 1, &b);
}

// The 8 bytes to store are read now, as inline data.
void wr_atomic_write(ibv_qp_ex *x, uint32_t rkey, uint64_t va, const void *word) {
  if (ibv_send_wr *w = begin(x, IBV_WR_ATOMIC_WRITE)) {
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = va;
    wr_set_inline_data(x, const_cast<void *>(word), 8);
  }
}

void wr_start(ibv_qp_ex *x) {
  Qp *qp = to_qp(x);
  qp->nbatch = 0;
  qp->batch_err = 0;
}

void wr_abort(ibv_qp_ex *x) { wr_start(x); }

int wr_complete(ibv_qp_ex *x) {
  Qp *qp = to_qp(x);
  int err = qp->batch_err;
  size_t n = qp->nbatch;
  wr_start(x);
  if (err || n == 0) return err;
  for (size_t i = 0; i < n; i++) {
    Qp::PendingWr &p = qp->batch[i];
    if (p.inl_len >= 0) p.sge[0] = {reinterpret_cast<uintptr_t>(p.inl), uint32_t(p.inl_len), 0};
    p.wr.sg_list = p.sge;
    p.wr.next = i + 1 < n ? &qp->batch[i + 1].wr : nullptr;
  }
  Context &c = *qp->ctx;
  {
    std::lock_guard g(c.engine().mu);
    // All or none: every check that could stop ibv_post_send part way,
    // and the room, before anything is posted.
    if (qp->t->send_room() < n) return ENOMEM;
    for (size_t i = 0; i < n; i++)
      if (int e = check_send_wr(qp, qp->batch[i].wr)) return e;
    ibv_send_wr *bad = nullptr;
    err = post_send_locked(qp, &qp->batch[0].wr, &bad);
  }
  c.kick();
  return err;
}

// A UD QP's destination for the WR being built (post_ud_send checks it).
void wr_set_ud_addr(ibv_qp_ex *x, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (Qp::PendingWr *p = current(x)) p->wr.wr.ud = {ah, remote_qpn, remote_qkey};
}

// An XRC initiator's target SRQ for the WR being built.
void wr_set_xrc_srqn(ibv_qp_ex *x, uint32_t srqn) {
  if (Qp::PendingWr *p = current(x)) p->wr.qp_type.xrc.remote_srqn = srqn;
}

// Builders of operations this provider does not do: the error surfaces at
// ibv_wr_complete (they are unreachable through send_ops_flags, which
// create_qp_ex checks, but a slot is never left null).
void wr_unsupported_tso(ibv_qp_ex *x, void *, uint16_t, uint16_t) { fail(to_qp(x), EOPNOTSUPP); }

}  // namespace

int init_qp_ex(Qp *qp, uint64_t ops) {
  if (ops & ~kSupportedOps) return EOPNOTSUPP;
  ibv_qp_ex &x = qp->vqp.qp_ex;
  x.comp_mask = 0;
  x.wr_send = at_boundary<wr_send>;
  x.wr_send_imm = at_boundary<wr_send_imm>;
  x.wr_rdma_write = at_boundary<wr_rdma_write>;
  x.wr_rdma_write_imm = at_boundary<wr_rdma_write_imm>;
  x.wr_rdma_read = at_boundary<wr_rdma_read>;
  x.wr_atomic_cmp_swp = at_boundary<wr_atomic_cmp_swp>;
  x.wr_atomic_fetch_add = at_boundary<wr_atomic_fetch_add>;
  x.wr_set_sge = at_boundary<wr_set_sge>;
  x.wr_set_sge_list = at_boundary<wr_set_sge_list>;
  x.wr_set_inline_data = at_boundary<wr_set_inline_data>;
  x.wr_set_inline_data_list = at_boundary<wr_set_inline_data_list>;
  x.wr_start = at_boundary<wr_start>;
  x.wr_complete = at_boundary<wr_complete>;
  x.wr_abort = at_boundary<wr_abort>;
  x.wr_bind_mw = at_boundary<wr_bind_mw>;
  x.wr_local_inv = at_boundary<wr_local_inv>;
  x.wr_send_inv = at_boundary<wr_send_inv>;
  x.wr_send_tso = at_boundary<wr_unsupported_tso>;
  x.wr_set_ud_addr = at_boundary<wr_set_ud_addr>;
  x.wr_set_xrc_srqn = at_boundary<wr_set_xrc_srqn>;
  x.wr_atomic_write = at_boundary<wr_atomic_write>;
  qp->vqp.comp_mask |= VERBS_QP_EX;
  return 0;
}

}  // namespace usrc
