// Requester: turns send WQEs into request packets (IBA 9.7.4.1).
#include <cstring>

#include "usrc/common/copy.h"
#include "usrc/common/guard.h"
#include "usrc/common/tunables.h"
#include "usrc/rc/engine.h"
#include "usrc/rc/psn.h"
#include "usrc/rc/wr_opcode.h"
#include "usrc/wire/packet.h"

namespace usrc::rc {

using wire::Opcode;

// The BTH opcode of packet k of w's message (the WR opcode table's, an RC
// one; UC's SENDs and WRITEs are the same at 0x20 on, XRC's all at 0xa0
// on, IBA 9.2.1).
[[gnu::always_inline]] inline static uint8_t request_opcode(const Qp &qp, const SendWqe &w, uint32_t k) {
  return request_opcode(wr_info(w.wr.opcode), k, w.npkts) | (qp.type == QpType::uc ? 0x20 : 0) |
         (qp.xrc == XrcRole::ini ? wire::kXrcOpcodeBase : 0);
}

// One past the last PSN of the piece of READ w (SendWqe::rd_piece, set when
// it was first sent) that holds psn; an ATOMIC's one PSN.
static uint32_t piece_end(const SendWqe &w, uint32_t psn) {
  const uint32_t done = static_cast<uint32_t>(psn_diff(psn, w.first_psn));
  return psn_add(w.first_psn, std::min(w.npkts, (done / w.rd_piece + 1) * w.rd_piece));
}

// Transmits what the window allows: new packets and, after go_back_n(),
// packets again. Bounded per call (design: cap retransmits per pass).
void Engine::requester_tx(Qp &qp) {
  if (qp.state != QpState::rts && qp.state != QpState::sqd) return;
  if (qp.comp.rnr_deadline) return;   // waiting out an RNR NAK
  if (lp_->tx_blocked(qp.attr.peer)) return;   // the peer's ring is full: what waits goes first
  if (qp.state == QpState::rts && !qp.attr.rate_bps && qp.local.in_place)
    while (qp.req.tx_psn != qp.req.next_psn && send_direct(qp)) {
    }
  uint32_t cap = tun_.retransmit_cap;
  while (qp.req.tx_psn != qp.req.next_psn && cap--) {
    const uint32_t wnd = qp.req.send_window();
    if (static_cast<uint32_t>(psn_diff(qp.req.tx_psn, qp.comp.una_psn)) >= wnd) break;
    SendWqe &w = qp.sq.at(qp.req.tx_pos);
    const bool rd = is_rd_atomic(w.wr.opcode);
    if (qp.req.tx_psn == w.first_psn || rd) {
      // SQD (IBA 10.3.1.4): finish the message in progress, start no new
      // one. A message sent before (tx_high beyond its start) is in
      // progress, also when a loss makes it resend from its first packet.
      if (qp.state == QpState::sqd && qp.req.tx_psn == w.first_psn && !psn_lt(w.first_psn, qp.req.tx_high))
        break;
      if (qp.req.tx_psn == w.first_psn && credit_wait(qp, w)) break;
      if (rd || (w.wr.flags & kFence)) {
        // READ/ATOMIC requests in flight: those in [head, tx_pos).
        const uint32_t in_flight =
            qp.sq.head == qp.req.tx_pos ? 0 : w.rd_before - qp.sq.front().rd_before;
        // IBV_SEND_FENCE (IBA 10.8.3.3): wait for earlier READs and ATOMICs.
        if ((w.wr.flags & kFence) && in_flight) break;
        // Initiator depth (max_rd_atomic, IBA 9.7.4.1.5).
        if (rd && in_flight >= std::max<uint32_t>(qp.attr.max_rd_atomic, 1)) break;
      }
    }
    // A READ takes one request packet but as many PSNs as response packets
    // (IBA 9.7.1.2). A large READ is asked for in pieces that fit the window,
    // each a READ request of its own, so that the responses never overrun
    // our receive buffer: flow control for the responder's side too.
    // The pieces are cut where the first was (SendWqe::rd_piece): a resend
    // from a response gap asks for the rest of its piece, no more.
    uint32_t next = psn_add(qp.req.tx_psn, 1);
    if (rd) {
      uint32_t room = wnd - static_cast<uint32_t>(psn_diff(qp.req.tx_psn, qp.comp.una_psn));
      if (!w.rd_piece) {
        if (room < w.npkts && room < wnd / 4) break;   // no tiny pieces
        w.rd_piece = std::max<uint32_t>(1, std::min(w.npkts, room));
      }
      next = piece_end(w, qp.req.tx_psn);
      const uint32_t left = static_cast<uint32_t>(psn_diff(next, qp.req.tx_psn));
      if (room < left && room < wnd / 4) break;
    }
    if (qp.attr.rate_bps) {
      // Packet pacing: a token bucket of 64 KB at the QP's rate.
      uint64_t now = clock_();
      if (now < qp.req.pace_next) {
        arm_timer(qp.req.pace_next);
        break;
      }
      uint64_t burst_ns = (65536ull * 8 * 1000000000ull) / qp.attr.rate_bps;
      uint32_t bytes = rd ? 64 : std::min(qp.attr.pmtu, w.length) + 64;   // + IP/UDP/IBA headers
      qp.req.pace_next = std::max(qp.req.pace_next, now > burst_ns ? now - burst_ns : 0) +
                     (uint64_t(bytes) * 8 * 1000000000ull) / qp.attr.rate_bps;
    }
    // The packet that fills the window asks for an ACK: nothing else would
    // open it again but the Local ACK Timeout.
    build_request(qp, w, qp.req.tx_psn, next, static_cast<uint32_t>(psn_diff(next, qp.comp.una_psn)) >= wnd);
    sent(qp, w, next);
  }
  if (qp.comp.una_psn != qp.req.tx_high && !qp.comp.ack_deadline) arm_retransmit(qp);
}

// A first sending of psn: its round trip is timed unless one is being
// timed already (never a resend's: Karn).
void Engine::time_round_trip(Qp &qp, uint32_t psn) {
  if (qp.comp.rtt_on) return;
  qp.comp.rtt_on = true;
  qp.comp.rtt_sent = stamp();
  qp.comp.rtt_psn = psn;
}

// The requester's state after the packets [tx_psn, next) of w were built.
void Engine::sent(Qp &qp, const SendWqe &w, uint32_t next) {
  if (psn_diff(next, qp.req.tx_high) > 0) {
    qp.req.tx_high = next;
    time_round_trip(qp, qp.req.tx_psn);
  } else {
    count(Counter::retransmits);
  }
  qp.req.tx_psn = next;
  if (qp.req.tx_psn == psn_add(w.first_psn, w.npkts)) qp.req.tx_pos++, skip_local(qp);
  // UC: what is sent is done (IBA 9.8.2: no acknowledgement): the WQEs
  // whose last packet left complete, as an ACK would complete them.
  if (qp.type == QpType::uc && ack_through(qp, psn_add(next, kPsnMask)))
    completed_at_post.store(true, std::memory_order_relaxed);
}

// The common small message, sent as it is posted: one packet, all before
// it sent, room in the window, in RTS, unpaced, no READ or ATOMIC ordering
// to keep. Does what requester_tx would do for it, without its loop.
bool Engine::send_single(Qp &qp, SendWqe &w) {
  if (w.npkts != 1 || w.placed || qp.state != QpState::rts || qp.comp.rnr_deadline || qp.attr.rate_bps ||
      qp.req.tx_psn != w.first_psn || is_rd_atomic(w.wr.opcode) || (w.wr.flags & kFence) ||
      lp_->tx_blocked(qp.attr.peer) || credit_wait(qp, w))
    return false;
  const uint32_t wnd = qp.req.send_window();
  const uint32_t used = static_cast<uint32_t>(psn_diff(qp.req.tx_psn, qp.comp.una_psn));
  if (used >= wnd) return false;
  const uint32_t next = psn_add(qp.req.tx_psn, 1);
  build_request(qp, w, qp.req.tx_psn, next, used + 1 >= wnd);
  sent(qp, w, next);
  if (!qp.comp.ack_deadline) arm_retransmit(qp);
  return true;
}

// The WR's part of whether it can take post_small() (small_ready() is the
// QP's): a SEND or an RDMA WRITE (with or without immediate data) of at
// most one buffer, no fence, no direct placement to try.
bool Engine::small_wr(const Qp &qp, const SendWr &wr, uint64_t len) const {
  if (wr.num_sge > 1 || (wr_info(wr.opcode).mask & (WR_READ_OR_ATOMIC | WR_INV)) || (wr.flags & kFence)) return false;
  // (A WRITE that place() may put in the peer's memory: the general path.
  // It places only for an application that polled since its last post.)
  return wr.opcode != WrOpcode::rdma_write || !qp.local.same_host || len > tun_.direct_write ||
         qp.local.polls_at_post == polls.load(std::memory_order_relaxed);
}

// post_slot() for what small_wr() allows to a peer reached in place
// (LocalPath::in_place), behind only small messages posted the same way: the WQE
// takes its PSN and what its packet's headers need, and its packet is
// built with the ones posted after it (send_direct), at once if nothing is
// in flight, or once kTxEager wait and the window has room, or at the
// next progress pass.
void Engine::post_small(Qp &qp, SendWqe &w, uint32_t len) {
  SendWr &wr = w.wr;
  if (wr.flags & kInline) {
    // Inline data is copied now: the caller may reuse its buffer at once.
    copy_small(w.inline_data, wr.num_sge ? wr.sge[0].addr : nullptr, len);
    wr.num_sge = 1;
    wr.sge[0] = {w.inline_data, len};
  }
  const uint32_t psn = qp.req.next_psn, next = psn_add(psn, 1);
  start_wqe(qp, w, len, 1, false);
  const uint8_t op = request_opcode(qp, w, 0);
  const uint32_t pad = wire::pad_for(len);
  w.small = true;
  w.reth_immdt = static_cast<uint8_t>(wire::kOpcodeTable[op].mask & (wire::HAS_RETH | wire::HAS_IMMDT));
  w.pkt_len = static_cast<uint16_t>(wire::kOpcodeTable[op].hdr_len + len + pad + wire::kIcrcLen);
  w.bth0 = wire::bth::word0(op, wr.flags & kSolicited, pad);
  qp.local.polls_at_post = polls.load(std::memory_order_relaxed);
  qp.sq.push();
  qp.req.next_psn = next;
  if (!qp.local.small_run || qp.req.tx_psn == psn) qp.local.small_tail = psn;
  qp.local.small_run = true;
  const bool in_flight = qp.comp.una_psn != qp.req.tx_high;
  if (!in_flight || (static_cast<uint32_t>(psn_diff(next, qp.req.tx_psn)) >= kTxEager &&
                     static_cast<uint32_t>(psn_diff(qp.req.tx_psn, qp.comp.una_psn)) < qp.req.send_window())) {
    Pass pass(*this, 0);   // (as post_slot's)
    requester_tx(qp);
    tx_flush();
    check_faults();
  }
}

// Sends the small messages at the head of qp's unsent ones (each one
// packet, posted by post_small), as far as the window allows, built
// straight into a slot of the peer's ring (net::LocalPeers::tx_begin): no
// transmit batch, no copy after the build. A slot takes packets of one
// size (the last may be shorter) and at most 64 of them (the segment index
// in the BTH); pad and ICRC are zeros (a peer on this host, see
// tx_commit). What it leaves, requester_tx() sends the usual way. The
// caller checked LocalPath::in_place, RTS, no RNR wait, no pacing. False if it
// sent nothing.
bool Engine::send_direct(Qp &qp) {
  const uint32_t wnd = qp.req.send_window();
  const uint32_t used = static_cast<uint32_t>(psn_diff(qp.req.tx_psn, qp.comp.una_psn));
  if (qp.req.tx_psn == qp.req.next_psn || used >= wnd) return false;
  // The WQE holding tx_psn, and the ones after it in turn (each takes one
  // PSN): at most the unsent ones, the window's room and 64.
  SendWqe *w = &qp.sq.at(qp.req.tx_pos);
  if (!w->small) return false;
  const uint32_t most =
      std::min({static_cast<uint32_t>(psn_diff(qp.req.next_psn, qp.req.tx_psn)), wnd - used, 64u});
  size_t cap = 0;
  uint8_t *const base = ring_slot(qp, &cap);
  if (!base) return false;
  SendWqe *const begin = qp.sq.slots.data(), *const end = begin + qp.sq.capacity();
  const uint32_t seg = w->pkt_len, dest = qp.attr.dest_qpn;
  // The slot's lines are the consumer's (it read them last time round):
  // all asked for at once, ahead of the writes, so that the stores do not
  // wait for them one by one.
  prefetch_lines<true>(base, std::min<size_t>(size_t(most) * seg, cap));
  uint8_t *p = base;
  uint32_t psn = qp.req.tx_psn, k = 0, total = seg;
  do {
    total = w->pkt_len;
    if (k && (total > seg || p + total > base + cap)) break;
    // The BTH (with AckReq), then RETH and ImmDt as
    // the opcode has them, the payload, pad and ICRC.
    wire::bth::put_words(p, w->bth0, wire::bth::word1(dest), wire::bth::word2(psn, true));
    uint8_t *const q = wire::put_request_ext(p, w->reth_immdt, w->wr.remote_va, w->wr.rkey, w->length, w->wr.imm_be);
    const uint32_t len = w->length;
    // (Its buffer unmapped: not sent, see Engine::source_faults.)
    if (len && !guard::copy(q, w->wr.sge[0].addr, len)) break;
    std::memset(q + len, 0, 4);                                // pad (at most 3 bytes),
    std::memset(p + total - wire::kIcrcLen, 0, wire::kIcrcLen);   // ICRC
    p += total;
    psn = psn_add(psn, 1);
    k++;
    if (++w == end) w = begin;
  } while (k < most && total == seg && w->small);   // (a shorter one ends the slot)
  ring_slot_done(static_cast<size_t>(p - base), seg, k);   // (none: an empty datagram, dropped)
  if (!k) return false;
  sent_run(qp, k);
  if (!qp.comp.ack_deadline) arm_retransmit(qp);
  return true;
}

// A slot of the ring of qp's peer to build packets in (net::LocalPeers::tx_begin),
// after what is built already (it leaves first); nullptr if there is none.
uint8_t *Engine::ring_slot(const Qp &qp, size_t *cap) {
  if (tx_nslots_) send_batch();
  return lp_->tx_begin(qp.attr.peer, qp.attr.sport, cap);
}

// The ring slot holds len bytes, packets of seg bytes (the last may be
// shorter), n of them: published (net::LocalPeers::tx_end) and counted.
void Engine::ring_slot_done(size_t len, size_t seg, uint32_t n) {
  count(Counter::tx_packets, n);
  count(Counter::tx_bytes, len);
  lp_->tx_end(len, seg);
}

// sent() for k one-packet WQEs from tx_psn on.
void Engine::sent_run(Qp &qp, uint32_t k) {
  const uint32_t from = qp.req.tx_psn, to = psn_add(from, k);
  const int32_t fresh = std::min<int32_t>(psn_diff(to, qp.req.tx_high), static_cast<int32_t>(k));
  if (fresh > 0) {
    time_round_trip(qp, psn_add(to, kPsnMask + 1 - static_cast<uint32_t>(fresh)));
    qp.req.tx_high = to;
  }
  if (static_cast<int32_t>(k) > fresh) count(Counter::retransmits, k - std::max(fresh, 0));
  qp.req.tx_psn = to;
  qp.req.tx_pos += k;
  skip_local(qp);
}

void Engine::build_request(Qp &qp, SendWqe &w, uint32_t psn, uint32_t next, bool ack_req) {
  uint32_t k = static_cast<uint32_t>(psn_diff(psn, w.first_psn));
  uint32_t off = k * qp.attr.pmtu;
  uint32_t len = std::min(qp.attr.pmtu, w.length - std::min(off, w.length));
  bool last = k + 1 == w.npkts;

  if (is_rd_atomic(w.wr.opcode) || w.placed) {
    wire::Headers h;
    h.bth.dest_qp = qp.attr.dest_qpn;
    h.bth.psn = psn;
    // A request without payload, answered on its own.
    h.bth.ack_req = true;
    if (w.placed) {
      // The data is there already: the notice takes the PSN (and the ACK).
      h.bth.opcode = static_cast<uint8_t>(Opcode::USRC_WRITE_PLACED);
      h.reth = {w.wr.remote_va, w.wr.rkey, w.length};
    } else {
      h.bth.opcode = request_opcode(qp, w, 0);
      // A READ asked for in pieces, or resent from a response gap, asks for
      // the bytes of PSNs [psn, next).
      uint32_t end = std::min<uint64_t>(uint64_t(psn_diff(next, w.first_psn)) * qp.attr.pmtu, w.length);
      h.reth = {w.wr.remote_va + off, w.wr.rkey, end - std::min(off, end)};
      h.xrc_srqn = w.wr.xrc_srqn;
      h.atomic = {w.wr.remote_va, w.wr.rkey,
                  w.wr.opcode == WrOpcode::atomic_cmp_swp ? w.wr.swap : w.wr.compare_add,
                  w.wr.compare_add};
    }
    TxSlot &s = tx_slot();
    tx_commit(qp, wire::build_headers(h, 0, s.hdr), 0, 0);
    return;
  }
  // SEND and WRITE packets, the per-packet path: the headers are written
  // as they go (no Headers struct to fill and read back). AckReq on the
  // last packet of a message, and every ack_every packets so that the
  // window keeps moving during long messages.
  const uint32_t every = tun_.ack_every;
  TxSlot &s = tx_slot();
  // (UC asks for no ACK.)
  uint8_t *p = wire::put_request(s.hdr, request_opcode(qp, w, k), last && (w.wr.flags & kSolicited), len,
                                 qp.attr.dest_qpn,
                                 qp.type == QpType::rc && (ack_req || last || (every && (psn % every) == 0)), psn,
                                 w.wr.remote_va, w.wr.rkey, w.length, w.wr.imm_be, w.wr.xrc_srqn);
  const size_t hl = static_cast<size_t>(p - s.hdr);
  if (len <= kTxCopy && k == 0 && w.wr.num_sge == 1) {
    // A small message in one buffer: copied behind the headers here (its
    // buffer unmapped: not sent, see Engine::source_faults).
    if (guard::copy(p, w.wr.sge[0].addr, len)) tx_commit(qp, hl, len, 0);
    return;
  }
  // Gather the payload straight from the registered buffers (no copy).
  size_t pieces = 0;
  for_each_piece(w.wr.sge, w.wr.num_sge, off, len, [&](uint8_t *p, uint32_t n) {
    s.iov[1 + pieces++] = {p, n};
    return true;
  });
  tx_commit(qp, hl, len, pieces);
}

// A sequence NAK for psn (= una), answered by resending that packet alone,
// if its WQE is a SEND or WRITE: a responder that keeps the packets after
// a gap (as ours does, Engine::hold) then has all it needs and
// acknowledges them together, and a lost packet costs one resend, not the
// window. One that drops them (IBA allows either) acknowledges that packet
// alone (sel_acked). A NAK that says how many are missing (wire::bth::hole:
// a segmented send lost whole) has that run resent, up to the first READ,
// ATOMIC or placed WRITE. A probe (check_timers) resends una the same way; from
// there a READ (the rest of its piece) or an ATOMIC also goes alone: a
// responder that has it already answers the duplicate from the request it
// saved (IBA 9.7.5.1.4; an ATOMIC's result, never executed twice), one
// that lost it takes it. False: go back N.
bool Engine::resend_one(Qp &qp, uint32_t psn, bool probe, uint32_t run) {
  if ((qp.state != QpState::rts && qp.state != QpState::sqd) || qp.comp.rnr_deadline)
    return false;   // (as requester_tx)
  if (qp.req.sel.skip && !probe) {
    qp.req.sel.skip--;
    return false;
  }
  if (!psn_lt(psn, qp.req.tx_psn)) return false;   // (not sent: sending it is a go-back)
  uint64_t pos = wqe_of(qp, psn);
  if (pos == qp.sq.tail) return false;
  const SendWqe &w = qp.sq.at(pos);
  const bool rd = is_rd_atomic(w.wr.opcode);
  if ((rd && !probe) || w.placed) return false;
  // [psn, end): a READ's piece, or a run of SEND and WRITE packets, sent
  // already (so in the WQEs up to tx_pos); the last asks for the ACK.
  const auto wqe_end = [&](uint64_t p) { return psn_add(qp.sq.at(p).first_psn, qp.sq.at(p).npkts); };
  uint32_t end = rd ? piece_end(w, psn) : psn_add(psn, 1);
  for (uint64_t p = pos; !rd && psn_diff(end, psn) < static_cast<int32_t>(run) && psn_lt(end, qp.req.tx_psn);
       end = psn_add(end, 1)) {
    while (!psn_lt(end, wqe_end(p))) p++;
    if (is_rd_atomic(qp.sq.at(p).wr.opcode) || qp.sq.at(p).placed) break;
  }
  for (uint32_t at = psn; at != end;) {
    while (!psn_lt(at, wqe_end(pos))) pos++;
    const uint32_t next = rd ? end : psn_add(at, 1);
    build_request(qp, qp.sq.at(pos), at, next, next == end);
    count(Counter::retransmits);
    at = next;
  }
  const uint32_t last = psn_add(end, kPsnMask);   // (a READ's piece may be more than one PSN)
  qp.comp.rtt_on = false;   // (Karn, as go_back_n)
  if (probe && qp.req.sel.on && qp.req.sel.psn == last) return true;   // (a resend of the NAK's resend)
  if (!probe) count(Counter::selective_resends);
  qp.req.sel.on = true;
  qp.req.sel.psn = last;
  qp.req.sel.probe = probe;
  return true;
}

// una moved past a packet resent alone (SelectiveResend::on). Taken with packets
// after it: the peer keeps them (SelectiveResend::peer_keeps; a probe's may only answer
// the first sending, and tells nothing). Taken alone, though more were
// sent after it: the next one is missing too, and the rest is resent from
// there, once, rather than one packet per round trip: a peer that keeps
// packets lost several in a row, or had no room for them; any other peer
// dropped them, and its next kSelSkip losses go back N at once.
// A probe's packet (or the retransmission timer's) taken alone may be the
// answer to its first sending, from a receiver that was only slow: one
// descheduled on a busy host takes what waited for it a few datagrams at
// a time, and the ACKs of the rest follow. So the rest goes back N only
// if no further ACK comes within the probe's time (back_wait,
// check_timers); going back at once resent hundreds of packets the
// receiver had (ib_send_bw 64 KB beside a CPU-bound process: 0.4% of
// those sent).
void Engine::sel_acked(Qp &qp) {
  constexpr uint8_t kSelSkip = 8;
  const int32_t past = psn_diff(qp.comp.una_psn, qp.req.sel.psn);
  if (past <= 0) return;
  qp.req.sel.on = false;
  if (past > 1) {
    qp.req.sel.peer_keeps |= !qp.req.sel.probe;
    return;
  }
  if (!psn_lt(qp.comp.una_psn, qp.req.tx_psn)) return;
  if (qp.req.sel.probe) {
    qp.req.sel.back_wait = true;   // (arm_retransmit times it, after this ACK)
    return;
  }
  if (!qp.req.sel.peer_keeps) qp.req.sel.skip = kSelSkip;
  sel_go_back(qp);
}

// The rest after a packet resent alone goes back N (sel_acked).
void Engine::sel_go_back(Qp &qp) {
  qp.req.sel.back_psn = qp.comp.una_psn;   // (a NAK for it may follow: see completer_rx)
  go_back_n(qp, qp.comp.una_psn);
}

// Whether the first retransmission-timer expiry can be a probe: una's
// packet resent alone (resend_one). Checked when the timer is armed.
bool Engine::probe_ok(const Qp &qp) const {
  if (qp.comp.probed || qp.req.sel.skip || qp.sq.empty()) return false;
  const SendWqe &w = qp.sq.front();
  return !is_rd_atomic(w.wr.opcode) && !w.placed;
}

// The SQ position of the WQE holding psn (sq.tail: none).
uint64_t Engine::wqe_of(Qp &qp, uint32_t psn) {
  uint64_t pos = qp.sq.head;
  while (pos != qp.sq.tail && !psn_lt(psn, psn_add(qp.sq.at(pos).first_psn, qp.sq.at(pos).npkts))) pos++;
  return pos;
}

// Go-back-N (IBA 9.7.4.1.4): resend from psn, which lies in [una, next).
void Engine::go_back_n(Qp &qp, uint32_t psn) {
  qp.req.tx_psn = psn;
  qp.comp.rtt_on = false;   // an ACK from now on may answer a resend (Karn)
  qp.req.tx_pos = wqe_of(qp, psn);
}

}  // namespace usrc::rc
