#include "usrc/rc/engine.h"

#include <cstring>

#include "usrc/common/guard.h"
#include "usrc/common/log.h"
#include "usrc/common/random.h"
#include "usrc/common/tunables.h"
#include "usrc/net/roce_port.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"
#include "usrc/wire/icrc.h"

namespace usrc::rc {

Engine::Engine(std::unique_ptr<net::Nic> nic, uint32_t slot, uint16_t base_port, Clock clock,
               MemoryAccess *mem, EngineHooks *hooks)
    : nic_(std::move(nic)),
      lp_(nic_->local_peers() ? nic_->local_peers() : &no_local_peers_),
      slot_(slot), base_port_(base_port), clock_(std::move(clock)),
      mem_(mem), hooks_(hooks), qps_(kQpsPerSlot, nullptr), tx_slots_(new TxSlot[kTxBatch]),
      tx_iov_(new iovec[kTxBatch * kIovPerPkt]), tun_(Tunables::get()),
      icrc_optional_(nic_->udp_checksummed() && !tun_.icrc_local) {
  guard::install();
  faults_seen_ = guard::faults();
  ack_list_.reserve(64);
  qpn_walk_ = random_u32();
  qpn_stride_ = random_u32() | 1;
  hold_max = std::min(tun_.rx_hold, kMaxHold);
}

Engine::~Engine() {
  for (Qp *qp : live_) delete qp;
  live_.clear();
}

Qp *Engine::create_qp(uint32_t max_send_wr, uint32_t max_recv_wr, QpStorage *st) {
  for (uint32_t n = 0; n < kQpsPerSlot; n++) {
    const uint32_t i = (qpn_walk_ += qpn_stride_) & (kQpsPerSlot - 1);
    if (qps_[i]) continue;
    // (Out of memory: std::bad_alloc, with nothing changed.)
    auto qp = std::make_unique<Qp>();
    qp->qpn = (slot_ << kQpnIndexBits) | i;
    qp->sq_cap = max_send_wr ? max_send_wr : 1;
    if (st) {
      qp->sq.adopt(st->sq);
      qp->own_rq.adopt(st->rq);
    } else {
      qp->sq.init(qp->sq_cap + kPlacedSlack);
      qp->own_rq.init(max_recv_wr ? max_recv_wr : 1);
    }
    live_.reserve(live_.size() + 1);
    qps_[i] = qp.get();
    live_.push_back(qp.get());
    share_window();
    return qp.release();
  }
  return nullptr;
}

// A destroyed QP's arrays that came from a source, moved to *out.
static void take_storage(Qp &qp, QpStorage *out) {
  if (!out) return;
  if (qp.sq.slots.custom()) out->sq = std::move(qp.sq.slots);
  if (qp.own_rq.slots.custom()) out->rq = std::move(qp.own_rq.slots);
}

void Engine::destroy_qp(Qp *qp, QpStorage *give_back) {
  tx_flush();   // held ACKs
  update_gate(*qp, false);   // nothing is placed into a destroyed QP
  drop_held(*qp);
  qp->rq = &qp->own_rq;   // (an SRQ may go once the QP has: a lingering QP takes no receives)
  qp->resp.has_cur = false;
  xrc_abort(*qp);
  qp->resp.in_msg = false;
  bool responded = qp->resp.comm_est && (qp->state == QpState::rtr || qp->state == QpState::rts ||
                                    qp->state == QpState::sqd);
  if (!responded) {
    take_storage(*qp, give_back);
    return reap(qp);
  }
  if (give_back && (qp->sq.slots.custom() || qp->own_rq.slots.custom())) {
    // The application's memory goes back now: a lingering QP posts and
    // takes no WQE, one empty heap slot of each will do.
    Buffer<SendWqe> s;
    Buffer<RecvWqe> r;
    try {
      s = Buffer<SendWqe>(1);
      r = Buffer<RecvWqe>(1);
    } catch (const std::bad_alloc &) {
      take_storage(*qp, give_back);
      return reap(qp);   // (no linger, rather than a failed destroy)
    }
    qp->sq.adopt(s);
    qp->own_rq.adopt(r);
    if (s.custom()) give_back->sq = std::move(s);
    if (r.custom()) give_back->rq = std::move(r);
  }
  // Linger for about one of the peer's retry periods after the last packet
  // (we assume its Local ACK Timeout is like ours), capped at one second.
  uint64_t t = local_ack_timeout_ns(qp->attr.timeout);
  t = std::min<uint64_t>(t ? t + t / 2 : 100'000'000, 1'000'000'000);
  qp->linger_until = clock_() + t;
  qp->sq.clear();
  qp->local.placed = 0;
  qp->req.tx_pos = 0;
  qp->req.next_psn = qp->req.tx_psn = qp->req.tx_high = qp->comp.una_psn;
  qp->comp.ack_deadline = qp->comp.rnr_deadline = 0;
  qp->send_cq = qp->recv_cq = nullptr;
  qp->user = nullptr;
  lingering_++;
  arm_timer(qp->linger_until);
}

void Engine::reap(Qp *qp) {
  tx_flush();   // nothing queued may outlive the QP
  if (qp->linger_until) lingering_--;
  drop_held(*qp);
  std::erase(ack_list_, qp);
  std::erase(live_, qp);
  qps_[qp->qpn & (kQpsPerSlot - 1)] = nullptr;
  delete qp;
  share_window();
}

// The peers' socket buffers, which max_window is sized from, take the
// packets of every QP of the context: each QP's window is max_window shared
// among them, but never below kSharedWindow (many QPs then rely on the
// congestion window). A QP whose window was full keeps it full.
void Engine::share_window() {
  const uint32_t w = std::max<uint32_t>(max_window / std::max<size_t>(live_.size(), 1),
                                        std::min(kSharedWindow, max_window));
  for (Qp *qp : live_) {
    ReqState &r = qp->req;
    if (r.cwnd >= r.window) r.cwnd = w;
    if (r.ssthresh >= r.window) r.ssthresh = w;
    r.window = w;
    r.cwnd = std::min(r.cwnd, w);
    r.ssthresh = std::min(r.ssthresh, w);
  }
}

Qp *Engine::find_qp(uint32_t qpn) {
  if (slot_of_qpn(qpn) != slot_) return nullptr;
  return qps_[qpn & (kQpsPerSlot - 1)];
}

void Engine::modify(Qp &qp, const QpChange &c) {
  qp.attr = c.attr;
  if (c.new_peer) {
    nic_->add_peer(qp.attr.peer);
    qp.local.same_host = nic_->same_host(qp.attr.peer);
    qp.peer_icrc_optional = qp.peer_takes_fill = false;
  }
  if (c.set_rq_psn) set_rq_psn(qp, c.rq_psn);
  if (c.set_sq_psn) set_sq_psn(qp, c.sq_psn);
  set_state(qp, c.state);
}

void Engine::set_sq_psn(Qp &qp, uint32_t psn) {
  psn &= kPsnMask;
  qp.req.next_psn = qp.req.tx_psn = qp.req.tx_high = qp.comp.una_psn = psn;
  qp.req.tx_pos = qp.sq.head;
}

void Engine::set_state(Qp &qp, QpState s) {
  // Small messages posted in RTS and left to be built with the next ones
  // (post_small) were posted as started: they leave before SQD, which
  // starts no new message.
  if (qp.state == QpState::rts && s == QpState::sqd) requester_tx(qp);
  tx_flush();   // nothing built under the old state or path stays queued
  QpState old = qp.state;
  qp.state = s;
  // Packets to a peer reached in place (LocalPath::in_place): a responder's ACKs
  // from RTR on (a receive-only QP, such as ib_send_bw's server, stays
  // there), the requester's small messages in RTS. (Looked up once: a ring
  // that closes since makes tx_begin() fail, and the packets go the usual
  // way.)
  if (s == QpState::rtr || s == QpState::rts)
    qp.local.in_place = qp.type == QpType::rc && qp.xrc == XrcRole::none && qp.local.same_host && !tun_.icrc_local && lp_->cheap_send(qp.attr.peer);
  switch (s) {
    case QpState::reset:
      xrc_abort(qp);
      for (Cq *cq : {qp.send_cq, qp.recv_cq})
        if (cq) cq->clean(qp.qpn);
      qp.sq.clear();
      qp.tm_wqes = 0;
      if (!qp.on_srq()) qp.rq->clear();
      qp.resp.has_cur = false;
      qp.local.placed = 0;
      qp.req.tx_pos = 0;
      qp.resp.msn = 0;
      qp.resp.told_lsn = RespState::kNotTold;
      qp.resp.in_msg = qp.resp.nak_sent = qp.resp.rnr_sent = qp.resp.ack_pending = qp.resp.comm_est =
          qp.local.small_run = false;
      qp.resp.tail_at_hold = ~0ull;
      qp.resp.again_at = 0;
      qp.comp.ack_deadline = qp.comp.rnr_deadline = qp.comp.rto_deadline = 0;
      qp.comp.srtt = qp.comp.rttvar = 0;
      qp.comp.rtt_on = false;
      qp.comp.rto_backoff = 0;
      qp.comp.probed = qp.comp.probe_armed = false;
      qp.req.cwnd = qp.req.ssthresh = qp.req.window;
      qp.req.cwnd_acc = 0;
      qp.req.sel = {};
      qp.req.ssn = 0;
      qp.req.limited = false;
      drop_held(qp);
      std::erase(ack_list_, &qp);
      break;
    case QpState::rts:
      if (old != QpState::rts) {
        qp.comp.retry_left = qp.attr.retry_cnt;
        qp.comp.rnr_left = qp.attr.rnr_retry;
      }
      requester_tx(qp);
      tx_flush();
      break;
    case QpState::err:
      if (old != QpState::err) {
        flush_queues(qp);
        if (qp.on_srq() && hooks_) hooks_->qp_event(qp, QpEvent::last_wqe);
      }
      drop_held(qp);
      break;
    case QpState::sqd:
      if (old != QpState::sqd) {
        qp.comp.sqd_drained = false;
        check_drained(qp);
      }
      break;
    default:
      break;
  }
  update_gate(qp);
}

// Peers on this host may place RDMA WRITEs into this QP's PD's memory while
// it responds (RTR, RTS, SQD), takes remote writes, and talks to one of them.
void Engine::update_gate(Qp &qp, bool live) {
  const bool open = live &&
                    (qp.state == QpState::rtr || qp.state == QpState::rts ||
                     qp.state == QpState::sqd) &&
                    (qp.attr.access & kAccessRemoteWrite) && qp.local.same_host && qp.pd;
  if (!open && !qp.local.gate_open) return;
  const bool listed = lp_->set_gate(
      qp.qpn, open ? net::Gate{reinterpret_cast<uint64_t>(qp.pd), qp.attr.dest_qpn, qp.attr.peer} : net::Gate{});
  if (open && !listed && !qp.local.gate_open) count(Counter::direct_unlisted);   // once per opening
  qp.local.gate_open = open;
}

// IBA 10.3.1: in the Error state every outstanding and every newly
// posted WR completes with "flushed".
void Engine::flush_queues(Qp &qp) {
  qp.comp.ack_deadline = qp.comp.rnr_deadline = 0;
  std::erase(ack_list_, &qp);
  qp.resp.ack_pending = false;
  uint64_t now = clock_();
  for (; !qp.sq.empty(); qp.sq.pop()) {
    SendWqe &w = qp.sq.front();
    if (w.placed) continue;   // completed when placed
    if (w.wr.flags & kTmInternal) {
      tm_wqe_done(qp, w, WcStatus::wr_flush_err);
      continue;
    }
    push(qp.send_cq, {w.wr.wr_id, WcStatus::wr_flush_err, wr_info(w.wr.opcode).wc_opcode, false, false, 0, 0, qp.qpn,
                      0, 0, now});
  }
  qp.req.tx_pos = qp.sq.head;
  qp.local.placed = 0;
  // The receive WQE a message took, and the QP's own queue (an SRQ's WQEs
  // stay for its other QPs).
  auto flush = [&](const RecvWqe &r) {
    push(qp.recv_cq, {r.wr.wr_id, WcStatus::wr_flush_err, WcOpcode::recv, false, false, 0, 0, qp.qpn, 0, 0, now});
  };
  if (qp.resp.has_cur) flush(qp.resp.cur);
  qp.resp.has_cur = false;
  xrc_abort(qp);
  if (!qp.on_srq())
    for (; !qp.rq->empty(); qp.rq->pop()) flush(qp.rq->front());
  qp.resp.in_msg = false;
}

void Engine::arm_timer(uint64_t deadline) {
  if (deadline < next_deadline_.load(std::memory_order_relaxed))
    next_deadline_.store(deadline, std::memory_order_relaxed);
}

int Engine::post_send(Qp &qp, const SendWr &wr) {
  if (qp.state == QpState::reset || qp.state == QpState::init || qp.state == QpState::rtr)
    return EINVAL;
  if (wr.num_sge > kMaxSge) return EINVAL;
  SendWr *slot = send_slot(qp);
  if (!slot) return ENOMEM;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; i++) len += wr.sge[i].length;
  if (len > kMaxMsgSize) return EINVAL;
  if ((wr.flags & kInline) && len > kMaxInline) return EINVAL;
  copy_wr(*slot, wr);
  post_slot(qp, len);
  return 0;
}

void Engine::post_slot(Qp &qp, uint64_t len) {
  SendWqe &w = qp.sq.back();
  const SendWr &wr = w.wr;
  // Built in place with what is still unsent, if that is all small
  // messages posted the same way.
  if (small_ready(qp, len) && small_wr(qp, wr, len)) return post_small(qp, w, static_cast<uint32_t>(len));
  // At most one clock read for the times this post takes (a round-trip
  // sample's start, the retransmission timer), and only if it takes one.
  Pass pass(*this, 0);
  qp.local.small_run = false;
  const bool placed = place(qp, wr, len);
  qp.local.polls_at_post = polls.load(std::memory_order_relaxed);
  start_wqe(qp, w, static_cast<uint32_t>(len),
            len <= qp.attr.pmtu || placed ? 1 : static_cast<uint32_t>((len + qp.attr.pmtu - 1) / qp.attr.pmtu),
            placed);
  if ((wr.flags & kInline) && !placed) {
    // Inline data is copied now: the caller may reuse its buffer at once.
    uint32_t off = 0;
    for (uint32_t i = 0; i < w.wr.num_sge; i++) {
      std::memcpy(w.inline_data + off, w.wr.sge[i].addr, w.wr.sge[i].length);
      off += w.wr.sge[i].length;
    }
    w.wr.num_sge = 1;
    w.wr.sge[0] = {w.inline_data, off};
  }
  qp.req.rd_posted += is_rd_atomic(wr.opcode);
  qp.sq.push();

  if (qp.state == QpState::err) {
    // Flushed at once (IBA 10.8.3.3); nothing goes on the wire.
    flush_queues(qp);
    return;
  }
  if (placed) {
    // Done: the data is in the peer's memory. The notice that follows
    // takes the PSN; the WQE stays until it is acknowledged.
    qp.local.placed++;
    count(Counter::direct_writes);
    completed_at_post.store(true, std::memory_order_relaxed);
    if (qp.sq_sig_all || (wr.flags & kSignaled))
      push(qp.send_cq, {wr.wr_id, WcStatus::success, WcOpcode::rdma_write, false, false,
                        w.length, 0, qp.qpn, 0, 0, stamp()});
  }
  qp.req.next_psn = psn_add(qp.req.next_psn, w.npkts);
  // Nothing in flight: send now (latency). Otherwise the ACKs on their way
  // back run the engine again (the application's poll or the progress
  // thread), which sends the batch: back-to-back posts leave in one
  // sendmmsg. Where sending is cheap, a batch of kTxEager goes at once.
  const bool in_flight = qp.comp.una_psn != qp.req.tx_high;
  if (!send_single(qp, w)) requester_tx(qp);
  if (!in_flight || (tx_nslots_ >= kTxEager && lp_->cheap_send(qp.attr.peer))) tx_flush();
  check_faults();
}

// An XRC target's request names the SRQ its message is for (the XRCETH):
// one of the target's XRC domain, whose receive WQEs, CQ and PD serve it.
// An SRQ this context does not have may be another process's in the same
// domain (one opened on the same file): the target keeps the transport
// and hands its SENDs to the SRQ's owner (xrc_forward), who says if there
// is no such SRQ. Any other request for such an SRQ, and one for an SRQ of
// another domain, is an invalid request (IBA 9.7.5.2.2: a NAK for the
// expected PSN; dropped otherwise).
bool Engine::xrc_target(Qp &qp, const PacketView &v) {
  const uint32_t n = v.p.h.xrc_srqn;
  if (qp.xrc_srqn != n || (!qp.on_srq() && !qp.xrc_remote)) {   // (not as the last)
    auto it = xrc_srqs_.find(n);
    if (it != xrc_srqs_.end() && it->second.xrcd != qp.xrcd) {
      if (v.psn() == qp.resp.epsn) respond_error(qp, RespErr::inv_req, v.psn());
      else count(Counter::unknown_qp_drops);
      return false;
    }
    qp.xrc_srqn = n;
    qp.xrc_remote = it == xrc_srqs_.end();
    if (qp.xrc_remote) {
      qp.rq = &qp.own_rq;   // (empty: a target has no receive queue)
      qp.recv_cq = nullptr;
      qp.pd = nullptr;
    } else {
      qp.rq = it->second.q;
      qp.recv_cq = it->second.cq;
      qp.pd = it->second.pd;
    }
  }
  if (!qp.xrc_remote || (v.p.info->mask & wire::IS_SEND)) return true;
  // (A WRITE, READ or ATOMIC would need the owner's memory keys.)
  if (v.psn() == qp.resp.epsn) respond_error(qp, RespErr::inv_req, v.psn());
  else count(Counter::unknown_qp_drops);
  return false;
}

// A SEND packet for another context's SRQ, in sequence and of the right
// length (the steps before check_resource): handed to the owner, then
// acknowledged here. The owner places it when it has a WQE (it queues
// the packets until then), so no RNR NAK for want of one; EAGAIN (its
// socket full) is one. A SEND with Invalidate is an invalid request, as
// for a local XRC SRQ (no window is bound to a target).
Engine::RespStep Engine::xrc_forward(Qp &qp, Request &r) {
  const wire::Headers &h = r.v.p.h;
  r.err = RespErr::inv_req;
  if (r.mask & wire::HAS_IETH) return RespStep::error;
  XrcForward f;
  f.srqn = qp.xrc_srqn;
  f.qpn = qp.qpn;
  f.src_qp = qp.attr.dest_qpn;
  f.slid = qp.attr.dlid;
  f.first = r.first;
  f.last = r.last;
  f.imm = r.mask & wire::HAS_IMMDT;
  f.imm_be = h.imm_be;
  f.solicited = h.bth.se;
  f.data = r.v.p.payload;
  f.len = r.len;
  const int e = hooks_ ? hooks_->xrc_forward(qp.xrcd, f) : ENOENT;
  if (e) {
    if (e == EAGAIN) r.err = RespErr::rnr;
    return RespStep::error;
  }
  count(Counter::xrc_forwarded);
  qp.resp.in_msg = !r.last;
  qp.resp.in_send = true;
  return RespStep::acknowledge;
}

// A target leaves a forwarded message unfinished (it flushes, resets or
// goes): the owner completes its WQE flushed.
void Engine::xrc_abort(Qp &qp) {
  if (!qp.xrc_remote || !qp.resp.in_msg || !hooks_) return;
  XrcForward f;
  f.srqn = qp.xrc_srqn;
  f.qpn = qp.qpn;
  f.src_qp = qp.attr.dest_qpn;
  f.slid = qp.attr.dlid;
  f.abort = true;
  (void)hooks_->xrc_forward(qp.xrcd, f);
}

bool Engine::xrc_deliver(const XrcSrq &s, XrcInbound &in, const XrcForward &f) {
  RecvQueue &q = *s.q;
  const auto complete = [&](WcStatus st, uint32_t len) {
    push(s.cq, {in.cur.wr.wr_id, st, WcOpcode::recv, f.imm && st == WcStatus::success, f.solicited, len,
                f.imm_be, f.qpn, f.src_qp, f.slid, stamp()});
    in.active = false;
  };
  if (f.abort) {
    if (in.active) complete(WcStatus::wr_flush_err, 0);
    in.discard = false;
    return true;
  }
  if (f.first) {
    if (in.active) complete(WcStatus::wr_flush_err, 0);   // (one the target abandoned)
    if (q.empty()) return false;
    copy_wr(in.cur.wr, q.front().wr);
    in.cur.length = q.front().length;
    in.cur.bad = q.front().bad;
    q.pop(1);
    if (q.limit && q.size() < q.limit) srq_limit(q);
    in.active = true;
    in.discard = false;
    in.off = 0;
  } else if (!in.active) {
    // The rest of a message that failed, or of none: dropped.
    if (!in.discard) count(Counter::xrc_drops);
    in.discard = !f.last;
    return true;
  }
  if (uint64_t(in.off) + f.len > in.cur.length) {
    complete(WcStatus::loc_len_err, 0);
    in.discard = !f.last;
  } else if (in.cur.bad || !scatter(in.cur.wr.sge, in.cur.wr.num_sge, in.off, f.data, f.len)) {
    complete(WcStatus::loc_prot_err, 0);
    in.discard = !f.last;
  } else {
    in.off += f.len;
    if (f.last) complete(WcStatus::success, in.off);
  }
  check_faults();
  return true;
}

// The SRQ goes (its CQ may follow): a target that last served it forgets
// it, and the message it was receiving into it.
void Engine::remove_xrc_srq(uint32_t srqn) {
  auto it = xrc_srqs_.find(srqn);
  if (it == xrc_srqs_.end()) return;
  for (Qp *qp : qps_) {
    if (!qp || qp->xrc != XrcRole::tgt || qp->rq != it->second.q) continue;
    qp->rq = &qp->own_rq;
    qp->recv_cq = nullptr;
    qp->pd = nullptr;
    qp->resp.has_cur = false;
  }
  xrc_srqs_.erase(it);
}

// What every WQE posted starts with (post_slot, post_local).
void Engine::start_wqe(Qp &qp, SendWqe &w, uint32_t len, uint32_t npkts, bool placed) {
  w.length = len;
  w.npkts = npkts;
  w.placed = placed;
  w.small = w.bad = false;
  w.rd_before = qp.req.rd_posted;
  w.rd_piece = 0;
  w.first_psn = qp.req.next_psn;
  if (npkts) w.ssn = qp.req.ssn = msn_add(qp.req.ssn, 1);
}

void Engine::post_local(Qp &qp) {
  SendWqe &w = qp.sq.back();
  start_wqe(qp, w, 0, 0, false);
  qp.local.small_run = false;
  // The requester steps over it (Engine::sent); with nothing before it
  // unsent, it is behind already.
  if (qp.req.tx_pos == qp.sq.tail) qp.req.tx_pos++;
  qp.sq.push();
  if (qp.state == QpState::err) return flush_queues(qp);
  // Nothing before it outstanding: done now (else with the last of those,
  // ack_through and complete_head).
  if (qp.sq.tail - qp.sq.head == 1) {
    complete_head(qp);
    completed_at_post.store(true, std::memory_order_relaxed);
  }
}

// Direct placement (net::LocalPeers::place): an RDMA WRITE to a peer on this host
// that has exposed the memory and opened its gate to this QP is written
// into that memory now, and completes at once. Only when every WQE before
// it on this QP was placed too (so nothing sent earlier can land after it)
// and within the slack of placed WQEs not yet acknowledged; and only for
// an application that waits for its WRITEs (it polled since its last post
// here): a stream of WRITEs goes faster through the ring, where the copy
// out runs on the receiver's core while the sender copies the next one in.
bool Engine::place(Qp &qp, const SendWr &wr, uint64_t len) {
  if (wr.opcode != WrOpcode::rdma_write || qp.type != QpType::rc || qp.xrc != XrcRole::none ||
      len > tun_.direct_write || !qp.local.same_host ||
      qp.state != QpState::rts || qp.attr.rate_bps || qp.local.placed >= kPlacedSlack ||
      qp.sq.tail - qp.sq.head != qp.local.placed || qp.req.tx_psn != qp.req.next_psn ||
      qp.local.polls_at_post == polls.load(std::memory_order_relaxed))
    return false;
  iovec iov[kMaxSge];
  for (uint32_t i = 0; i < wr.num_sge; i++) iov[i] = {wr.sge[i].addr, wr.sge[i].length};
  return lp_->place(qp.attr.peer, qp.attr.dest_qpn, qp.qpn, wr.rkey, wr.remote_va, iov, wr.num_sge, len);
}

void Engine::invalidate_lkey(uint32_t key) {
  const auto uses = [&](const auto &wr) {
    for (uint32_t i = 0; i < wr.num_sge; i++)
      if (wr.sge[i].lkey == key && wr.sge[i].length) return true;
    return false;
  };
  const auto walk_rq = [&](RecvQueue &q) {
    for (uint64_t p = q.head; p != q.tail; p++) q.at(p).bad |= uses(q.at(p).wr);
  };
  for (Qp *qp : live_) {
    if (!qp->on_srq()) walk_rq(qp->own_rq);
    if (qp->resp.has_cur) qp->resp.cur.bad |= uses(qp->resp.cur.wr);
    for (uint64_t p = qp->sq.head; p != qp->sq.tail; p++) {
      SendWqe &w = qp->sq.at(p);
      if (is_rd_atomic(w.wr.opcode)) w.bad |= uses(w.wr);
    }
  }
  for (RecvQueue *q : srqs_) {
    walk_rq(*q);
    if (q->tm)
      for (TagList::Entry &t : q->tm->e) t.wqe.bad |= t.posted && uses(t.wqe.wr);
    for (auto &[qpn, in] : q->inbound) in.cur.bad |= in.active && uses(in.cur.wr);
  }
}

void Engine::srq_limit(RecvQueue &q) {
  q.limit = 0;
  if (hooks_) hooks_->srq_event(q);
}

void Engine::resize(RecvQueue &q, Buffer<RecvWqe> &slots) {
  RecvQueue r;
  r.adopt(slots);
  for (; !q.empty(); q.pop(), r.push()) r.back() = q.front();
  r.user = q.user;
  r.tm = q.tm;
  r.limit = q.limit;
  r.inbound = std::move(q.inbound);
  slots = std::move(q.slots);
  q = std::move(r);
}

void Engine::post_error(Qp &qp, uint64_t wr_id, WcOpcode op, WcStatus st, bool recv) {
  push(recv ? qp.recv_cq : qp.send_cq, {wr_id, st, op, false, false, 0, 0, qp.qpn, 0, 0, clock_()});
  set_state(qp, QpState::err);
}

int Engine::post_recv(Qp &qp, const RecvWr &wr) {
  if (qp.state == QpState::reset) return EINVAL;
  if (wr.num_sge > kMaxSge) return EINVAL;
  RecvWr *slot = recv_slot(qp);
  if (!slot) return ENOMEM;
  copy_wr(*slot, wr);
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; i++) len += wr.sge[i].length;
  post_recv_slot(qp, len);
  return 0;
}

