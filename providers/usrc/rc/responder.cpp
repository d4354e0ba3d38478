// Responder: checks each request against the expected PSN, executes it,
// and acknowledges (IBA 9.7.4.2, 9.7.5.2).
#include <cstring>

#include "usrc/common/copy.h"
#include "usrc/common/guard.h"
#include "usrc/rc/engine.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"

namespace usrc::rc {

using wire::Opcode;

void Engine::send_ack(Qp &qp, uint8_t syndrome, uint32_t psn, uint32_t hole) {
  if (!qp.local.in_place || !ack_in_place(qp, syndrome, psn)) send_ack_packet(qp, syndrome, psn, hole);
  switch (wire::aeth_type(syndrome)) {
    case wire::AckType::ack: count(Counter::acks_sent); break;
    case wire::AckType::rnr_nak: count(Counter::rnr_naks_sent); break;
    default:
      count(wire::aeth_value(syndrome) == wire::NAK_PSN_SEQ ? Counter::seq_naks_sent
                                                            : Counter::other_naks_sent);
  }
}

// The ACK (or NAK) of a QP whose peer's ring we build in (LocalPath::in_place),
// straight into a slot of it, after what is built already; false if there
// is no slot.
bool Engine::ack_in_place(Qp &qp, uint8_t syndrome, uint32_t psn) {
  size_t cap = 0;
  uint8_t *const p = ring_slot(qp, &cap);   // (behind what is built: READ responses before their ACK)
  if (!p) return false;
  const size_t hl = wire::put_ack(p, syndrome, qp.resp.msn, qp.attr.dest_qpn, psn);
  std::memset(p + hl, 0, wire::kIcrcLen);   // (a peer on this host)
  ring_slot_done(hl + wire::kIcrcLen, hl + wire::kIcrcLen, 1);
  return true;
}

// An ACK's syndrome: its credit count, the receive WQEs posted (IBA
// 9.7.7.2), so that the requester sends no SEND the responder has to
// refuse with an RNR NAK (and drop what follows it); none from an SRQ,
// whose WQEs other QPs take too.
uint8_t Engine::ack_syndrome(Qp &qp) {
  if (qp.on_srq()) return wire::aeth_ack();
  const uint8_t code = wire::credit_code(qp.rq->size());
  qp.resp.told_lsn = msn_add(qp.resp.msn, wire::credit_count(code));
  return wire::aeth_ack(code);
}

// The headers of a response to qp's peer: opcode op for psn, an AETH of
// syndrome and our MSN.
static wire::Headers response_headers(const Qp &qp, uint8_t op, uint32_t psn, uint8_t syndrome) {
  wire::Headers h;
  h.bth.opcode = op + (qp.xrc == XrcRole::tgt ? wire::kXrcOpcodeBase : 0);   // (an XRC target's: XRC ones)
  h.bth.pkey = 0xffff;
  h.bth.dest_qp = qp.attr.dest_qpn;
  h.bth.psn = psn;
  h.aeth = {syndrome, qp.resp.msn};
  return h;
}

void Engine::send_ack_packet(Qp &qp, uint8_t syndrome, uint32_t psn, uint32_t hole) {
  const wire::Headers h = response_headers(qp, uint8_t(Opcode::RC_ACKNOWLEDGE), psn, syndrome);
  TxSlot &s = tx_slot();
  size_t hl = wire::build_headers(h, 0, s.hdr);
  if (hole && qp.peer_icrc_optional) wire::bth::set_hole(s.hdr, hole);   // (a usrc peer: see bth::hole)
  tx_commit(qp, hl, 0, 0);
}

[[gnu::noinline]] bool scatter(const Sge *sge, uint32_t num_sge, uint32_t off, const uint8_t *src, uint32_t len) {
  return for_each_piece(sge, num_sge, off, len, [&](uint8_t *to, uint32_t n) {
    if (!guard::copy(to, src, n)) return false;
    src += n;
    return true;
  });
}

// A SEND's payload into the receive WQE r at offset off (the caller checked
// that it fits); false if its buffer is no longer mapped. One buffer, the
// common case: one copy.
[[gnu::always_inline]] static inline bool place_send(const RecvWqe &r, uint32_t off, const uint8_t *src,
                                                     uint32_t len) {
  if (r.bad) [[unlikely]] return false;
  if (r.wr.num_sge == 1) return guard::copy(r.wr.sge[0].addr + off, src, len);
  return scatter(r.wr.sge, r.wr.num_sge, off, src, len);
}

// What the responder answers a request it does not take (RespErr): the
// one place that NAKs.
void Engine::respond_error(Qp &qp, RespErr err, uint32_t psn) {
  switch (err) {
    case RespErr::psn_seq:
      // Class B (IBA 9.7.5.2.3): NAK once, naming the expected PSN, then
      // take nothing until it arrives. psn is the packet after the gap
      // (kept, hold), so the gap's length goes with it (wire::bth::hole).
      if (qp.resp.nak_sent) return;
      qp.resp.nak_sent = true;
      send_ack(qp, wire::aeth_nak(wire::NAK_PSN_SEQ), qp.resp.epsn,
               static_cast<uint32_t>(std::max(psn_diff(psn, qp.resp.epsn), 0)));
      return;
    case RespErr::rnr:
      // Receiver Not Ready (IBA 9.7.5.2.8): ask the requester to come back
      // after our RNR timer; the QP stays as it is.
      send_ack(qp, wire::aeth_rnr_nak(qp.attr.min_rnr_timer), psn);
      qp.resp.nak_sent = qp.resp.rnr_sent = true;
      return;
    case RespErr::inv_req:
    case RespErr::rem_access:
    case RespErr::rem_op: {
      // Class C (IBA 9.7.5.2.4, the NAK codes): NAKed, and the responder's
      // QP goes to the error state.
      const uint8_t code = err == RespErr::inv_req      ? wire::NAK_INVALID_REQUEST
                           : err == RespErr::rem_access ? wire::NAK_REMOTE_ACCESS
                                                        : wire::NAK_REMOTE_OP;
      send_ack(qp, wire::aeth_nak(code), psn);
      qp.resp.nak_sent = true;
      set_state(qp, QpState::err);
      if (err != RespErr::rem_op && hooks_)
        hooks_->qp_event(qp, err == RespErr::inv_req ? QpEvent::req_err : QpEvent::access_err);
      return;
    }
  }
}

// execute for a SEND packet: its payload into the receive WQE r (the head)
// at off (0 for a FIRST or ONLY), which it fits (check_resource); false if
// the buffer is no longer mapped.
[[gnu::always_inline]] inline bool Engine::execute_send(Qp &qp, const RecvWqe &r, uint32_t off, const uint8_t *src,
                                                        uint32_t len) {
  if (!place_send(r, off, src, len)) [[unlikely]] return false;
  qp.resp.recv_offset = off + len;
  return true;
}

// complete for a SEND packet: a message's last packet completes its
// receive WQE r (the caller pops it).
[[gnu::always_inline]] inline void Engine::complete_send(Qp &qp, RecvSink &k, const RecvWqe &r, bool last, bool imm,
                                                         uint32_t imm_be, bool solicited) {
  qp.resp.in_msg = !last;
  qp.resp.in_send = true;
  if (last) complete_recv(qp, k, r, WcStatus::success, WcOpcode::recv, qp.resp.recv_offset, imm, imm_be, solicited);
}

void Engine::first_request(Qp &qp) {
  qp.resp.comm_est = true;
  if (qp.state == QpState::rtr && hooks_) hooks_->qp_event(qp, QpEvent::comm_est);
}

// The common request on its own short path: SEND ONLYs (with or without
// immediate data) from the peer of a QP on this host, without an ICRC, in
// order, each into a posted receive that holds it; as many in a row as
// there are, for the QP of the first (checked once: a same-host sender's
// ring slot holds a run of them). Returns how many it took. It only
// admits: each packet it takes goes through the pipeline's own execute,
// complete and acknowledge (place_send, complete_recv, accept_request),
// with none of the checks those packets pass anyway. Every packet it does
// not take goes through parse() and responder_rx(), which check, NAK, drop
// and count what is wrong with it.
size_t Engine::fast_sends(const net::RxPacket *pkts, size_t n) {
  constexpr uint8_t kOnly = uint8_t(Opcode::RC_SEND_ONLY), kOnlyImm = uint8_t(Opcode::RC_SEND_ONLY_IMM);
  if (pkts[0].len < wire::kMinPacketLen ||
      (wire::bth::opcode(pkts[0].data) != kOnly && wire::bth::opcode(pkts[0].data) != kOnlyImm))
    return 0;
  const uint32_t qpn = wire::bth::qpn(pkts[0].data);
  Qp *qp = find_qp(qpn);
  // No ICRC is accepted only from this host: the QP's peer, on a local
  // path. In order (check_psn), between messages (check_op_seq), past its
  // first request (note_first_request).
  // (Not on a tag matching SRQ: its SENDs are looked at, tm_receive.)
  if (!qp || qp->type != QpType::rc || !qp->local.same_host || !from_peer(*qp, pkts[0].src) || qp->linger_until || !qp->resp.comm_est ||
      qp->state < QpState::rtr || qp->state > QpState::sqd || qp->resp.in_msg || qp->resp.held || qp->rq->tm)
    return 0;
  uint64_t bytes = 0;
  const uint32_t pmtu = qp->attr.pmtu;
  // (None posted: the general path sends the RNR NAK, check_resource.)
  const size_t most = std::min<uint64_t>(n, qp->rq->size());
  RecvSink sink = recv_sink(*qp);
  const net::Endpoint src = pkts[0].src;   // (from_peer: the run takes only this source)
  // The receives, walked by pointer and popped together.
  const RecvWqe *r = &qp->rq->front(), *const rq_begin = qp->rq->begin_slots(), *const rq_end = qp->rq->end_slots();
  size_t k = 0;
  for (; k < most; k++) {
    const net::RxPacket &pkt = pkts[k];
    if (k + kRxAhead < n) {   // (a packet another core wrote: fetched ahead)
      const net::RxPacket &a = pkts[k + kRxAhead];
      __builtin_prefetch(a.data);
      __builtin_prefetch(a.data + a.len - 1);
    }
    const uint8_t *b = pkt.data;
    if (pkt.len < wire::kMinPacketLen) break;
    const uint8_t op = wire::bth::opcode(b);
    const bool imm = op == kOnlyImm;
    if (op != kOnly && !imm) break;
    // The header fields, read before the payload copy (which stores
    // through a byte pointer, after which they would be read again).
    const uint32_t hl = imm ? wire::info_of(Opcode::RC_SEND_ONLY_IMM).hdr_len
                            : wire::info_of(Opcode::RC_SEND_ONLY).hdr_len;
    if (wire::bth::tver(b) != 0 || pkt.len < hl + wire::kIcrcLen) break;   // TVer 0
    if (wire::bth::fill(b)) break;   // (handle_packet takes it off)
    const uint32_t body = pkt.len - hl - wire::kIcrcLen, pad = wire::bth::pad(b);
    if ((body & 3) || pad > body || wire::icrc::get(b + pkt.len - wire::kIcrcLen) != 0) break;
    if (wire::bth::qpn(b) != qpn || pkt.src != src || wire::bth::psn(b) != qp->resp.epsn) break;
    const bool solicited = wire::bth::se(b), ack_req = wire::bth::ack_req(b);
    const uint32_t imm_be =
        imm ? wire::immdt::get_be(b + wire::info_of(Opcode::RC_SEND_ONLY_IMM).offset[wire::IMMDT]) : 0;
    const uint32_t len = body - pad;
    // check_length, check_resource's receive length; then execute
    // (a receive buffer unmapped: the general path fails it), complete
    // and acknowledge.
    if (len > pmtu || len > r->length || !execute_send(*qp, *r, 0, b + hl, len)) break;
    complete_send(*qp, sink, *r, true, imm, imm_be, solicited);
    accept_request(*qp, true, ack_req);
    bytes += pkt.len;
    if (++r == rq_end) r = rq_begin;
  }
  if (k) took_recv(*qp, static_cast<uint32_t>(k));
  recv_sink_done(sink);
  if (!k) return 0;
  count(Counter::rx_packets, k);
  count(Counter::rx_bytes, bytes);
  return k;
}

// A SEND or WRITE packet beyond epsn (the ones before it were lost),
// kept as a copy for drain_held(): unless it is kept already, is further
// ahead than hold_max or there is no room (then it is resent, as it would
// be without holding). The wire stays plain IBA: a requester that resends
// everything from the NAK's PSN on finds these taken as duplicates.
void Engine::hold(Qp &qp, const PacketView &v) {
  const uint32_t psn = v.psn();
  if (!hold_max) return;
  if (static_cast<uint32_t>(psn_diff(psn, qp.resp.epsn)) > hold_max || v.p.payload_len > kHoldBytes) {
    qp.resp.hold_missed = true;
    return;
  }
  if (held_.empty()) held_.resize(hold_max);   // (the first loss of the context)
  Held *room = nullptr;
  for (Held &h : held_) {
    if (h.qp == &qp && h.v.psn() == psn) {
      count(Counter::duplicates);
      return;
    }
    if (!h.qp && !room) room = &h;
  }
  if (!room) {
    qp.resp.hold_missed = true;
    return;
  }
  if (!room->data) room->data = std::make_unique_for_overwrite<uint8_t[]>(kHoldBytes);
  std::memcpy(room->data.get(), v.p.payload, v.p.payload_len);
  room->v = v;
  room->v.p.payload = room->data.get();
  room->qp = &qp;
  qp.resp.held++;
  count(Counter::held);
}

// After a packet was taken in order: the kept ones that follow it are
// taken in turn, as if they arrived now (the ones left behind, dropped).
// If that leaves a gap before more kept ones (or ones there was no room
// to keep), it is NAKed at once: the requester resent only what the last
// NAK named, and waits, its window full. (A gap right after the packet
// taken is not: its ACK alone tells the requester, which then resends
// from there, see Engine::sel_acked.)
void Engine::drain_held(Qp &qp) {
  bool took = false;
  for (bool again = true; again && qp.resp.held;) {
    again = false;
    for (Held &h : held_) {
      if (h.qp != &qp) continue;
      const int32_t d = psn_diff(h.v.psn(), qp.resp.epsn);
      if (d > 0) continue;
      h.qp = nullptr;   // (its copy stays valid: nothing is kept meanwhile)
      qp.resp.held--;
      if (d < 0) continue;
      if (qp.state == QpState::reset || qp.state == QpState::init || qp.state == QpState::err) {
        drop_held(qp);
        return;
      }
      responder_rx(qp, h.v);
      took = again = true;
    }
  }
  if (took && (qp.resp.held || qp.resp.hold_missed)) {
    // (Named by the first kept one after the gap: epsn if none is kept.)
    int32_t gap = 0;
    for (const Held &h : held_)
      if (h.qp == &qp && (!gap || psn_diff(h.v.psn(), qp.resp.epsn) < gap)) gap = psn_diff(h.v.psn(), qp.resp.epsn);
    respond_error(qp, RespErr::psn_seq, psn_add(qp.resp.epsn, static_cast<uint32_t>(gap)));
  }
  if (!qp.resp.held) qp.resp.hold_missed = false;
  if (took) ack_again_later(qp);
}

// The ACK after a drain covers packets a requester that goes back N has
// still to resend, and the ACK of a duplicate may cross more of a
// requester's resends. rxe (Linux 6.1) takes an ACK that reaches it before
// its resend of the packet as news of nothing and waits for that resend's
// own ACK; if the resend is lost, its timer sees every PSN acknowledged
// and never fires again: the QP hangs. So after either, while no new
// request arrives, the last ACK goes again 1, 4, 16 and 64 ms later
// (counter acks_again). Any other requester takes it as a duplicate ACK,
// and a new request ends it: its own ACK covers everything before it.
void Engine::ack_again_later(Qp &qp) {
  qp.resp.again_epsn = qp.resp.epsn;
  qp.resp.agains = 0;
  qp.resp.again_at = stamp() + kAckAgainNs;
  arm_timer(qp.resp.again_at);
}

void Engine::ack_again(Qp &qp, uint64_t now) {
  if (qp.resp.epsn != qp.resp.again_epsn || !receives(qp.state)) {
    qp.resp.again_at = 0;
    return;
  }
  if (now >= qp.resp.again_at) {
    send_ack(qp, ack_syndrome(qp), psn_add(qp.resp.epsn, kPsnMask));
    count(Counter::acks_again);
    qp.resp.again_at = ++qp.resp.agains < kAcksAgain ? now + (kAckAgainNs << (2 * qp.resp.agains)) : 0;
  }
  if (qp.resp.again_at) arm_timer(qp.resp.again_at);
}

void Engine::drop_held(Qp &qp) {
  for (Held &h : held_)
    if (h.qp == &qp) h.qp = nullptr;
  qp.resp.held = 0;
  qp.resp.hold_missed = false;
}

// One request through the responder's steps (RespStep), as rxe's
// rxe_responder(): each check or action returns the next one; every NAK
// goes through respond_error, every ACK through schedule_ack.
void Engine::responder_rx(Qp &qp, const PacketView &v) {
  if (qp.xrc == XrcRole::tgt && !xrc_target(qp, v)) return;
  const uint32_t mask = v.p.info->mask;
  Request r{v,
            v.psn(),
            mask,
            static_cast<uint32_t>(v.p.payload_len),
            (mask & wire::IS_FIRST) != 0,
            (mask & wire::IS_LAST) != 0,
            (mask & wire::IS_SEND) != 0,
            (mask & wire::IS_WRITE) != 0,
            v.opcode() == uint8_t(Opcode::USRC_WRITE_PLACED)};
  RespStep step = RespStep::check_psn;
  while (step != RespStep::done) {
    switch (step) {
      case RespStep::check_psn: step = check_psn(qp, r); break;
      case RespStep::duplicate: step = duplicate(qp, r); break;
      case RespStep::out_of_sequence: step = out_of_sequence(qp, r); break;
      case RespStep::check_op_seq: step = check_op_seq(qp, r); break;
      case RespStep::check_op_valid: step = check_op_valid(qp, r); break;
      case RespStep::check_length: step = check_length(qp, r); break;
      case RespStep::check_resource: step = check_resource(qp, r); break;
      case RespStep::check_rkey: step = check_rkey(qp, r); break;
      case RespStep::execute: step = execute(qp, r); break;
      case RespStep::complete: step = complete(qp, r); break;
      case RespStep::acknowledge: step = acknowledge(qp, r); break;
      case RespStep::error:
        respond_error(qp, r.err, r.psn);
        step = RespStep::done;
        break;
      case RespStep::done: break;
    }
  }
}

Engine::RespStep Engine::check_psn(Qp &qp, Request &r) {
  const int32_t d = psn_diff(r.psn, qp.resp.epsn);
  if (d < 0) return RespStep::duplicate;
  if (d > 0) return RespStep::out_of_sequence;
  return RespStep::check_op_seq;
}

// Duplicate (IBA 9.7.5.2.2): already executed; acknowledged again so that
// a requester whose ACK was lost makes progress. READ and ATOMIC are
// answered from the saved request.
Engine::RespStep Engine::duplicate(Qp &qp, Request &r) {
  count(Counter::duplicates);
  if (r.mask & wire::IS_READ) read_request(qp, r.v, true);
  else if (r.mask & wire::IS_ATOMIC) atomic_request(qp, r.v, true);
  else {
    schedule_ack(qp);
    ack_again_later(qp);
  }
  return RespStep::done;
}

// PSN sequence error (class B): SEND and WRITE packets are kept for when
// the expected PSN arrives (hold): the requester need resend only the
// lost ones.
Engine::RespStep Engine::out_of_sequence(Qp &qp, Request &r) {
  if ((r.is_send || r.is_write) && !r.placed) hold(qp, r.v);
  r.err = RespErr::psn_seq;
  return RespStep::error;
}

// Opcode sequence (IBA 9.7.4.2.2, class C): FIRST/ONLY start a message,
// MIDDLE/LAST continue one of the same kind; nothing else comes inside one.
Engine::RespStep Engine::check_op_seq(Qp &qp, Request &r) {
  const bool ok = (r.is_send || r.is_write) && !r.placed
                      ? r.first != qp.resp.in_msg && (!qp.resp.in_msg || qp.resp.in_send == r.is_send)
                      : !qp.resp.in_msg;
  r.err = RespErr::inv_req;
  return ok ? RespStep::check_op_valid : RespStep::error;
}

// What the QP can take at all (class C): READ and ATOMIC need responder
// resources (max_dest_rd_atomic 0: none), an ATOMIC an aligned word.
Engine::RespStep Engine::check_op_valid(Qp &qp, Request &r) {
  if (r.is_write && is_atomic_write(r.v)) {   // one aligned word
    const wire::Reth &reth = r.v.p.h.reth;
    return r.len == 8 && reth.dma_len == 8 && reth.va % 8 == 0 ? RespStep::check_length : RespStep::error;
  }
  if (r.is_send || r.is_write || r.placed) return RespStep::check_length;
  if (qp.attr.max_dest_rd_atomic == 0) return RespStep::error;   // (inv_req)
  if ((r.mask & wire::IS_ATOMIC) && r.v.p.h.atomic.va % 8) return RespStep::error;
  return RespStep::execute;
}

// Payload sizes (class C): FIRST and MIDDLE are exactly one PMTU, a LAST
// after them not empty, nothing larger than the PMTU.
Engine::RespStep Engine::check_length(Qp &qp, Request &r) {
  const uint32_t pmtu = qp.attr.pmtu;
  if (!r.placed && ((!r.last && r.len != pmtu) || r.len > pmtu || (r.last && !r.first && r.len == 0)))
    return RespStep::error;   // (inv_req)
  note_first_request(qp);
  return r.placed ? RespStep::complete : RespStep::check_resource;
}

// A SEND, or a WRITE with immediate data, takes a receive WQE: none posted
// is RNR; a SEND longer than the receive buffer completes that WQE with a
// local length error and is an invalid request (class C).
Engine::RespStep Engine::check_resource(Qp &qp, Request &r) {
  if (qp.xrc_remote) [[unlikely]] return xrc_forward(qp, r);   // (another process's SRQ)
  if (r.is_send && qp.rq->tm && !tm_receive(qp, r)) [[unlikely]] return RespStep::error;
  if ((r.is_send || (r.mask & wire::HAS_IMMDT)) && !recv_wqe(qp)) {
    r.err = RespErr::rnr;
    return RespStep::error;
  }
  if (!r.is_send) return RespStep::check_rkey;
  if (r.first) qp.resp.recv_offset = 0;
  if (r.first && !r.last && !qp.resp.has_cur) take_recv(qp);   // (a matched tag's is taken)
  if (static_cast<uint64_t>(qp.resp.recv_offset) + r.len > recv_wqe(qp)->length) {
    complete_recv(qp, WcStatus::loc_len_err, WcOpcode::recv, 0, false, 0, false);
    return RespStep::error;   // (inv_req)
  }
  return RespStep::execute;
}

// An RDMA WRITE's target: its FIRST (or ONLY) loads the RETH; every packet
// stays within its length (class C, invalid request) and resolves the rkey
// again (class C, remote access error: rkey, PD, bounds or access, nothing
// written): the MR may have been deregistered since the packet before
// (after ibv_dereg_mr returns nothing lands in it), or its pages unmapped.
Engine::RespStep Engine::check_rkey(Qp &qp, Request &r) {
  RespState &s = qp.resp;
  if (r.first) {
    const wire::Reth &reth = r.v.p.h.reth;
    s.write_len = s.write_left = reth.dma_len;
    s.write_va = reth.va;
    s.write_rkey = reth.rkey;
  }
  if (r.len > s.write_left || (r.last && r.len != s.write_left)) return RespStep::error;   // (inv_req)
  if (!s.write_left) return RespStep::execute;
  r.to = (qp.attr.access & kAccessRemoteWrite)
             ? mem_->resolve(qp.pd, qp.qpn, s.write_rkey, s.write_va, r.first ? s.write_left : r.len, kAccessRemoteWrite)
             : nullptr;
  r.err = RespErr::rem_access;
  return r.to ? RespStep::execute : RespStep::error;
}

Engine::RespStep Engine::execute(Qp &qp, Request &r) {
  if (r.is_send) {
    if (execute_send(qp, *recv_wqe(qp), qp.resp.recv_offset, r.v.p.payload + r.skip, r.len)) return RespStep::complete;
    // The receive buffer was unmapped: the WQE completes with a local
    // protection error, the requester gets a remote operational error.
    complete_recv(qp, WcStatus::loc_prot_err, WcOpcode::recv, 0, false, 0, false);
    r.err = RespErr::rem_op;
    return RespStep::error;
  }
  if (r.is_write && is_atomic_write(r.v)) {
    // ATOMIC WRITE (IBA 1.5, 9.4.7): the 8 bytes land with one store, so no
    // reader sees part of them; like a WRITE, executed once (a duplicate is
    // acknowledged again, not stored again).
    uint64_t word;
    std::memcpy(&word, r.v.p.payload, 8);
    if (!guard::run([&] { __atomic_store_n(reinterpret_cast<uint64_t *>(r.to), word, __ATOMIC_SEQ_CST); })) {
      r.err = RespErr::rem_access;
      return RespStep::error;
    }
    qp.resp.write_left = 0;
    return RespStep::complete;
  }
  if (r.is_write) {
    if (r.len && !guard::copy(r.to, r.v.p.payload, r.len)) {
      r.err = RespErr::rem_access;
      return RespStep::error;
    }
    qp.resp.write_va += r.len;
    qp.resp.write_left -= r.len;
    return RespStep::complete;
  }
  // READ or ATOMIC: executed and answered at once (their responses take
  // the PSNs and carry the ACK).
  qp.resp.nak_sent = false;
  if (r.mask & wire::IS_READ) read_request(qp, r.v, false);
  else atomic_request(qp, r.v, false);
  return RespStep::done;
}

// A message's last packet completes its receive WQE: a SEND's, or the one
// a WRITE with immediate data consumes. (A placed WRITE's notice: the
// requester wrote the data into our memory itself, through the gate this
// QP opened, Engine::update_gate; it completes nothing here.)
Engine::RespStep Engine::complete(Qp &qp, Request &r) {
  const wire::Headers &h = r.v.p.h;
  if (r.is_send && r.last && (r.mask & wire::HAS_IETH)) {
    // SEND with Invalidate (IBA 9.4.1.1, 10.6.7.2.4): the R_Key must name a
    // type 2 window of this QP's PD bound to this QP, else an invalid
    // request. The receive completes with the key it invalidated.
    if (!mem_->invalidate(qp.pd, qp.qpn, h.ieth)) return RespStep::error;   // (inv_req)
    qp.resp.in_msg = false;
    qp.resp.in_send = true;
    RecvSink none;
    complete_recv(qp, none, *recv_wqe(qp), WcStatus::success, WcOpcode::recv, qp.resp.recv_offset, false, h.ieth,
                  h.bth.se, true);
    release_recv(qp);
  } else if (r.is_send && r.last && qp.resp.tm.kind != TmRecv::Kind::none) [[unlikely]] {
    tm_complete(qp, r);
  } else if (r.is_send) {
    RecvSink none;
    complete_send(qp, none, *recv_wqe(qp), r.last, r.mask & wire::HAS_IMMDT, h.imm_be, h.bth.se);
    if (r.last) release_recv(qp);
  } else if (!r.placed) {
    qp.resp.in_msg = !r.last;
    qp.resp.in_send = false;
    if (r.last && (r.mask & wire::HAS_IMMDT))
      complete_recv(qp, WcStatus::success, WcOpcode::recv_rdma_with_imm, qp.resp.write_len, true, h.imm_be,
                    h.bth.se);
  }
  return RespStep::acknowledge;
}

// Taken: the expected PSN moves on; an ACK if the packet asks for one (a
// placed WRITE's notice always does: its WQE waits for it).
Engine::RespStep Engine::acknowledge(Qp &qp, Request &r) {
  accept_request(qp, r.last || r.placed, r.v.p.h.bth.ack_req || r.placed);
  return RespStep::done;
}

void Engine::send_read_responses(Qp &qp, uint32_t psn, const uint8_t *data, uint32_t len) {
  uint32_t n = len == 0 ? 1 : (len + qp.attr.pmtu - 1) / qp.attr.pmtu;
  for (uint32_t k = 0; k < n; k++) {
    uint32_t off = k * qp.attr.pmtu, l = std::min(qp.attr.pmtu, len - off);
    bool first = k == 0, last = k + 1 == n;
    const wire::Headers h =
        response_headers(qp, uint8_t(wr_info(WrOpcode::rdma_read).response[wire::position(first, last)]),
                         psn_add(psn, k), wire::aeth_ack());
    TxSlot &s = tx_slot();
    size_t hl = wire::build_headers(h, l, s.hdr);
    size_t pieces = 0;
    if (l) s.iov[1 + pieces++] = {const_cast<uint8_t *>(data) + off, l};
    tx_commit(qp, hl, l, pieces);
  }
}

void Engine::send_atomic_ack(Qp &qp, uint32_t psn, uint64_t orig) {
  wire::Headers h = response_headers(qp, uint8_t(Opcode::RC_ATOMIC_ACKNOWLEDGE), psn, wire::aeth_ack());
  h.atomic_ack = orig;
  TxSlot &s = tx_slot();
  tx_commit(qp, wire::build_headers(h, 0, s.hdr), 0, 0);
}

// RDMA READ (IBA 9.7.4.2.6): executed at once; the responses take the
// request's PSN and the ones after it.
void Engine::read_request(Qp &qp, const PacketView &v, bool duplicate) {
  const uint32_t psn = v.psn();
  const wire::Reth &r = v.p.h.reth;
  if (duplicate) {
    // A READ changes nothing, so a duplicate (or a READ resumed from a
    // response gap) is executed again from its own RETH (IBA 9.7.5.2.2).
    // A resumed READ may reach past the expected PSN (it also asks for a
    // piece whose own request was lost): the expected PSN then moves to
    // its end, as for a new request.
    uint8_t *p = r.dma_len && (qp.attr.access & kAccessRemoteRead)
                     ? mem_->resolve(qp.pd, qp.qpn, r.rkey, r.va, r.dma_len, kAccessRemoteRead) : nullptr;
    if (r.dma_len && (!p || !guard::readable(p, r.dma_len))) return;
    uint32_t end = psn_add(psn, r.dma_len == 0 ? 1 : (r.dma_len + qp.attr.pmtu - 1) / qp.attr.pmtu);
    if (psn_lt(qp.resp.epsn, end)) {
      qp.resp.epsn = end;
      qp.resp.msn = msn_add(qp.resp.msn, 1);
      qp.resp.nak_sent = false;
    }
    send_read_responses(qp, psn, p, r.dma_len);
    return;
  }
  uint8_t *p = nullptr;
  if (r.dma_len) {
    p = (qp.attr.access & kAccessRemoteRead)
            ? mem_->resolve(qp.pd, qp.qpn, r.rkey, r.va, r.dma_len, kAccessRemoteRead) : nullptr;
    // (Its pages mapped, looked at now; unmapped later, the NIC's guarded
    // copy drops the response and the resent READ finds them gone.)
    if (!p || !guard::readable(p, r.dma_len))
      return respond_error(qp, RespErr::rem_access, psn);
  }
  uint32_t n = r.dma_len == 0 ? 1 : (r.dma_len + qp.attr.pmtu - 1) / qp.attr.pmtu;
  qp.resp.epsn = psn_add(qp.resp.epsn, n);
  qp.resp.msn = msn_add(qp.resp.msn, 1);
  send_read_responses(qp, psn, p, r.dma_len);
}

// ATOMIC (IBA 9.7.4.2.7): executed once with a CPU atomic on the 8-byte
// word (so it is atomic against every other atomic on this host, from any
// QP or process, and against the host's own atomics); the original value is
// saved for duplicates.
void Engine::atomic_request(Qp &qp, const PacketView &v, bool duplicate) {
  const uint32_t psn = v.psn();
  if (duplicate) {
    for (const RespState::AtomicRes &e : qp.resp.res)
      if (e.valid && e.psn == psn) return send_atomic_ack(qp, psn, e.orig);
    return;
  }
  const wire::AtomicEth &a = v.p.h.atomic;
  uint8_t *p = (qp.attr.access & kAccessRemoteAtomic)
                   ? mem_->resolve(qp.pd, qp.qpn, a.rkey, a.va, 8, kAccessRemoteAtomic) : nullptr;
  auto *word = reinterpret_cast<uint64_t *>(p);
  uint64_t orig = 0;
  const bool cas = (v.opcode() & 0x1f) == static_cast<uint8_t>(Opcode::RC_COMPARE_SWAP);   // (RC or XRC)
  if (!p || !guard::run([&] {   // (its page unmapped: an access error)
        if (cas) {
          orig = a.compare;
          __atomic_compare_exchange_n(word, &orig, a.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        } else {
          orig = __atomic_fetch_add(word, a.swap_add, __ATOMIC_SEQ_CST);
        }
      }))
    return respond_error(qp, RespErr::rem_access, psn);
  // The last max_dest_rd_atomic results are kept (responder resources).
  qp.resp.res[qp.resp.res_next++ % qp.attr.max_dest_rd_atomic] = {true, psn, orig};
  qp.resp.epsn = psn_add(qp.resp.epsn, 1);
  qp.resp.msn = msn_add(qp.resp.msn, 1);
  send_atomic_ack(qp, psn, orig);
}

// UC responder (IBA 9.7.4 less acknowledgement, 10.8.3.2): packets are
// taken in order; a PSN gap abandons the message in progress (a SEND's WQE
// stays for the next message) and packets are taken again from the next
// FIRST or ONLY. A message that fails a check (no receive, too long, a
// bad rkey) is dropped from there on; what completes, completes as RC's.
// The QP stays in RTR or RTS throughout.
void Engine::uc_rx(Qp &qp, const PacketView &v) {
  RespState &s = qp.resp;
  const uint32_t mask = v.p.info->mask, len = static_cast<uint32_t>(v.p.payload_len);
  const bool first = mask & wire::IS_FIRST, last = mask & wire::IS_LAST, send = mask & wire::IS_SEND;
  const bool imm = mask & wire::HAS_IMMDT;
  const wire::Headers &h = v.p.h;
  if (v.psn() != s.epsn) s.in_msg = false;   // a gap: the message in progress is lost
  s.epsn = psn_add(v.psn(), 1);
  note_first_request(qp);
  const auto drop = [&](Counter c) {
    s.in_msg = false;
    count(c);
  };
  if (!first && (!s.in_msg || s.in_send != send)) return drop(Counter::uc_drops);   // (the rest of a lost one)
  if ((!last && len != qp.attr.pmtu) || len > qp.attr.pmtu) return drop(Counter::uc_drops);
  s.in_msg = !last;
  s.in_send = send;
  if (send) {
    if (first) {
      if (!recv_wqe(qp)) return drop(Counter::no_recv_drops);
      s.recv_offset = 0;
      if (!last && !s.has_cur) take_recv(qp);
    }
    const RecvWqe &r = *recv_wqe(qp);
    if (uint64_t(s.recv_offset) + len > r.length) {
      complete_recv(qp, WcStatus::loc_len_err, WcOpcode::recv, 0, false, 0, false);
      return drop(Counter::uc_drops);
    }
    if (!execute_send(qp, r, s.recv_offset, v.p.payload, len)) {
      complete_recv(qp, WcStatus::loc_prot_err, WcOpcode::recv, 0, false, 0, false);
      return drop(Counter::uc_drops);
    }
    if (last) complete_recv(qp, WcStatus::success, WcOpcode::recv, s.recv_offset, imm, h.imm_be, h.bth.se);
    return;
  }
  // RDMA WRITE: the RETH of its first packet, every packet's range resolved
  // again (as RC's check_rkey).
  if (first) {
    s.write_len = s.write_left = h.reth.dma_len;
    s.write_va = h.reth.va;
    s.write_rkey = h.reth.rkey;
  }
  if (len > s.write_left || (last && len != s.write_left)) return drop(Counter::uc_drops);
  if (len) {
    uint8_t *to = (qp.attr.access & kAccessRemoteWrite)
                      ? mem_->resolve(qp.pd, qp.qpn, s.write_rkey, s.write_va, len, kAccessRemoteWrite) : nullptr;
    if (!to || !guard::copy(to, v.p.payload, len)) return drop(Counter::uc_drops);
  }
  s.write_va += len;
  s.write_left -= len;
  if (last && imm) {
    if (!recv_wqe(qp)) return drop(Counter::no_recv_drops);
    complete_recv(qp, WcStatus::success, WcOpcode::recv_rdma_with_imm, s.write_len, true, h.imm_be, h.bth.se);
  }
}

}  // namespace usrc::rc
