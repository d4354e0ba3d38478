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

void Engine::send_ack(Qp &qp, uint8_t syndrome, uint32_t psn) {
  if (!qp.local.in_place || !ack_in_place(qp, syndrome, psn)) send_ack_packet(qp, syndrome, psn);
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

void Engine::send_ack_packet(Qp &qp, uint8_t syndrome, uint32_t psn) {
  wire::Headers h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::RC_ACKNOWLEDGE);
  h.bth.pkey = 0xffff;
  h.bth.dest_qp = qp.attr.dest_qpn;
  h.bth.psn = psn;
  h.aeth = {syndrome, qp.resp.msn};
  TxSlot &s = tx_slot();
  size_t hl = wire::build_headers(h, 0, s.hdr);
  tx_commit(qp, hl, 0, 0);
}

// A request the responder cannot execute (IBA 9.7.5.2.4, the NAK codes):
// NAKed with code, the QP to the error state, the async event ev.
void Engine::nak_fail(Qp &qp, uint8_t code, uint32_t psn, QpEvent ev) {
  send_ack(qp, wire::aeth_nak(code), psn);
  qp.resp.nak_sent = true;
  set_state(qp, QpState::err);
  if (hooks_) hooks_->qp_event(qp, ev);
}

void Engine::complete_recv(Qp &qp, WcStatus st, WcOpcode op, uint32_t len, bool imm,
                           uint32_t imm_be, bool solicited) {
  const RecvWqe &r = qp.rq.front();
  push(qp.recv_cq, {r.wr.wr_id, st, op, imm, solicited, len, imm_be, qp.qpn, qp.attr.dest_qpn, qp.attr.dlid, stamp()});
  qp.rq.pop();
}

// Scatter len bytes at offset off of the receive WQE's buffers; false if
// one of them is no longer mapped (guard.h).
[[gnu::noinline]] static bool scatter(const RecvWqe &r, uint32_t off, const uint8_t *src, uint32_t len) {
  for (uint32_t i = 0; i < r.wr.num_sge && len; i++) {
    const Sge &g = r.wr.sge[i];
    if (off >= g.length) {
      off -= g.length;
      continue;
    }
    uint32_t n = std::min(g.length - off, len);
    if (!guard::copy(g.addr + off, src, n)) return false;
    src += n;
    len -= n;
    off = 0;
  }
  return true;
}