// Whether a received packet starts or continues a message that it does
// not end (the rest of it is still to come).
static bool mid_message(const net::RxPacket &p) {
  if (p.len < wire::kBthLen) return false;
  const wire::OpcodeInfo *o = wire::opcode_info(wire::bth::opcode(p.data));
  return o && !(o->mask & wire::IS_LAST);
}

size_t Engine::progress(Poller who, uint64_t now, DirectWc *to) {
  Pass pass(*this, now ? now : clock_());
  struct Direct {   // the poller's array, for this pass only
    Engine &e;
    DirectWc *to;
    ~Direct() {
      if (to) to->n = e.direct.n;
      e.direct = {};
    }
  } scope{*this, to};
  if (to) direct = *to;
  if (completed_at_post.load(std::memory_order_relaxed))
    completed_at_post.store(false, std::memory_order_relaxed);
  const auto &t = tun_;
  net::RxPacket *pkts = rx_pkts_.data();
  size_t batch = std::min<size_t>(t.rx_batch ? t.rx_batch : 32, rx_pkts_.size());
  // Bounded work per call: at most four batches, one for the
  // application's poll. It calls in again as soon as it has taken the
  // completions, and the ACKs of what it received leave now rather than
  // after three more batches: a stream's sender gets its window back
  // sooner and works while the receiver does (a batch of 32 64-byte
  // SENDs is about 2 us of work here).
  size_t received = 0;
  wire_received_ = 0;
  for (int round = 0, rounds = who == Poller::app ? 1 : 4;; round++) {
    size_t n = nic_->recv({pkts, batch});
    for (size_t i = 0; i < n;) {
      if (const size_t k = fast_sends(pkts + i, n - i)) {   // (the common case)
        i += k;
        continue;
      }
      // A packet another core wrote (a shared-memory ring) is a cache miss:
      // the ones after it are fetched while this one is handled.
      if (i + kRxAhead < n) {
        const net::RxPacket &a = pkts[i + kRxAhead];
        __builtin_prefetch(a.data);
        __builtin_prefetch(a.data + a.len - 1);
      }
      handle_packet(pkts[i++]);
    }
    if (n) nic_->rx_done();
    received += n;
    for (size_t i = 0; i < n; i++) wire_received_ += !pkts[i].trusted;
    // An application's pass does not stop inside a message whose rest it
    // has already taken from the kernel: the NIC's fd does not show that
    // rest, and an application that goes on to spin on its memory (a
    // passive target, whose WRITE came as one coalesced receive) would
    // leave it there until the sender's timer resent it. (A stream of
    // single-packet messages still gets one batch per poll: its ACKs and
    // next requests leave sooner.)
    if (n && who == Poller::app && nic_->rx_held() && mid_message(pkts[n - 1])) continue;
    if (round + 1 >= rounds || (n < batch && !nic_->rx_pending())) break;
  }
  now = pass_time_;   // timers: the pass start is recent enough
  if (now >= next_deadline_.load(std::memory_order_relaxed)) {
    next_deadline_.store(UINT64_MAX, std::memory_order_relaxed);
    for (size_t i = 0; i < live_.size();) {
      Qp *qp = live_[i];
      if (qp->linger_until && now >= qp->linger_until) {
        reap(qp);
        continue;
      }
      if (qp->linger_until) arm_timer(qp->linger_until);
      check_timers(*qp, now);
      i++;
    }
  }
  // (From where the last pass found a peer with no room: QPs to a receiver
  // that takes less than they send get their turns in rotation, none
  // starved by those before it in the list.)
  const size_t nlive = live_.size(), start = tx_next_ < nlive ? tx_next_ : 0;
  bool blocked = false;
  for (size_t k = 0; k < nlive; k++) {
    const size_t i = start + k < nlive ? start + k : start + k - nlive;
    Qp *qp = live_[i];
    if (qp->req.tx_psn == qp->req.next_psn) continue;
    if (lp_->tx_blocked(qp->attr.peer)) {
      if (!blocked) tx_next_ = i;
      blocked = true;
      continue;
    }
    requester_tx(*qp);
  }
  if (!blocked) tx_next_ = 0;
  // Only ACKs to send (no response, resend or request): hold them, not yet
  // built, for the application's reply (its next post_send), if their QPs
  // answer what they receive (see replies()); its later passes keep them
  // for kAckHoldNs at most.
  if (who != Poller::thread && tx_nslots_ == 0 && !ack_list_.empty()) {
    if (!acks_held_ && replies()) {
      acks_held_ = true;
      acks_held_at_ = now;
      return received;
    }
    if (acks_held_ && now - acks_held_at_ < kAckHoldNs) return received;
  }
  tx_flush();
  check_faults();
  return received;
}

