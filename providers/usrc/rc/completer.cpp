// Completer: consumes ACKs and NAKs, retires send WQEs, runs the Local ACK
// Timeout and RNR timers, and decides retries (IBA 9.7.5.1, 9.7.6).
#include "usrc/rc/engine.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"

namespace usrc::rc {

static WcOpcode wc_opcode(const SendWqe &w) {
  return (w.wr.opcode == WrOpcode::send || w.wr.opcode == WrOpcode::send_imm)
             ? WcOpcode::send : WcOpcode::rdma_write;
}

// Every PSN up to and including psn is acknowledged (ACKs are cumulative,
// IBA 9.7.5.1.1). Returns true if that was progress.
bool Engine::ack_through(Qp &qp, uint32_t psn) {
  uint32_t new_una = psn_add(psn, 1);
  if (psn_diff(new_una, qp.una_psn) <= 0) return false;
  qp.una_psn = new_una;
  uint64_t now = clock_();
  while (!qp.sq.empty()) {
    SendWqe &w = qp.sq.at(qp.sq.head);
    if (psn_lt(psn, psn_add(w.first_psn, w.npkts - 1))) break;
    if (qp.sq_sig_all || (w.wr.flags & kSignaled))
      push(qp.send_cq, {w.wr.wr_id, WcStatus::success, wc_opcode(w), false, false, w.length,
                        0, qp.qpn, 0, 0, now});
    qp.sq.head++;
  }
  if (psn_lt(qp.tx_psn, qp.una_psn)) go_back_n(qp, qp.una_psn);
  // Forward progress restores the retry budgets.
  qp.retry_left = qp.retry_cnt;
  qp.rnr_left = qp.rnr_retry;
  qp.ack_deadline = 0;
  if (qp.una_psn != qp.tx_high) {
    if (uint64_t t = local_ack_timeout_ns(qp.timeout)) {
      qp.ack_deadline = now + t;
      arm_timer(qp.ack_deadline);
    }
  }
  if (qp.state == QpState::sqd && qp.sq.empty() && hooks_) hooks_->qp_event(qp, QpEvent::sq_drained);
  return true;
}

// The WQE at the head failed: complete it with st, then the QP goes to the
// Error state and everything behind it is flushed (IBA 10.8.3).
void Engine::fail_head(Qp &qp, WcStatus st) {
  if (!qp.sq.empty()) {
    SendWqe &w = qp.sq.at(qp.sq.head);
    push(qp.send_cq, {w.wr.wr_id, st, wc_opcode(w), false, false, 0, 0, qp.qpn, 0, 0, clock_()});
    qp.sq.head++;
  }
  // Reported by the completion, not as an async event (IBA 10.8.3.1).
  set_state(qp, QpState::err);
}

void Engine::completer_rx(Qp &qp, const PacketView &v) {
  if (v.opcode() != static_cast<uint8_t>(wire::Opcode::RC_ACKNOWLEDGE)) {
    count(Counter::malformed_drops);   // READ/ATOMIC responses: not requested yet
    return;
  }
  uint32_t psn = v.psn();
  // An ACK/NAK must name a PSN we sent: in [una - 1, tx_high - 1].
  if (psn_diff(psn, qp.tx_high) >= 0 || psn_diff(psn, psn_add(qp.una_psn, kPsnMask)) < 0) {
    count(Counter::ghost_acks);
    return;
  }
  uint8_t syn = v.p.h.aeth.syndrome;
  // A NAK names the PSN the responder expects; one older than una is stale.
  if (wire::aeth_type(syn) != wire::AckType::ack && psn_lt(psn, qp.una_psn)) {
    count(Counter::ghost_acks);
    return;
  }
  switch (wire::aeth_type(syn)) {
    case wire::AckType::ack:
      count(Counter::acks_rcvd);
      ack_through(qp, psn);
      break;
    case wire::AckType::rnr_nak: {
      // C9-...: the responder had no receive WQE for psn; wait the timer it
      // asked for, then resend from psn. rnr_retry 7 means forever.
      count(Counter::rnr_naks_rcvd);
      ack_through(qp, psn_add(psn, kPsnMask));
      if (qp.rnr_retry != 7) {
        if (qp.rnr_left == 0) {
          count(Counter::rnr_retry_exceeded);
          fail_head(qp, WcStatus::rnr_retry_exc_err);
          return;
        }
        qp.rnr_left--;
      }
      go_back_n(qp, psn);
      qp.ack_deadline = 0;
      qp.rnr_deadline = clock_() + rnr_timer_ns(wire::aeth_value(syn));
      arm_timer(qp.rnr_deadline);
      break;
    }
    case wire::AckType::nak: {
      uint8_t code = wire::aeth_value(syn);
      if (code == wire::NAK_PSN_SEQ) {
        count(Counter::seq_naks_rcvd);
        bool progress = ack_through(qp, psn_add(psn, kPsnMask));
        if (!progress) {
          if (qp.retry_left == 0) {
            count(Counter::retry_exceeded);
            fail_head(qp, WcStatus::retry_exc_err);
            return;
          }
          qp.retry_left--;
        }
        go_back_n(qp, psn);
        requester_tx(qp);
        return;
      }
      count(Counter::other_naks_rcvd);
      ack_through(qp, psn_add(psn, kPsnMask));
      fail_head(qp, code == wire::NAK_REMOTE_ACCESS ? WcStatus::rem_access_err
                    : code == wire::NAK_REMOTE_OP   ? WcStatus::rem_op_err
                                                    : WcStatus::rem_inv_req_err);
      return;
    }
    default:
      count(Counter::malformed_drops);
      return;
  }
  requester_tx(qp);
}

void Engine::check_timers(Qp &qp, uint64_t now) {
  if (qp.rnr_deadline) {
    if (now >= qp.rnr_deadline) {
      qp.rnr_deadline = 0;
      requester_tx(qp);
    } else {
      arm_timer(qp.rnr_deadline);
    }
  }
  if (!qp.ack_deadline) return;
  if (now < qp.ack_deadline) {
    arm_timer(qp.ack_deadline);
    return;
  }
  // Local ACK Timeout (IBA 9.7.6.1.3): resend everything unacknowledged;
  // after retry_cnt retries the WQE fails with "retry exceeded".
  qp.ack_deadline = 0;
  count(Counter::timeouts);
  if (qp.retry_left == 0) {
    count(Counter::retry_exceeded);
    fail_head(qp, WcStatus::retry_exc_err);
    return;
  }
  qp.retry_left--;
  go_back_n(qp, qp.una_psn);
  requester_tx(qp);
}

}  // namespace usrc::rc