// The common request on its own short path: SEND ONLYs (with or without
// immediate data) from the peer of a QP on this host, without an ICRC, in
// order, each into a posted receive that holds it; as many in a row as
// there are, for the QP of the first (checked once: a same-host sender's
// ring slot holds a run of them). Returns how many it took. Every packet
// it does not take goes through parse() and responder_rx(), which check,
// NAK, drop and count what is wrong with it; what this one takes they
// would handle the same way.
size_t Engine::fast_sends(const net::RxPacket *pkts, size_t n) {
  constexpr uint8_t kOnly = uint8_t(Opcode::RC_SEND_ONLY), kOnlyImm = uint8_t(Opcode::RC_SEND_ONLY_IMM);
  if (pkts[0].len < wire::kMinPacketLen ||
      (wire::bth::opcode(pkts[0].data) != kOnly && wire::bth::opcode(pkts[0].data) != kOnlyImm))
    return 0;
  const uint32_t qpn = wire::bth::qpn(pkts[0].data);
  Qp *qp = find_qp(qpn);
  // No ICRC is accepted only from this host: the QP's peer, on a local path.
  if (!qp || !qp->local.same_host || !from_peer(*qp, pkts[0].src) || qp->linger_until || !qp->resp.comm_est ||
      qp->state < QpState::rtr || qp->state > QpState::sqe || qp->resp.in_msg || qp->resp.held)
    return 0;
  uint32_t epsn = qp->resp.epsn, last_len = 0;
  bool ack = false;
  uint64_t bytes = 0;
  // What the run needs of the QP, read once: the payload copies store
  // through byte pointers, after which the compiler would read every QP
  // field again. The receives are walked by pointer and popped together.
  const uint32_t pmtu = qp->attr.pmtu;
  const uint64_t posted = qp->rq.tail - qp->rq.head;
  RecvWqe *r = &qp->rq.front(), *const rq_begin = qp->rq.begin_slots(), *const rq_end = qp->rq.end_slots();
  Cq *const cq = qp->recv_cq;
  Completion c{0, WcStatus::success, WcOpcode::recv, false, false, 0, 0, qp->qpn, qp->attr.dest_qpn, qp->attr.dlid, stamp()};
  // Straight into a poller's array while it has room (see DirectWc), then
  // into the ring.
  Wc *out = nullptr, *out_end = nullptr;
  if (cq && direct.cq == cq && direct.n < direct.room && cq->idle()) {
    out = direct.wc + direct.n;
    out_end = direct.wc + direct.room;
  }
  const Wc wc0{0, uint32_t(WcStatus::success), uint32_t(WcOpcode::recv), 0, 0, 0, qp->qpn, qp->attr.dest_qpn,
               0, 0, qp->attr.dlid, 0, 0};
  const net::Endpoint src = pkts[0].src;   // (from_peer: the run takes only this source)
  size_t k = 0;
  for (; k < n && k < posted; k++) {   // (none posted: the general path sends the RNR NAK)
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
    const uint32_t body = pkt.len - hl - wire::kIcrcLen, pad = wire::bth::pad(b);
    if ((body & 3) || pad > body || wire::icrc::get(b + pkt.len - wire::kIcrcLen) != 0) break;
    if (wire::bth::qpn(b) != qpn || pkt.src != src || wire::bth::psn(b) != epsn) break;
    const bool solicited = wire::bth::se(b), ack_req = wire::bth::ack_req(b);
    const uint32_t imm_be =
        imm ? wire::immdt::get_be(b + wire::info_of(Opcode::RC_SEND_ONLY_IMM).offset[wire::IMMDT]) : 0;
    const uint32_t len = body - pad;
    if (len > pmtu || len > r->length) break;
    // (A receive buffer unmapped: the general path fails it.)
    if (!(r->wr.num_sge == 1 ? guard::copy(r->wr.sge[0].addr, b + hl, len) : scatter(*r, 0, b + hl, len)))
      break;
    if (out != out_end) {
      Wc &w = *out++;
      w = wc0;
      w.wr_id = r->wr.wr_id;
      w.byte_len = len;
      w.imm_be = imm_be;
      w.wc_flags = imm ? kWcWithImm : 0;
    } else if (cq) {
      c.wr_id = r->wr.wr_id;
      c.with_imm = imm;
      c.solicited = solicited;
      c.byte_len = len;
      c.imm_be = imm_be;
      if (!cq->push(c)) [[unlikely]] cq_overflow_ = true;
    }
    epsn = psn_add(epsn, 1);
    bytes += pkt.len;
    ack |= ack_req;
    last_len = len;
    if (++r == rq_end) r = rq_begin;
  }
  qp->rq.pop(static_cast<uint32_t>(k));
  if (out) direct.n = static_cast<uint32_t>(out - direct.wc);
  if (!k) return 0;
  count(Counter::rx_packets, k);
  count(Counter::rx_bytes, bytes);
  qp->resp.recv_offset = last_len;
  qp->resp.in_send = true;
  qp->resp.msn = msn_add(qp->resp.msn, static_cast<uint32_t>(k));
  qp->resp.epsn = epsn;
  qp->resp.nak_sent = false;
  if (ack) {
    if (!qp->resp.ack_pending) ack_list_.push_back(qp);
    qp->resp.ack_pending = true;
  }
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
  if (took && (qp.resp.held || qp.resp.hold_missed) && !qp.resp.nak_sent) {
    qp.resp.nak_sent = true;
    send_ack(qp, wire::aeth_nak(wire::NAK_PSN_SEQ), qp.resp.epsn);
  }
  if (!qp.resp.held) qp.resp.hold_missed = false;
}