// A completion was lost to a full CQ (IBA 11.4.2.1, CQ overrun; rxe does
// the same): the CQ reported IBV_EVENT_CQ_ERR (Cq::overflow), and every QP
// completing into it goes to the error state, with IBV_EVENT_QP_FATAL, so
// that no further work completes as if nothing was lost.
void Engine::cq_overflowed() {
  cq_overflow_ = false;
  for (Qp *qp : live_) {
    if (qp->linger_until || qp->state == QpState::reset || qp->state == QpState::err) continue;
    if ((qp->send_cq && qp->send_cq->overflowed()) || (qp->recv_cq && qp->recv_cq->overflowed())) {
      set_state(*qp, QpState::err);
      if (hooks_) hooks_->qp_event(*qp, QpEvent::fatal);
    }
  }
}

// A guarded copy faulted since the last look (guard.h): a request's
// payload read from memory no longer mapped did not go (the engine's
// copies and the NIC's drop the packet). Each QP whose oldest WQE reads
// such memory completes it with a local protection error (IBA 10.8.3.1,
// the QP to the error state). A WQE behind others fails once it is the
// oldest: until then its packets are resent, and fault again.
void Engine::source_faults() {
  if (cq_overflow_) cq_overflowed();
  faults_seen_ = guard::faults();
  for (Qp *qp : live_) {
    if (qp->linger_until || qp->sq.empty() || (qp->state != QpState::rts && qp->state != QpState::sqd))
      continue;
    const SendWqe &w = qp->sq.front();
    if (w.placed || is_rd_atomic(w.wr.opcode)) continue;   // (no payload of its own)
    for (uint32_t i = 0; i < w.wr.num_sge; i++)
      if (!guard::readable(w.wr.sge[i].addr, w.wr.sge[i].length)) {
        fail_head(*qp, WcStatus::loc_prot_err);
        break;
      }
  }
}

