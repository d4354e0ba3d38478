// Memory windows (IBA 10.6.7): a range of an MR (registered with
// IBV_ACCESS_MW_BIND) that a peer reaches through the window's own R_Key
// and access rights. Type 1 is bound with ibv_bind_mw and unbound by a bind
// of length 0; type 2 is bound to one QP with IBV_WR_BIND_MW and serves that
// QP only, until invalidated by IBV_WR_LOCAL_INV or a peer's
// IBV_WR_SEND_WITH_INV. Binds and invalidations are work requests that
// take effect as they are posted and complete in send queue order
// (rc::Engine::post_local). A bound window sits in the context's MR table
// under its R_Key, as a view of its MR's memory (Mw::view), so the
// responder resolves it as it resolves an MR.
#include <cerrno>
#include <new>

#include "usrc/usrc.h"

namespace usrc {

using rc::WcStatus;

ibv_mw *alloc_mw(ibv_pd *ibpd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  auto *w = new (std::nothrow) Mw{};
  if (!w) {
    errno = ENOMEM;
    return nullptr;
  }
  Context &c = impl(ibpd->context);
  {
    std::lock_guard g(c.engine().mu);
    w->mw.rkey = c.new_mw_key();
  }
  w->mw.context = ibpd->context;
  w->mw.pd = ibpd;
  w->mw.type = type;
  w->mw.handle = w->mw.rkey;
  w->view.mw = w;
  w->view.on = to_pd(ibpd);
  to_pd(ibpd)->users++;
  return &w->mw;
}

// Off the MR table: its R_Key reaches nothing. Under the engine's lock.
static void unbind(Context &c, Mw *w) {
  if (!w->mr) return;
  c.remove_mr(w->mw.rkey);
  w->mr->windows--;
  w->mr = nullptr;
}

int dealloc_mw(ibv_mw *mw) {
  Mw *w = reinterpret_cast<Mw *>(mw);
  Context &c = impl(mw->context);
  {
    std::lock_guard g(c.engine().mu);
    unbind(c, w);
  }
  unuse(to_pd(mw->pd));
  delete w;
  return 0;
}

// Binds w for qp with R_Key rkey to b's range (length 0: unbinds, type 1
// only). Under the engine's lock. The IBA's bind checks (10.6.7.2): the
// window, the QP and the MR of one PD; an MR that allows binding and holds
// the range; remote write or atomic access only over local write; the new
// key the window's own but for its low 8 bits (ibv_inc_rkey); a type 2
// window not bound already.
static WcStatus bind(Context &c, const Qp &qp, Mw *w, uint32_t rkey, const ibv_mw_bind_info &b) {
  const Pd *pd = prot_pd(qp.vqp.qp.pd);
  const bool type2 = w->mw.type == IBV_MW_TYPE_2;
  constexpr unsigned kRemote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if (w->mw.context != qp.vqp.qp.context || prot_pd(w->mw.pd) != pd || (rkey >> 8) != (w->mw.rkey >> 8) ||
      (type2 && (w->mr || !b.length)))
    return WcStatus::mw_bind_err;
  Mr *mr = b.mr ? to_mr(b.mr) : nullptr;
  if (mr && mr->origin) mr = mr->origin;   // (an imported MR: the MR it names)
  if (b.length) {
    if (!mr || mr->mw || mr->pd != pd || !(mr->access & IBV_ACCESS_MW_BIND) || !mr->range(b.addr, b.length) ||
        (b.mw_access_flags & ~(kRemote | IBV_ACCESS_LOCAL_WRITE)) ||   // (zero-based windows: no)
        ((b.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(mr->access & IBV_ACCESS_LOCAL_WRITE)))
      return WcStatus::mw_bind_err;
    // (A key another MR holds: the window cannot take it.)
    if (const Mr *other = c.find_mr(rkey); other && other != &w->view) return WcStatus::mw_bind_err;
  }
  unbind(c, w);
  w->mw.rkey = rkey;
  if (!b.length) return WcStatus::success;
  Mr &v = w->view;
  v.pd = mr->pd;
  v.addr = mr->range(b.addr, b.length);
  v.iova = b.addr;
  v.length = b.length;
  v.access = b.mw_access_flags & kRemote;
  v.odp = mr->odp;
  v.mw_qpn = type2 ? qp.t->qpn : 0;
  c.put_mr(rkey, &v);
  w->mr = mr;
  mr->windows++;
  return WcStatus::success;
}

bool Context::invalidate(const void *pd, uint32_t qpn, uint32_t rkey) {
  Mr *v = find_mr(rkey);
  if (!v || !v->mw || v->mw->mw.type != IBV_MW_TYPE_2 || v->pd != pd || (qpn && v->mw_qpn != qpn)) return false;
  unbind(*this, v->mw);
  return true;
}

// type1: ibv_bind_mw's request (the only way to bind a type 1 window).
static WcStatus local_op(Qp *qp, const ibv_send_wr &wr, bool type1) {
  Context &c = *qp->ctx;
  if (qp->t->state == rc::QpState::err) return WcStatus::success;   // flushed: no effect
  if (wr.opcode == IBV_WR_LOCAL_INV)
    return c.invalidate(prot_pd(qp->vqp.qp.pd), 0, wr.invalidate_rkey) ? WcStatus::success : WcStatus::loc_qp_op_err;
  Mw *w = reinterpret_cast<Mw *>(wr.bind_mw.mw);
  if (!w || (w->mw.type == IBV_MW_TYPE_1) != type1) return WcStatus::mw_bind_err;
  return bind(c, *qp, w, wr.bind_mw.rkey, wr.bind_mw.bind_info);
}

int post_local_wr(Qp *qp, const ibv_send_wr &wr, bool type1) {
  rc::Engine &e = qp->ctx->engine();
  rc::SendWr *s = e.send_slot(*qp->t);
  if (!s) return ENOMEM;
  const rc::WrOpcode op = static_cast<rc::WrOpcode>(wr.opcode);
  const WcStatus st = local_op(qp, wr, type1);
  // A bind or invalidation that fails completes in error and takes the
  // QP to the Error state (IBA 10.6.7.2.3).
  if (st != WcStatus::success) {
    e.post_error(*qp->t, wr.wr_id, rc::wr_info(op).wc_opcode, st, false);
    return 0;
  }
  s->wr_id = wr.wr_id;
  s->opcode = op;
  s->flags = wr.send_flags & (rc::kFence | rc::kSignaled);
  s->num_sge = 0;
  e.post_local(*qp->t);
  return 0;
}

int bind_mw(ibv_qp *ibqp, ibv_mw *mw, ibv_mw_bind *mb) {
  Qp *qp = to_qp(ibqp);
  if (qp->t->type == rc::QpType::ud) return EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = mb->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = mb->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = mb->bind_info;
  int err;
  {
    std::lock_guard g(qp->ctx->engine().mu);
    err = qp->t->state <= rc::QpState::rtr ? EINVAL : post_local_wr(qp, wr, true);
  }
  qp->ctx->kick();
  return err;
}

}  // namespace usrc