void Engine::drop_held(Qp &qp) {
  for (Held &h : held_)
    if (h.qp == &qp) h.qp = nullptr;
  qp.resp.held = 0;
  qp.resp.hold_missed = false;
}

void Engine::responder_rx(Qp &qp, const PacketView &v) {
  const uint32_t psn = v.psn();
  const int32_t d = psn_diff(psn, qp.resp.epsn);
  const uint32_t mask = v.p.info->mask;
  if (d < 0) {
    // Duplicate (IBA 9.7.5.2.2): already executed; acknowledge again so a
    // requester whose ACK was lost makes progress. READ and ATOMIC are
    // answered from the saved request.
    count(Counter::duplicates);
    if (mask & wire::IS_READ) return read_request(qp, v, true);
    if (mask & wire::IS_ATOMIC) return atomic_request(qp, v, true);
    if (!qp.resp.ack_pending) ack_list_.push_back(&qp);
    qp.resp.ack_pending = true;
    return;
  }
  if (d > 0) {
    // PSN sequence error (IBA 9.7.5.2.3): NAK once, then take nothing
    // until the expected PSN arrives. SEND and WRITE packets are kept for
    // then (hold): the requester need resend only the lost ones.
    if ((mask & (wire::IS_SEND | wire::IS_WRITE)) && v.opcode() != uint8_t(Opcode::USRC_WRITE_PLACED))
      hold(qp, v);
    if (!qp.resp.nak_sent) {
      qp.resp.nak_sent = true;
      send_ack(qp, wire::aeth_nak(wire::NAK_PSN_SEQ), qp.resp.epsn);
    }
    return;
  }

  const bool is_send = mask & wire::IS_SEND, is_write = mask & wire::IS_WRITE;
  const bool first = mask & wire::IS_FIRST, last = mask & wire::IS_LAST;
  const uint32_t len = static_cast<uint32_t>(v.p.payload_len);

  auto invalid = [&] {
    // C9-...: an invalid request is NAKed and the responder's QP fails.
    send_ack(qp, wire::aeth_nak(wire::NAK_INVALID_REQUEST), psn);
    qp.resp.nak_sent = true;
    set_state(qp, QpState::err);
    if (hooks_) hooks_->qp_event(qp, QpEvent::req_err);
  };

  if (v.opcode() == uint8_t(Opcode::USRC_WRITE_PLACED)) {
    // The requester wrote the data into our memory itself, through the
    // gate this QP opened (Engine::update_gate): take its PSN, acknowledge.
    if (qp.resp.in_msg) return invalid();
    if (!qp.resp.comm_est) {
      qp.resp.comm_est = true;
      if (qp.state == QpState::rtr && hooks_) hooks_->qp_event(qp, QpEvent::comm_est);
    }
    qp.resp.msn = msn_add(qp.resp.msn, 1);
    qp.resp.epsn = psn_add(qp.resp.epsn, 1);
    qp.resp.nak_sent = false;
    if (!qp.resp.ack_pending) ack_list_.push_back(&qp);
    qp.resp.ack_pending = true;
    return;
  }
  if (!is_send && !is_write) {   // READ or ATOMIC
    // No responder resources (max_dest_rd_atomic 0): the QP takes no
    // READ or ATOMIC at all.
    if (qp.resp.in_msg || qp.attr.max_dest_rd_atomic == 0) return invalid();
    qp.resp.nak_sent = false;
    if (mask & wire::IS_READ) return read_request(qp, v, false);
    return atomic_request(qp, v, false);
  }
  // Opcode sequence (IBA 9.7.4.2.2): FIRST/ONLY start a message, MIDDLE/
  // LAST continue one of the same kind.
  if (first == qp.resp.in_msg || (qp.resp.in_msg && qp.resp.in_send != is_send)) {
    invalid();
    return;
  }
  // Payload sizes (C9-...): FIRST and MIDDLE are exactly one PMTU.
  if ((!last && len != qp.attr.pmtu) || len > qp.attr.pmtu || (last && !first && len == 0)) {
    invalid();
    return;
  }
  if (!qp.resp.comm_est) {
    qp.resp.comm_est = true;
    if (qp.state == QpState::rtr && hooks_) hooks_->qp_event(qp, QpEvent::comm_est);
  }

  const bool imm = mask & wire::HAS_IMMDT;
  const bool needs_rwqe = is_send || imm;
  if (needs_rwqe && qp.rq.empty()) {
    // Receiver Not Ready (IBA 9.7.5.2.8): ask the requester to come back.
    send_ack(qp, wire::aeth_rnr_nak(qp.attr.min_rnr_timer), psn);
    qp.resp.nak_sent = true;
    return;
  }

  if (is_send) {
    if (first) qp.resp.recv_offset = 0;
    RecvWqe &r = qp.rq.front();
    if (static_cast<uint64_t>(qp.resp.recv_offset) + len > r.length) {
      // Message longer than the receive buffer: the WQE completes with a
      // local length error and the requester gets an invalid request NAK.
      complete_recv(qp, WcStatus::loc_len_err, WcOpcode::recv, 0, false, 0, false);
      invalid();
      return;
    }
    if (!scatter(r, qp.resp.recv_offset, v.p.payload, len)) {
      // The receive buffer was unmapped: the WQE completes with a local
      // protection error (which says it: no async event), the requester
      // gets a remote operational error.
      complete_recv(qp, WcStatus::loc_prot_err, WcOpcode::recv, 0, false, 0, false);
      send_ack(qp, wire::aeth_nak(wire::NAK_REMOTE_OP), psn);
      qp.resp.nak_sent = true;
      set_state(qp, QpState::err);
      return;
    }
    qp.resp.recv_offset += len;
  } else {
    if (first) {
      const wire::Reth &reth = v.p.h.reth;
      qp.resp.write_len = qp.resp.write_left = reth.dma_len;
      qp.resp.write_va = reth.va;
      qp.resp.write_rkey = reth.rkey;
    }
    if (len > qp.resp.write_left || (last && len != qp.resp.write_left)) {
      invalid();
      return;
    }
    // Every packet resolves the rkey (a FIRST the whole message's range):
    // the MR may have been deregistered since the one before (after
    // ibv_dereg_mr returns nothing lands in it), or its pages unmapped.
    // C9-...: rkey, PD, bounds or access violation: NAK, nothing written.
    if (qp.resp.write_left) {
      uint8_t *const to = (qp.attr.access & kAccessRemoteWrite)
                              ? mem_->resolve(qp.pd, qp.resp.write_rkey, qp.resp.write_va,
                                              first ? qp.resp.write_left : len, kAccessRemoteWrite)
                              : nullptr;
      if (!to || (len && !guard::copy(to, v.p.payload, len)))
        return nak_fail(qp, wire::NAK_REMOTE_ACCESS, psn, QpEvent::access_err);
    }
    qp.resp.write_va += len;
    qp.resp.write_left -= len;
  }

  qp.resp.in_msg = !last;
  qp.resp.in_send = is_send;
  if (last) {
    if (is_send)
      complete_recv(qp, WcStatus::success, WcOpcode::recv, qp.resp.recv_offset, imm, v.p.h.imm_be,
                    v.p.h.bth.se);
    else if (imm)
      complete_recv(qp, WcStatus::success, WcOpcode::recv_rdma_with_imm, qp.resp.write_len, true,
                    v.p.h.imm_be, v.p.h.bth.se);
    qp.resp.msn = msn_add(qp.resp.msn, 1);
  }
  qp.resp.epsn = psn_add(qp.resp.epsn, 1);
  qp.resp.nak_sent = false;
  if (v.p.h.bth.ack_req) {
    if (!qp.resp.ack_pending) ack_list_.push_back(&qp);
    qp.resp.ack_pending = true;
  }
}