// Whether every QP with an ACK to send posted a send WR since the last
// time this was asked: an application that answers each message (a
// ping-pong) then posts its reply at once, and the ACK leaves with it. One
// that only receives (the far end of a stream) gets no reply to wait for:
// its ACKs go now, or the sender's window stalls on them.
bool Engine::replies() {
  bool all = true;
  for (Qp *qp : ack_list_) {
    all &= qp->sq.tail != qp->resp.tail_at_hold;
    qp->resp.tail_at_hold = qp->sq.tail;
  }
  return all;
}

// One ACK per QP per transmit, however many requests asked for one, built
// behind the requests in the batch: a smaller packet may end a GSO run, so
// a reply and the ACK it carries leave as one send whatever their sizes.
void Engine::build_acks() {
  for (Qp *qp : ack_list_) {
    if (qp->resp.ack_pending) send_ack(*qp, ack_syndrome(*qp), psn_add(qp->resp.epsn, kPsnMask));
    qp->resp.ack_pending = false;
  }
  ack_list_.clear();
}

// A datagram that arrived at the RoCE v2 port for another process's slot
// (the group's steering was stale, net/roce_port.h): to that process's own
// port, from ours at the RoCE port, behind the sender's endpoint. Slot 0
// (QP1: CM MADs from another host, which the steering leaves to the
// kernel's hash) goes to port base, the GSI owner's (cm/host.cpp).
void Engine::roce_forward(const net::RxPacket &pkt, uint32_t slot) {
  net::ForwardHdr h{net::ForwardHdr::kMagic, pkt.src.ip, pkt.src.port, pkt.dst_port};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t *>(pkt.data), pkt.len}};
  const net::TxPacket t{{nic_->local().ip, uint16_t(base_port_ + slot)}, iov, 2, 0, 0, roce_port, 0, 1};
  if (base_port_ + slot <= 65535 && nic_->send({&t, 1}) == 1) count(Counter::roce_forwarded);
  else count(Counter::unknown_qp_drops);
}

