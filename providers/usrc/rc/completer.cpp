// Completer: consumes ACKs and NAKs, retires send WQEs, runs the Local ACK
// Timeout and RNR timers, and decides retries (IBA 9.7.5.1, 9.7.6).
#include <cstring>

#include "usrc/common/guard.h"
#include "usrc/rc/engine.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"

namespace usrc::rc {

static WcOpcode wc_opcode(const SendWqe &w) { return wr_info(w.wr.opcode).wc_opcode; }

// The WQE w at the head of the send queue has completed successfully:
// its completion, if it asked for one (the caller pops it).
[[gnu::always_inline]] inline void Engine::completed(Qp &qp, const SendWqe &w) {
  if (w.placed) {   // completed when placed
    qp.local.placed--;
    return;
  }
  if (w.wr.flags & kTmInternal) [[unlikely]] return tm_wqe_done(qp, w, WcStatus::success);
  if (qp.sq_sig_all || (w.wr.flags & kSignaled))
    push(qp.send_cq, {w.wr.wr_id, WcStatus::success, wc_opcode(w), false, false,
                      w.wr.opcode == WrOpcode::rdma_read ? w.length
                      : is_rd_atomic(w.wr.opcode)        ? 8u
                                                         : w.length,
                      0, qp.qpn, 0, 0, stamp()});
}

void Engine::complete_head(Qp &qp) {
  completed(qp, qp.sq.front());
  qp.sq.pop();
  // Local operations behind it (no packets) are done with it.
  while (!qp.sq.empty() && !qp.sq.front().npkts) {
    completed(qp, qp.sq.front());
    qp.sq.pop();
  }
}

// una moved forward: restore the retry budgets (forward progress) and
// re-arm the Local ACK Timeout for what is still outstanding.
void Engine::advanced(Qp &qp) {
  if (psn_lt(qp.req.tx_psn, qp.comp.una_psn)) go_back_n(qp, qp.comp.una_psn);
  qp.comp.retry_left = qp.attr.retry_cnt;
  qp.comp.rnr_left = qp.attr.rnr_retry;
  qp.comp.ack_deadline = qp.comp.rto_deadline = 0;
  qp.comp.rto_backoff = 0;
  qp.comp.probed = false;
  if (qp.comp.una_psn != qp.req.tx_high) arm_retransmit(qp);
  check_drained(qp);
}

// Arms the Local ACK Timeout and, sooner, the adaptive retransmission timer.
void Engine::arm_retransmit(Qp &qp) {
  qp.comp.rto_deadline = 0;
  if (qp.type == QpType::uc) return;   // (nothing of UC is acknowledged: nothing waits)
  const uint64_t t = local_ack_timeout_ns(qp.attr.timeout);
  if (!t) return;   // timeout 0: wait for ever (IBA 9.7.6.1.3)
  const uint64_t now = stamp();
  qp.comp.ack_deadline = now + t;
  arm_timer(qp.comp.ack_deadline);
  if (!qp.comp.srtt) return;
  uint64_t rto = qp.comp.rto_ns();
  const uint64_t pto = std::max(2 * qp.comp.srtt, kMinProbeNs);
  qp.comp.probe_armed = !qp.req.sel.back_wait && pto < rto && probe_ok(qp);
  if (qp.comp.probe_armed || qp.req.sel.back_wait) rto = std::min(rto, pto);
  if (rto < t) {
    qp.comp.rto_deadline = now + rto;
    arm_timer(qp.comp.rto_deadline);
  }
}

// Drained: every WQE started before SQD has completed and none is half
// sent; WQEs not yet started wait for the return to RTS.
void Engine::check_drained(Qp &qp) {
  if (qp.state != QpState::sqd || qp.comp.sqd_drained || qp.sq.head != qp.req.tx_pos) return;
  // (A WQE sent before is started, even while a loss resends it from its
  // first packet.)
  if (qp.req.tx_pos != qp.sq.tail && psn_lt(qp.sq.at(qp.req.tx_pos).first_psn, qp.req.tx_high)) return;
  qp.comp.sqd_drained = true;
  if (qp.attr.sqd_notify && hooks_) hooks_->qp_event(qp, QpEvent::sq_drained);
}

// A response gap (IBA 9.7.5.1.3, "implied NAK"): a READ response or ATOMIC
// ACK is missing, so resend from una: the rest of the READ and everything
// after it. Once per una, however many later packets show the gap.
void Engine::implied_nak(Qp &qp) {
  if (qp.comp.implied_nak_psn == qp.comp.una_psn) return;
  qp.comp.implied_nak_psn = qp.comp.una_psn;
  count(Counter::implied_naks);
  window_loss(qp, false);
  go_back_n(qp, qp.comp.una_psn);
}

// The send window after a loss and as ACKs arrive (ReqState::cwnd).
void Engine::window_loss(Qp &qp, bool timeout) {
  qp.req.ssthresh = std::max(qp.req.cwnd / 2, std::min(kLossWindow, qp.req.window / 2));
  // Never raised by a loss: below the floor (after a timeout) it stays.
  qp.req.cwnd = timeout ? std::min(kMinWindow, qp.req.window) : std::min(qp.req.cwnd, qp.req.ssthresh);
  qp.req.cwnd_acc = 0;
}

void Engine::window_acked(Qp &qp, uint32_t npkts) {
  if (qp.req.cwnd >= qp.req.window) return;
  if (qp.req.cwnd < qp.req.ssthresh) {
    qp.req.cwnd = std::min(qp.req.cwnd + npkts, qp.req.ssthresh);
    return;
  }
  qp.req.cwnd_acc += npkts;
  while (qp.req.cwnd_acc >= qp.req.cwnd && qp.req.cwnd < qp.req.window) {
    qp.req.cwnd_acc -= qp.req.cwnd;
    qp.req.cwnd++;
  }
}

// Every PSN up to and including psn is acknowledged (ACKs are cumulative,
// IBA 9.7.5.1.1), except that a READ or ATOMIC completes only with its own
// response data. Returns true if that was progress.
bool Engine::ack_through(Qp &qp, uint32_t psn) {
  uint32_t new_una = psn_add(psn, 1);
  if (psn_diff(new_una, qp.comp.una_psn) <= 0) return false;
  bool gap = false;
  // The WQEs it covers, walked by pointer and popped together.
  const uint64_t queued = qp.sq.tail - qp.sq.head;
  const SendWqe *w = &qp.sq.front(), *const begin = qp.sq.begin_slots(), *const end = qp.sq.end_slots();
  uint32_t done = 0;
  for (; done < queued; done++) {
    if (is_rd_atomic(w->wr.opcode)) {
      if (psn_le(w->first_psn, psn)) {
        // Acknowledged beyond a READ/ATOMIC whose response we lack.
        gap = true;
        if (psn_lt(qp.comp.una_psn, w->first_psn)) new_una = w->first_psn;
        else new_una = qp.comp.una_psn;
      }
      break;
    }
    if (psn_lt(psn, psn_add(w->first_psn, w->npkts - 1))) break;
    completed(qp, *w);
    if (++w == end) w = begin;
  }
  qp.sq.pop(done);
  bool progress = psn_diff(new_una, qp.comp.una_psn) > 0;
  if (progress) {
    una_to(qp, new_una);
    advanced(qp);
  }
  if (gap) implied_nak(qp);
  return progress;
}

// una moves forward to new_una (an ACK, a READ response, an ATOMIC ACK):
// a round-trip sample, and the window grows by what was acknowledged.
void Engine::una_to(Qp &qp, uint32_t new_una) {
  rtt_sample(qp, new_una);
  window_acked(qp, static_cast<uint32_t>(psn_diff(new_una, qp.comp.una_psn)));
  qp.comp.una_psn = new_una;
  qp.req.sel.back_wait = false;   // (what it waited for; sel_acked may wait again)
  if (qp.req.sel.on) sel_acked(qp);
}

// una moves to new_una: a round-trip sample if the timed packet is
// answered, srtt and rttvar as TCP keeps them (RFC 6298). An ACK, a READ
// response and an ATOMIC ACK alike: a QP that only reads times its
// requests too, so that a lost last response is resent after the
// retransmission timer, not the Local ACK Timeout.
void Engine::rtt_sample(Qp &qp, uint32_t new_una) {
  if (!qp.comp.rtt_on || !psn_lt(qp.comp.rtt_psn, new_una)) return;
  qp.comp.rtt_on = false;
  // (Times read once per pass, by two threads: this pass may have started
  // before the one that sent. No sample then.)
  const uint64_t t = stamp();
  if (t <= qp.comp.rtt_sent) return;
  const uint64_t r = t - qp.comp.rtt_sent;
  if (!qp.comp.srtt) {
    qp.comp.srtt = r;
    qp.comp.rttvar = r / 2;
    return;
  }
  const uint64_t d = r > qp.comp.srtt ? r - qp.comp.srtt : qp.comp.srtt - r;
  qp.comp.rttvar = (3 * qp.comp.rttvar + d) / 4;
  qp.comp.srtt = (7 * qp.comp.srtt + r) / 8;
}

// RDMA READ response packets, in PSN order (IBA 9.7.5.1.4).
// A READ response or ATOMIC ACK beyond una acknowledges the requests
// before it (IBA 9.7.5.1.2: ACKs may be coalesced into later responses);
// the responder sends its ACK for them after the responses of the pass.
void Engine::implied_ack(Qp &qp, uint32_t psn) {
  if (psn_lt(qp.comp.una_psn, psn) && psn_lt(psn, qp.req.tx_high)) ack_through(qp, psn_add(psn, kPsnMask));
}

void Engine::read_response(Qp &qp, const PacketView &v) {
  uint32_t psn = v.psn();
  implied_ack(qp, psn);
  if (psn != qp.comp.una_psn) {
    if (psn_lt(qp.comp.una_psn, psn)) implied_nak(qp);   // earlier responses lost
    else count(Counter::duplicates);                // already have it
    return;
  }
  if (qp.sq.empty()) return;
  SendWqe &w = qp.sq.front();
  uint32_t k = static_cast<uint32_t>(psn_diff(psn, w.first_psn));
  if (w.wr.opcode != WrOpcode::rdma_read || k >= w.npkts) {
    count(Counter::ghost_acks);
    return;
  }
  uint32_t off = k * qp.attr.pmtu;
  uint32_t want = std::min(qp.attr.pmtu, w.length - std::min(off, w.length));
  uint32_t mask = v.p.info->mask;
  bool first = k == 0, last = k + 1 == w.npkts;
  // A READ asked for in pieces (or resumed after a gap) is answered
  // FIRST..LAST per piece, so FIRST and LAST may come at any point; the
  // WQE's last packet is always a LAST.
  (void)first;
  if (v.p.payload_len != want || (last && !(mask & wire::IS_LAST))) {
    count(Counter::malformed_drops);
    return;
  }
  // Into the WQE's local buffers at off (one of them unmapped: a local
  // protection error, IBA 10.8.3.1).
  if (w.bad || !scatter(w.wr.sge, w.wr.num_sge, off, v.p.payload, want)) return fail_head(qp, WcStatus::loc_prot_err);
  una_to(qp, psn_add(psn, 1));
  if (last) complete_head(qp);
  advanced(qp);
  requester_tx(qp);
}

// ATOMIC ACKNOWLEDGE: the original value of the remote word (IBA 9.4.5).
void Engine::atomic_ack(Qp &qp, const PacketView &v) {
  uint32_t psn = v.psn();
  implied_ack(qp, psn);
  if (psn != qp.comp.una_psn) {
    if (psn_lt(qp.comp.una_psn, psn)) implied_nak(qp);
    else count(Counter::duplicates);
    return;
  }
  if (qp.sq.empty()) return;
  SendWqe &w = qp.sq.front();
  if (w.first_psn != psn || !(wr_info(w.wr.opcode).mask & WR_ATOMIC)) {
    count(Counter::ghost_acks);
    return;
  }
  uint64_t orig = v.p.h.atomic_ack;
  if (w.bad || !guard::copy(w.wr.sge[0].addr, &orig, sizeof orig))   // host order, as rxe does
    return fail_head(qp, WcStatus::loc_prot_err);
  una_to(qp, psn_add(psn, 1));
  complete_head(qp);
  advanced(qp);
  requester_tx(qp);
}

// The WQE at the head failed: complete it with st, then the QP goes to the
// Error state and everything behind it is flushed (IBA 10.8.3).
void Engine::fail_head(Qp &qp, WcStatus st) {
  if (!qp.sq.empty() && qp.sq.front().placed) {
    // The failure is a placed WRITE's notice (its peer went away before
    // acknowledging it): that WRITE completed when its data landed, so
    // no completion carries the error. The QP fails (the rest flushed)
    // and says so with an async event.
    set_state(qp, QpState::err);
    if (hooks_) hooks_->qp_event(qp, QpEvent::fatal);
    return;
  }
  if (!qp.sq.empty()) {
    SendWqe &w = qp.sq.front();
    if (w.wr.flags & kTmInternal) tm_wqe_done(qp, w, st);
    else push(qp.send_cq, {w.wr.wr_id, st, wc_opcode(w), false, false, 0, 0, qp.qpn, 0, 0, stamp()});
    qp.sq.pop();
  }
  // Reported by the completion, not as an async event (IBA 10.8.3.1).
  set_state(qp, QpState::err);
}

// A response must name a PSN we sent: in [una - 1, tx_high - 1].
static bool names_sent_psn(const Qp &qp, uint32_t psn) {
  return psn_diff(psn, qp.req.tx_high) < 0 && psn_diff(psn, psn_add(qp.comp.una_psn, kPsnMask)) >= 0;
}

// One retry of the budget a Local ACK Timeout or a sequence NAK without
// progress uses (retry_cnt, IBA 9.7.6.1.3); false, the head WQE failed
// with "retry exceeded", when none is left.
bool Engine::use_retry(Qp &qp) {
  if (qp.comp.retry_left == 0) {
    count(Counter::retry_exceeded);
    fail_head(qp, WcStatus::retry_exc_err);
    return false;
  }
  qp.comp.retry_left--;
  return true;
}

// An ACK (IBA 9.7.5.1.1): everything through psn is acknowledged; the
// window it opens is used at once.
[[gnu::always_inline]] inline void Engine::ack_rcvd(Qp &qp, uint32_t psn, uint8_t syndrome, uint32_t msn) {
  count(Counter::acks_rcvd);
  take_credits(qp, syndrome, msn);
  ack_through(qp, psn);
  if (qp.comp.rnr_deadline) [[unlikely]] rnr_credits(qp);
  requester_tx(qp);
}

// During an RNR NAK's wait: an ACK whose credits grew since the NAK (or
// came first since it, to a QP that had none) and now take the message it
// named (the responder posted receives and said so, Engine::post_recv_slot)
// ends the wait; the message goes now, not when
// the timer the NAK asked for runs out (a receiver on a busy host that
// reposts late would otherwise cost its sender that timer each time).
void Engine::rnr_credits(Qp &qp) {
  if (!qp.req.limited || (qp.comp.rnr_limited && !psn_lt(qp.comp.rnr_lsn, qp.req.lsn)) || qp.sq.empty() ||
      !qp.req.within_credits(qp.sq.front().ssn))
    return;
  qp.comp.rnr_deadline = 0;
  rnr_resume(qp);
}

// End-to-end flow control (IBA 9.7.7.2): an ACK's MSN plus its credit
// count is the last message that may take a receive WQE (ReqState::lsn);
// it only grows (an ACK that arrives late gives an older one), and a
// duplicate ACK may bring more. kNoCredits: the responder limits nothing.
void Engine::take_credits(Qp &qp, uint8_t syndrome, uint32_t msn) {
  const uint8_t code = wire::aeth_value(syndrome);
  if (code == wire::kNoCredits) {
    qp.req.limited = false;
    return;
  }
  const uint32_t lsn = msn_add(msn, wire::credit_count(code));
  if (!qp.req.limited || psn_lt(qp.req.lsn, lsn)) qp.req.lsn = lsn;
  qp.req.limited = true;
}

// Whether w, not sent yet, waits for credits: it takes a receive WQE and
// lies beyond the limit, and packets are in flight (whose ACKs bring
// credits). With none in flight it goes, as IBA lets a requester without
// credits send one message: the responder takes it or sends an RNR NAK.
bool Engine::credit_wait(const Qp &qp, const SendWqe &w) const {
  return (wr_info(w.wr.opcode).mask & WR_CONSUMES_RWQE) && !qp.req.within_credits(w.ssn) &&
         !psn_lt(w.first_psn, qp.req.tx_high) && qp.comp.una_psn != qp.req.tx_high;
}

// An RNR NAK (IBA 9.7.5.2.8): the responder had no receive WQE for psn;
// wait the timer it asked for (its code), then resend from psn
// (rnr_resume). rnr_retry 7 means forever.
void Engine::rnr_nak_rcvd(Qp &qp, uint32_t psn, uint8_t timer) {
  count(Counter::rnr_naks_rcvd);
  // The NAK says why psn was not taken: a packet resent alone before it,
  // now acknowledged alone, is no news of a loss after it (sel_acked would
  // go back N at once, and rnr_resume then resend the whole window).
  qp.req.sel.on = false;
  ack_through(qp, psn_add(psn, kPsnMask));
  if (qp.attr.rnr_retry != 7) {
    if (qp.comp.rnr_left == 0) {
      count(Counter::rnr_retry_exceeded);
      fail_head(qp, WcStatus::rnr_retry_exc_err);
      return;
    }
    qp.comp.rnr_left--;
  }
  // The window outran the receives the application keeps posted (a
  // receiver on a busy host falls behind): it shrinks as for a loss.
  window_loss(qp, false);
  qp.comp.ack_deadline = 0;
  qp.comp.rnr_deadline = clock_() + rnr_timer_ns(timer);
  qp.comp.rnr_lsn = qp.req.lsn;
  qp.comp.rnr_limited = qp.req.limited;
  arm_timer(qp.comp.rnr_deadline);   // (requester_tx sends nothing until then)
}

// The RNR timer ran out: the packet the RNR NAK named is resent, alone
// where it can be (resend_one), as after a sequence NAK: a responder that
// kept the packets that followed it (ours does, as beyond a gap)
// acknowledges them all once a receive is posted; one that dropped them
// acknowledges that one alone, and the rest goes back N (sel_acked).
// Resending them all anyway was most of what a busy receiver's sender
// resent (ib_send_bw 64 B beside a CPU-bound process: 2.8% of its packets,
// each one a duplicate at the responder).
void Engine::rnr_resume(Qp &qp) { resend_from(qp, qp.comp.una_psn); }

// psn goes again, alone or with the run PSNs after it, where it can
// (resend_one: it is una, and the peer keeps what follows a gap); else everything from una (which may lag psn:
// READ data still missing) goes back N.
void Engine::resend_from(Qp &qp, uint32_t psn, uint32_t run) {
  if (qp.comp.una_psn != psn || !resend_one(qp, psn, false, run)) go_back_n(qp, qp.comp.una_psn);
  requester_tx(qp);
}

// A PSN sequence NAK (the responder's class B error): everything
// before psn is acknowledged, psn is resent (alone, or with the rest of
// the hole the NAK says it knows of, where the peer keeps what follows a
// gap, resend_one; else everything from it).
void Engine::seq_nak_rcvd(Qp &qp, uint32_t psn, uint32_t hole) {
  count(Counter::seq_naks_rcvd);
  window_loss(qp, false);
  const bool progress = ack_through(qp, psn_add(psn, kPsnMask));
  // The NAK for the packet after one resent alone, from a peer that
  // dropped what followed it, when its ACK already had us go back N from
  // there (sel_acked): nothing to do again.
  if (!progress && psn == qp.req.sel.back_psn) return;
  if (!progress && !use_retry(qp)) return;
  resend_from(qp, psn, hole);
}

// Any other NAK (IBA 9.7.5.2.4, the NAK codes; the responder's class C
// errors): what came before psn is acknowledged, the WQE holding psn fails
// with the status the code gives, and the QP with it.
void Engine::error_nak_rcvd(Qp &qp, uint32_t psn, uint8_t code) {
  count(Counter::other_naks_rcvd);
  ack_through(qp, psn_add(psn, kPsnMask));
  fail_head(qp, code == wire::NAK_REMOTE_ACCESS ? WcStatus::rem_access_err
                : code == wire::NAK_REMOTE_OP   ? WcStatus::rem_op_err
                                                : WcStatus::rem_inv_req_err);
}

// The common response on its own short path: a plain ACK (no payload, no
// ICRC) from the peer of a QP on this host, for a PSN it was sent, checked
// through the header accessors alone, then taken by ack_rcvd as
// completer_rx takes it. Anything else goes through parse() and
// completer_rx(), which check, drop and count what is wrong with it.
bool Engine::fast_ack(const net::RxPacket &pkt) {
  constexpr size_t kLen = wire::kAckHdrLen + wire::kIcrcLen;
  const uint8_t *b = pkt.data;
  if (pkt.len != kLen || wire::bth::opcode(b) != uint8_t(wire::Opcode::RC_ACKNOWLEDGE)) return false;
  const wire::HdrView v{b, &wire::info_of(wire::Opcode::RC_ACKNOWLEDGE)};
  if (wire::bth::pad_tver(b) != 0 || wire::icrc::get(b + kLen - wire::kIcrcLen) != 0 ||   // pad, TVer 0
      wire::aeth_type(v.syndrome()) != wire::AckType::ack)
    return false;
  Qp *qp = find_qp(v.qpn());
  if (!qp || qp->type != QpType::rc || !qp->local.same_host || !from_peer(*qp, pkt.src) || qp->linger_until ||
      (qp->state != QpState::rts && qp->state != QpState::sqd && qp->state != QpState::sqe))
    return false;
  const uint32_t psn = v.psn();
  if (!names_sent_psn(*qp, psn)) return false;   // (a ghost: counted there)
  count(Counter::rx_packets);
  count(Counter::rx_bytes, kLen);
  ack_rcvd(*qp, psn, v.syndrome(), v.msn());
  return true;
}

// A response (IBA 9.7.5.1): one that names no PSN we sent, or a NAK older
// than una (a NAK names the PSN the responder expects), is a ghost; READ
// response data and ATOMIC ACKs complete their WQEs; an ACK or NAK as its
// AETH's type says.
void Engine::completer_rx(Qp &qp, const PacketView &v) {
  const uint32_t psn = v.psn();
  if (!names_sent_psn(qp, psn)) return count(Counter::ghost_acks);
  if (v.p.info->mask & wire::IS_READ) return read_response(qp, v);
  if (v.p.info->mask & wire::HAS_ATOMICACKETH) return atomic_ack(qp, v);
  const uint8_t syn = v.p.h.aeth.syndrome;
  const wire::AckType type = wire::aeth_type(syn);
  if (type != wire::AckType::ack && psn_lt(psn, qp.comp.una_psn)) return count(Counter::ghost_acks);
  switch (type) {
    case wire::AckType::ack: return ack_rcvd(qp, psn, syn, v.p.h.aeth.msn);
    case wire::AckType::rnr_nak: return rnr_nak_rcvd(qp, psn, wire::aeth_value(syn));
    case wire::AckType::nak:
      if (wire::aeth_value(syn) == wire::NAK_PSN_SEQ)   // (the hole: only a usrc peer's, see bth::hole)
        return seq_nak_rcvd(qp, psn, qp.peer_icrc_optional ? wire::bth::hole(v.p.bth) : 0);
      return error_nak_rcvd(qp, psn, wire::aeth_value(syn));
    default: return count(Counter::malformed_drops);
  }
}

void Engine::check_timers(Qp &qp, uint64_t now) {
  if (qp.resp.again_at) ack_again(qp, now);
  if (qp.comp.rnr_deadline) {
    if (now >= qp.comp.rnr_deadline) {
      qp.comp.rnr_deadline = 0;
      rnr_resume(qp);
    } else {
      arm_timer(qp.comp.rnr_deadline);
    }
  }
  if (!qp.comp.ack_deadline) return;
  if (now < qp.comp.ack_deadline) {
    arm_timer(qp.comp.ack_deadline);
    if (!qp.comp.rto_deadline) return;
    if (now < qp.comp.rto_deadline) {
      arm_timer(qp.comp.rto_deadline);
      return;
    }
    qp.comp.rto_deadline = 0;
    if (lp_->tx_blocked(qp.attr.peer)) {
      // The receiver has not even taken what we sent (its ring is full,
      // the NIC holds the rest): slow, not lossy. Resending would only
      // queue copies behind the originals; the Local ACK Timeout still runs.
      const uint64_t rto = qp.comp.rto_ns();
      if (now + rto < qp.comp.ack_deadline) {
        qp.comp.rto_deadline = now + rto;
        arm_timer(qp.comp.rto_deadline);
      }
      return;
    }
    if (qp.req.sel.back_wait) {
      // A probe's packet was taken alone and nothing more came: the rest
      // was lost (sel_acked), and that is the loss's news.
      qp.req.sel.back_wait = false;
      window_loss(qp, false);
      sel_go_back(qp);
      requester_tx(qp);
    } else if (qp.comp.probe_armed) {
      // The probe: a short silence since the last progress (a lost NAK,
      // resend or ACK leaves the window full and the peer waiting). The
      // oldest packet alone: a peer that kept the ones after it (or has
      // it, and lost our ACK) acknowledges them all. The retransmission
      // timer runs from here.
      qp.comp.probe_armed = false;
      qp.comp.probed = true;
      if (resend_one(qp, qp.comp.una_psn, true)) count(Counter::probes);
    } else {
      // The retransmission timer; the Local ACK Timeout keeps running and
      // still decides retry_cnt. Silence this long is as often a peer
      // that is not running (descheduled on a busy host: milliseconds) as
      // a loss, and which one only its answer tells: the oldest packet is
      // resent alone, as the probe was, and the window kept. A peer that
      // kept what followed it acknowledges everything; one that lost more
      // acknowledges that packet alone and the rest goes back N
      // (sel_acked, which then shrinks the window; a peer that drops what
      // follows a gap answers so too). A READ (the rest of its piece) or an
      // ATOMIC goes alone too: a responder that has it answers the
      // duplicate from the request it saved. Where that packet cannot be
      // resent alone (a WRITE placed directly): go back N now,
      // the window shrunk as for a NAK, and to the minimum on a second
      // expiry without progress (an overflowing receiver whose losses no
      // later packet reveals).
      count(Counter::rto_resends);
      if (!resend_one(qp, qp.comp.una_psn, true)) {
        window_loss(qp, qp.comp.rto_backoff > 0);
        go_back_n(qp, qp.comp.una_psn);
        requester_tx(qp);
      }
      if (qp.comp.rto_backoff < 30) qp.comp.rto_backoff++;
    }
    const uint64_t rto = qp.comp.rto_ns();
    if (now + rto < qp.comp.ack_deadline) {
      qp.comp.rto_deadline = now + rto;
      arm_timer(qp.comp.rto_deadline);
    }
    return;
  }
  // Local ACK Timeout (IBA 9.7.6.1.3): resend everything unacknowledged;
  // after retry_cnt retries the WQE fails with "retry exceeded".
  qp.comp.ack_deadline = 0;
  count(Counter::timeouts);
  if (!use_retry(qp)) return;
  qp.comp.rto_deadline = 0;
  window_loss(qp, true);
  go_back_n(qp, qp.comp.una_psn);
  requester_tx(qp);
}

}  // namespace usrc::rc