void Engine::send_read_responses(Qp &qp, uint32_t psn, const uint8_t *data, uint32_t len) {
  uint32_t n = len == 0 ? 1 : (len + qp.attr.pmtu - 1) / qp.attr.pmtu;
  for (uint32_t k = 0; k < n; k++) {
    uint32_t off = k * qp.attr.pmtu, l = std::min(qp.attr.pmtu, len - off);
    bool first = k == 0, last = k + 1 == n;
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wr_info(WrOpcode::rdma_read).response[wire::position(first, last)]);
    h.bth.pkey = 0xffff;
    h.bth.dest_qp = qp.attr.dest_qpn;
    h.bth.psn = psn_add(psn, k);
    h.aeth = {wire::aeth_ack(), qp.resp.msn};
    TxSlot &s = tx_slot();
    size_t hl = wire::build_headers(h, l, s.hdr);
    size_t pieces = 0;
    if (l) s.iov[1 + pieces++] = {const_cast<uint8_t *>(data) + off, l};
    tx_commit(qp, hl, l, pieces);
  }
}

void Engine::send_atomic_ack(Qp &qp, uint32_t psn, uint64_t orig) {
  wire::Headers h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::RC_ATOMIC_ACKNOWLEDGE);
  h.bth.pkey = 0xffff;
  h.bth.dest_qp = qp.attr.dest_qpn;
  h.bth.psn = psn;
  h.aeth = {wire::aeth_ack(), qp.resp.msn};
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
                     ? mem_->resolve(qp.pd, r.rkey, r.va, r.dma_len, kAccessRemoteRead) : nullptr;
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
            ? mem_->resolve(qp.pd, r.rkey, r.va, r.dma_len, kAccessRemoteRead) : nullptr;
    // (Its pages mapped, looked at now; unmapped later, the NIC's guarded
    // copy drops the response and the resent READ finds them gone.)
    if (!p || !guard::readable(p, r.dma_len))
      return nak_fail(qp, wire::NAK_REMOTE_ACCESS, psn, QpEvent::access_err);
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
  if (a.va % 8) {
    send_ack(qp, wire::aeth_nak(wire::NAK_INVALID_REQUEST), psn);
    qp.resp.nak_sent = true;
    set_state(qp, QpState::err);
    if (hooks_) hooks_->qp_event(qp, QpEvent::req_err);
    return;
  }
  uint8_t *p = (qp.attr.access & kAccessRemoteAtomic)
                   ? mem_->resolve(qp.pd, a.rkey, a.va, 8, kAccessRemoteAtomic) : nullptr;
  auto *word = reinterpret_cast<uint64_t *>(p);
  uint64_t orig = 0;
  const bool cas = v.opcode() == static_cast<uint8_t>(Opcode::RC_COMPARE_SWAP);
  if (!p || !guard::run([&] {   // (its page unmapped: an access error)
        if (cas) {
          orig = a.compare;
          __atomic_compare_exchange_n(word, &orig, a.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        } else {
          orig = __atomic_fetch_add(word, a.swap_add, __ATOMIC_SEQ_CST);
        }
      }))
    return nak_fail(qp, wire::NAK_REMOTE_ACCESS, psn, QpEvent::access_err);
  // The last max_dest_rd_atomic results are kept (responder resources).
  qp.resp.res[qp.resp.res_next++ % qp.attr.max_dest_rd_atomic] = {true, psn, orig};
  qp.resp.epsn = psn_add(qp.resp.epsn, 1);
  qp.resp.msn = msn_add(qp.resp.msn, 1);
  send_atomic_ack(qp, psn, orig);
}

}  // namespace usrc::rc