void Engine::handle_packet(const net::RxPacket &in) {
  net::RxPacket unwrapped;
  const net::RxPacket *pp = &in;
  if (roce_port && in.src.port == roce_port && in.src.ip == nic_->local().ip) {
    // Handed on by another context of this address (roce_forward). (Only
    // the RoCE port's group sends from it, and the kernel lets only its
    // user join.)
    net::ForwardHdr h;
    if (!net::ForwardHdr::read(in.data, in.len, h)) {
      count(Counter::malformed_drops);
      return;
    }
    unwrapped = {{h.src_ip, h.src_port}, in.data + sizeof h, in.len - sizeof h, false, h.dst_port};
    pp = &unwrapped;
  } else if (in.dst_port && in.len >= wire::kBthLen) {
    if (const uint32_t s = slot_of_qpn(wire::bth::qpn(in.data)); s != slot_) return roce_forward(in, s);
  }
  // Fill behind the packet (tx_commit), from a peer whose datagrams our
  // kernel has checksummed: left out. (Through a NIC that checks no
  // checksum the bits are reserved ones, and a packet that relies on them
  // fails its ICRC.)
  if (icrc_optional_ && pp->len >= wire::kBthLen && wire::bth::icrc_optional(pp->data)) {
    if (const uint32_t fill = wire::bth::fill(pp->data)) {
      if (pp->len < wire::kBthLen + fill) {
        count(Counter::malformed_drops);
        return;
      }
      if (pp != &unwrapped) unwrapped = *pp;
      unwrapped.len -= fill;
      pp = &unwrapped;
    }
  }
  const net::RxPacket &pkt = *pp;
  if (fast_ack(pkt)) return;
  count(Counter::rx_packets);
  count(Counter::rx_bytes, pkt.len);
  PacketView &v = rx_view_;   // (parse writes all of it)
  v.src = pkt.src;
  if (wire::parse(pkt.data, pkt.len, v.p) != wire::ParseError::ok) {
    count(Counter::malformed_drops);
    return;
  }
  // A sender on this host leaves the ICRC out (0, see tx_commit), and so
  // does a peer whose datagrams carry a UDP checksum, which our kernel has
  // verified, if it says so (it then has ours: tx_commit). Any other ICRC is
  // verified.
  const bool checksummed = icrc_optional_ && wire::bth::icrc_optional(pkt.data);
  const bool no_icrc = v.p.icrc == 0 && (pkt.trusted || checksummed || nic_->same_host(pkt.src));
  if (tun_.icrc_check && !no_icrc) {
    iovec iov{const_cast<uint8_t *>(pkt.data), pkt.len - wire::kIcrcLen};
    const wire::Ipv4Pseudo ip{pkt.src.ip, nic_->local().ip, pkt.src.port,
                              pkt.dst_port ? pkt.dst_port : nic_->local().port};
    // Sent with IP ID 0 (one usrc datagram), or another that the ICRC
    // tells (a GSO segment's index, rxe's counter): wire::solve_ip_id.
    const uint32_t icrc0 = wire::icrc_ipv4(ip, &iov, 1);
    uint16_t id;
    if (icrc0 != v.p.icrc && !wire::solve_ip_id(icrc0, v.p.icrc, pkt.len, &id)) {
      count(Counter::malformed_drops);
      return;
    }
  }
  // RC, UC, UD and XRC opcodes only (IBA 9.2.1: transport 000b, 001b, 011b,
  // 101b), and our placed-WRITE notice from this host's shared memory.
  const uint32_t mask = v.p.info->mask;
  if (!(mask & (wire::IS_RC | wire::IS_UC | wire::IS_UD | wire::IS_XRC)) &&
      !(v.opcode() == uint8_t(wire::Opcode::USRC_WRITE_PLACED) && pkt.trusted)) {
    count(Counter::malformed_drops);
    return;
  }
  Qp *qp = find_qp(v.p.h.bth.dest_qp);
  // (A packet of another service than the QP's is for no QP here.)
  const QpType service = (mask & wire::IS_UD) ? QpType::ud : (mask & wire::IS_UC) ? QpType::uc : QpType::rc;
  // (XRC: requests for targets, responses for initiators; RC's for neither.)
  const XrcRole role = !(mask & wire::IS_XRC) ? XrcRole::none : (mask & wire::IS_REQUEST) ? XrcRole::tgt : XrcRole::ini;
  if (!qp || service != qp->type || role != qp->xrc) {
    count(Counter::unknown_qp_drops);
    return;
  }
  if (qp->type == QpType::ud) {
    // From anyone (the Q_Key says who may send), in RTR and later.
    if (!receives(qp->state) || qp->linger_until)
      count(Counter::unknown_qp_drops);
    else
      datagram_rx(*qp, v, pkt.len);
    return;
  }
  if (!from_peer(*qp, pkt.src)) {
    count(Counter::wrong_source_drops);
    return;
  }
  qp->peer_icrc_optional |= checksummed;
  qp->peer_takes_fill |= checksummed && (pkt.data[4] & wire::bth::kTakesFill);
  if (qp->linger_until) {
    // A destroyed QP only acknowledges duplicates, for a while longer.
    if ((v.p.info->mask & wire::IS_REQUEST) && psn_lt(v.psn(), qp->resp.epsn)) {
      responder_rx(*qp, v);
      qp->linger_until = std::max(qp->linger_until, clock_() + 100'000'000);
    }
    return;
  }
  if (v.p.info->mask & wire::IS_REQUEST) {
    if (!receives(qp->state)) {
      count(Counter::unknown_qp_drops);
      return;
    }
    if (qp->type == QpType::uc) return uc_rx(*qp, v);
    responder_rx(*qp, v);
    if (qp->resp.held) drain_held(*qp);
  } else {
    if (qp->state != QpState::rts && qp->state != QpState::sqd) {
      count(Counter::unknown_qp_drops);
      return;
    }
    completer_rx(*qp, v);
  }
}

Engine::TxSlot &Engine::tx_slot() {
  if (tx_nslots_ == kTxBatch) send_batch();
  TxSlot &s = tx_slots_[tx_nslots_];
  s.iov = &tx_iov_[tx_niov_];
  return s;
}

// Finishes the packet being built in tx_slot(): iov[0] = headers,
// iov[1..pieces] = payload, then pad and ICRC (RoCEv2: IBA A16.4.1). With
// no pieces, payload_len bytes of payload are behind the headers already.
void Engine::tx_commit(const Qp &qp, size_t hdr_len, size_t payload_len, size_t pieces) {
  TxSlot &s = tx_slots_[tx_nslots_];
  const uint8_t pad = wire::pad_for(payload_len);
  if (!pieces) {
    hdr_len += payload_len;   // (the caller copied it behind the headers)
    payload_len = 0;
  } else if (payload_len <= kTxCopy) {
    // A small payload goes behind the headers (see kTxCopy). From a
    // buffer unmapped: not sent (see source_faults).
    uint8_t *p = s.hdr + hdr_len;
    for (size_t i = 1; i <= pieces; i++) {
      if (!guard::copy(p, s.iov[i].iov_base, s.iov[i].iov_len)) return;
      p += s.iov[i].iov_len;
    }
    hdr_len += payload_len;
    payload_len = 0;
    pieces = 0;
  }
  uint32_t len = static_cast<uint32_t>(hdr_len + payload_len + pad + wire::kIcrcLen);
  // To a peer on this host the ICRC is 0, not computed: the datagram never
  // leaves memory, where the kernel computes no UDP checksum either. This
  // is a third of the CPU a byte costs on loopback. Nor to a peer that
  // takes the UDP checksum for it (handle_packet), which saves a fifth of a
  // receiver's CPU and a tenth of a sender's at 4 KB packets across a veth.
  const bool icrc = tun_.icrc_local || !(qp.local.same_host || qp.peer_icrc_optional);
  // Segmentation offload: the packet joins the one before when that one
  // takes the same path (destination, TOS, TTL, source port), is of the same
  // size (the last of a group may be shorter), and the group still fits one
  // UDP datagram's 64 KB. A packet a little shorter than the segments of
  // the group before, to a peer that takes fill (Qp::peer_takes_fill, which
  // it says only beside taking the UDP checksum for the ICRC: no ICRC here
  // either), is filled up to their size
  // (wire::bth::fill), in that group or as the first of the next: a
  // message's middle packets follow its first (which carries a RETH or
  // AETH) in one send, and the next message's follow them, as many
  // segments a send as the kernel's own UDP blast has.
  net::TxPacket *g = tx_count_ ? &tx_pkts_[tx_count_ - 1] : nullptr;
  const bool same_path = g && g->dst == qp.attr.peer && g->tos == qp.attr.tos && g->ttl == qp.attr.ttl &&
                         g->src_port == qp.attr.sport;
  const uint32_t fill =
      same_path && grp_max_ > 1 && qp.peer_takes_fill && !qp.local.same_host && len < grp_size_ &&
              grp_size_ - len <= wire::bth::kMaxFill
          ? grp_size_ - len
          : 0;
  const bool join = same_path && grp_open_ && len <= grp_size_ && g->segs < grp_max_ &&
                    grp_bytes_ + len + fill <= kMaxGsoBytes;
  // Its index in the group is the IP ID the kernel gives it, which the
  // ICRC covers (the receiver finds it from the ICRC: wire::solve_ip_id).
  const uint16_t seg = join ? g->segs : 0;
  // The ICRC covers the UDP source port (not the TOS or TTL, which it masks).
  const auto pseudo = [&] {
    wire::Ipv4Pseudo ip{nic_->local().ip, qp.attr.peer.ip, qp.attr.sport ? qp.attr.sport : nic_->local().port,
                        qp.attr.peer.port};
    ip.ip_id = seg;
    return ip;
  };
  size_t n;
  if (pieces == 0) {
    // One buffer: headers [+ payload], pad, ICRC.
    for (uint8_t i = 0; i < pad; i++) s.hdr[hdr_len + i] = 0;
    s.iov[0] = {s.hdr, hdr_len + pad};
    wire::store_icrc(s.hdr + hdr_len + pad, icrc ? wire::icrc_ipv4(pseudo(), s.iov, 1) : 0);
    s.iov[0].iov_len += wire::kIcrcLen;
    n = 1;
  } else {
    // iov[0] headers, iov[1..pieces] the payload in place, then pad + ICRC.
    s.iov[0] = {s.hdr, hdr_len};
    n = 1 + pieces;
    std::memset(s.trailer, 0, 4);
    if (pad) s.iov[n++] = {s.trailer, pad};
    // (The payload is the application's memory: unmapped, not sent.)
    uint32_t crc = 0;
    if (icrc && !guard::run([&] { crc = wire::icrc_ipv4(pseudo(), s.iov, n); })) return;
    if (pad) {
      wire::store_icrc(s.trailer + pad, crc);
      s.iov[n - 1].iov_len = pad + wire::kIcrcLen;
    } else {
      wire::store_icrc(s.trailer, crc);
      s.iov[n++] = {s.trailer, wire::kIcrcLen};
    }
  }
  if (icrc_optional_) s.hdr[4] |= wire::bth::kIcrcOptional | wire::bth::kTakesFill;   // (the ICRC masks it)
  if (fill) {
    static constexpr uint8_t kZeros[wire::bth::kMaxFill] = {};
    s.iov[n++] = {const_cast<uint8_t *>(kZeros), fill};
    s.hdr[4] |= uint8_t(fill / 4);
    len += fill;
  }
  if (join) {
    g->iovcnt += n;
    g->gso_size = static_cast<uint16_t>(grp_size_);
    g->segs++;
    grp_bytes_ += len;
    grp_open_ = len == grp_size_;
  } else {
    tx_pkts_[tx_count_++] = {qp.attr.peer, s.iov, n, qp.attr.tos, qp.attr.ttl, qp.attr.sport, 0, 1};
    grp_max_ = nic_->gso_segments();   // (asked per group: a backend may lower it when a send fails)
    grp_size_ = grp_bytes_ = len;
    grp_open_ = true;
  }
  tx_nslots_++;
  tx_niov_ += n;
  count(Counter::tx_packets);
  count(Counter::tx_bytes, len);
}

void Engine::tx_flush() {
  acks_held_ = false;
  build_acks();
  send_batch();
}

void Engine::send_batch() {
  if (!tx_count_) return;
  size_t sent = nic_->send({tx_pkts_.data(), tx_count_});
  if (sent < tx_nslots_) count(Counter::tx_errors, tx_nslots_ - sent);
  tx_count_ = tx_nslots_ = tx_niov_ = 0;
  grp_open_ = false;
  // Packets the NIC holds for a receiver that has no room yet: a pass soon
  // hands them on (and sends what waits behind them).
  if (lp_->tx_pending()) arm_timer(stamp() + kTxRetryNs);
}

}  // namespace usrc::rc
