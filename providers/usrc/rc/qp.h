// One RC QP's transport state, split the way the IBA describes the RC
// protocol (and the kernel's rxe splits its code): the requester turns send
// WQEs into request packets, the completer consumes ACKs/NAKs and retires
// WQEs, the responder executes incoming requests and acknowledges them.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "usrc/net/nic.h"
#include "usrc/rc/buffer.h"
#include "usrc/rc/cq.h"
#include "usrc/rc/psn.h"
#include "usrc/rc/types.h"

namespace usrc::rc {

struct SendWqe {
  SendWr wr;
  uint32_t length = 0;        // total payload bytes
  uint32_t first_psn = 0;     // assigned at post time (IBA 9.7.1.2)
  uint32_t npkts = 0;
  // READs and ATOMICs posted on this QP before this WQE (ReqState::rd_posted at
  // post time): the difference of two gives those between them in O(1).
  uint32_t rd_before = 0;
  // Its message sequence number (ReqState::ssn when posted), for the
  // end-to-end credits (ReqState::lsn).
  uint32_t ssn = 0;
  // A READ asked for in pieces: the response packets each READ request
  // asks for (0: not sent yet). Fixed at the first piece, so that a piece
  // resent from a gap asks for part of one piece the responder saw, which
  // is what a responder checks a duplicate READ against (IBA 9.7.5.1.4;
  // rxe drops one that spans two).
  uint32_t rd_piece = 0;
  // An RDMA WRITE placed in the peer's memory at post time and completed
  // then: one PSN, sent as a notice (USRC_WRITE_PLACED) without payload.
  bool placed = false;
  // A READ's or ATOMIC's local SGE lost its MR (Engine::invalidate_lkey):
  // its result is not written; the WQE fails with a local protection error.
  bool bad = false;
  // Posted by Engine::post_small: one packet built in place (send_direct)
  // from what post time worked out: the BTH's first word (opcode, SE, pad,
  // P_Key), which of RETH and ImmDt its opcode has (wire::HAS_RETH,
  // wire::HAS_IMMDT) and its length.
  bool small = false;
  uint8_t reth_immdt = 0;
  uint16_t pkt_len = 0;
  uint32_t bth0 = 0;
  uint8_t inline_data[kMaxInline];
};

struct RecvWqe {
  RecvWr wr;
  uint32_t length = 0;
  // An SGE failed its lkey check at post time, or its MR was deregistered
  // or re-registered since (Engine::invalidate_lkey): the WQE fails when
  // used, and nothing is written through it.
  bool bad = false;
};

// A fixed-capacity FIFO with monotonically increasing positions. The slots
// of the head and the tail are kept as indices (the datapath's common
// case); any other position's slot is found by multiplying with the
// capacity's reciprocal, not by a division (a 64-bit divide was a visible
// part of a small message's cost).
template <class T>
struct Ring {
  Buffer<T> slots;               // (from a source, if init is given one: buffer.h)
  uint64_t head = 0, tail = 0;   // positions: move them with pop() and push() only
  void init(uint32_t n, BufferSource *src = nullptr, BufferKind kind = BufferKind::none) {
    adopt(Buffer<T>(n, src, kind));
  }
  // Empty, with these n slots (n >= 1) for its storage; the old storage is
  // left in b, for the caller to free.
  void adopt(Buffer<T> &&b) { adopt(b); }
  void adopt(Buffer<T> &b) {
    slots.swap(b);
    cap = static_cast<uint32_t>(slots.size());
    inv = UINT64_MAX / cap;
    clear();
  }
  void clear() { head = tail = 0, hi = ti = 0; }
  uint32_t capacity() const { return cap; }
  bool full() const { return tail - head >= cap; }
  bool empty() const { return head == tail; }
  T &front() { return slots[hi]; }   // at(head)
  const T &front() const { return slots[hi]; }
  T &back() { return slots[ti]; }    // at(tail): the next slot to fill
  void pop() { head++, hi = hi + 1 == cap ? 0 : hi + 1; }
  void push() { tail++, ti = ti + 1 == cap ? 0 : ti + 1; }
  void pop(uint32_t n) {   // n <= tail - head
    head += n, hi += n;
    if (hi >= cap) hi -= cap;
  }
  T *begin_slots() { return slots.data(); }
  T *end_slots() { return slots.data() + cap; }
  T &at(uint64_t pos) {
    // The quotient estimate is low by at most one: one correction.
    uint64_t r = pos - static_cast<uint64_t>((static_cast<unsigned __int128>(pos) * inv) >> 64) * cap;
    if (r >= cap) r -= cap;
    return slots[r];
  }

 private:
  uint64_t inv = 0;   // floor((2^64 - 1) / capacity)
  uint32_t cap = 0;   // slots.size(), kept (size() divides by sizeof(T))
  uint32_t hi = 0, ti = 0;   // the slots of head and tail
};

// A receive queue: a QP's own, or a shared one (SRQ) that QPs of the
// context take from. A SEND message takes its WQE off the queue at its
// first packet (RespState::cur): a shared queue's head is no one QP's.
// An XRC SRQ's side of a message in progress that another process's
// target forwards (Engine::xrc_deliver).
struct XrcInbound {
  RecvWqe cur{};               // the WQE its first packet took
  uint32_t off = 0;            // bytes placed so far
  bool active = false;         // a message is in progress
  bool discard = false;        // it failed: the rest of it is dropped
};

struct TagList;
struct RecvQueue : Ring<RecvWqe> {
  void *user = nullptr;   // the verbs SRQ (a shared queue's owner)
  TagList *tm = nullptr;  // a tag matching SRQ's list (tm.h)
  // An XRC SRQ's messages in progress from other processes' targets, by
  // the target's QPN.
  std::unordered_map<uint32_t, XrcInbound> inbound;
  // SRQ limit (IBA 10.2.9.3): fewer WQEs than this left raise
  // IBV_EVENT_SRQ_LIMIT_REACHED once; 0: disarmed.
  uint32_t limit = 0;
  uint32_t size() const { return static_cast<uint32_t>(tail - head); }
};

// What modify_qp sets (the QP context, IBA 11.2.4.2): the verbs glue
// checks it and hands it over whole (Engine::modify); the engines only
// read it.
struct QpAttrs {
  uint32_t dest_qpn = 0;
  uint32_t qkey = 0;          // UD: the Q_Key datagrams to this QP must carry
  net::Endpoint peer;
  uint16_t dlid = 0;
  // The path on the wire (design: "QP context on the wire"): IP TOS byte
  // (from the traffic class, or the SL on InfiniBand link layer), IP TTL
  // (hop limit; 0 = the system default), UDP source port (from the flow
  // label; 0 = the context's own port).
  uint8_t tos = 0, ttl = 0;
  uint16_t sport = 0;
  // Packet pacing (static rate / IBV_QP_RATE_LIMIT): bits per second, 0 =
  // unpaced.
  uint64_t rate_bps = 0;
  uint32_t pmtu = 1024;       // bytes
  uint32_t access = 0;        // IBV_ACCESS_REMOTE_* allowed to the peer
  uint8_t timeout = 14;       // Local ACK Timeout exponent
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;      // 7 = retry forever
  uint8_t min_rnr_timer = 0;  // the RNR NAK timer code we send
  uint8_t max_rd_atomic = 1;  // READ/ATOMIC requests in flight (initiator depth)
  uint8_t max_dest_rd_atomic = kMaxRdAtomic;  // responder resources (0: none)
  // SQD (IBA 10.3.1.4): raise IBV_EVENT_SQ_DRAINED once the send queue has
  // drained, if asked for (en_sqd_async_notify) on entering SQD.
  bool sqd_notify = false;
};

// Selective resend (Engine::resend_one): a sequence NAK's PSN (or, for a
// probe, una) alone was resent (on, psn), as a peer that keeps what
// follows a gap needs nothing else; peer_keeps: it did so before; the next
// skip losses go back N (a peer that did not keep them, Engine::sel_acked);
// back_wait: a probe's packet was taken alone, and the rest goes back N
// unless more ACKs come before the timer.
struct SelectiveResend {
  uint32_t psn = 0;
  bool on = false, probe = false, peer_keeps = false, back_wait = false;
  uint32_t back_psn = 0xffffffff;   // where sel_acked last went back N
  uint8_t skip = 0;
};

// The requester's state (requester.cpp): send WQEs into request packets.
struct ReqState {
  uint32_t next_psn = 0;      // first PSN of the next posted WQE (sq_psn)
  uint64_t tx_pos = 0;        // SQ position of the WQE holding tx_psn
  uint32_t rd_posted = 0;     // READs and ATOMICs ever posted (wraps)
  uint32_t tx_psn = 0;        // next PSN to put on the wire
  uint32_t tx_high = 0;       // one past the highest PSN ever sent
  uint64_t pace_next = 0;     // pacing: the earliest time the next packet may leave
  uint32_t window = 64;       // max packets in flight
  // Loss response (not in the IBA, which leaves flow control to the
  // fabric): go-back-N resends everything after a lost packet, so the
  // packets in flight are limited to cwnd <= window, halved on each loss
  // (sequence NAK, implied NAK, a first retransmission-timer expiry) down
  // to kLossWindow (half the window if less), cut to kMinWindow on a timeout, grown by
  // one per acknowledged packet up to ssthresh and by one per window above.
  uint32_t cwnd = 64, ssthresh = 64, cwnd_acc = 0;
  uint32_t send_window() const { return cwnd < window ? cwnd : window; }
  SelectiveResend sel;
  // End-to-end flow control (IBA 9.7.7.2): ssn, the messages posted
  // (24 bits, as the responder's MSN); lsn, the last one that may take a
  // receive WQE, the highest MSN plus credit count an ACK gave (limited:
  // the last ACK gave one).
  uint32_t ssn = 0, lsn = 0;
  bool limited = false;
  // Whether the message numbered ssn may take a receive WQE now.
  bool within_credits(uint32_t ssn_of) const { return !limited || !psn_lt(lsn, ssn_of); }
};

// The completer's state (completer.cpp): ACKs and NAKs in, WQEs retired,
// timers and retries.
struct CompState {
  uint32_t una_psn = 0;       // oldest unacknowledged PSN
  uint8_t retry_left = 7;
  uint8_t rnr_left = 7;
  uint64_t ack_deadline = 0;  // Local ACK Timeout; 0 = disarmed
  // Adaptive retransmission: a lost packet that no later packet reveals (a
  // tail loss, a lost ACK or NAK, a lost resend) is resent after the
  // retransmission timeout, srtt + 4 rttvar from the measured round trip
  // (at least kMinRtoNs, doubled on each expiry), when that is sooner than
  // the Local ACK Timeout. It does not count against retry_cnt: only the
  // Local ACK Timeout does (IBA 9.7.6.1.3).
  uint64_t rto_deadline = 0;
  uint64_t srtt = 0, rttvar = 0;   // ns; srtt 0: no sample yet
  uint64_t rtt_sent = 0;           // when rtt_psn left
  uint32_t rtt_psn = 0;
  bool rtt_on = false;             // a round trip is being timed
  uint8_t rto_backoff = 0;
  uint64_t rto_ns() const {
    return (srtt + 4 * rttvar > kMinRtoNs ? srtt + 4 * rttvar : kMinRtoNs) << rto_backoff;
  }
  // The probe (Engine::check_timers): the first expiry after progress
  // comes after kMinProbeNs or 2 srtt and resends the oldest packet alone
  // (probe_armed: the timer is set for it; probed: it was made).
  bool probed = false, probe_armed = false;
  uint64_t rnr_deadline = 0;  // requester paused until then after an RNR NAK
  uint32_t rnr_lsn = 0;       // ... when ReqState::lsn was this (Engine::rnr_credits)
  bool rnr_limited = false;   // ... and ReqState::limited
  uint32_t implied_nak_psn = 0xffffffff;  // una when we last resent after a response gap
  bool sqd_drained = false;   // IBV_EVENT_SQ_DRAINED raised: once per entry into SQD
};

// What the responder learnt of the message in progress on a TM SRQ (tm.h)
// from its first packet (RespState::tm; kind none: not a tag matching one).
struct TmRecv {
  enum class Kind : uint8_t {
    none,
    eager,        // matched: the payload less its TMH into the tag's buffer (RespState::cur)
    rndv,         // matched rendezvous: the data READ from the sender, then a FIN
    rndv_sw,      // matched rendezvous this side does not fetch: the request into the
                  //   buffer, completed IBV_WC_TM_RNDV_INCOMPLETE (the application reads)
    unexpected,   // no match: into an SRQ WQE, TMH and all
    no_tag,       // TMH opcode NO_TAG: the same, not counted as unexpected
  };
  Kind kind = Kind::none;
  uint32_t priv = 0;   // the TMH's app context (host order)
  uint64_t tag = 0;
  uint64_t va = 0;     // rndv: the RVH
  uint32_t rkey = 0, len = 0;
};

// The responder's state (responder.cpp): requests in, executed, ACKed.
struct RespState {
  uint32_t epsn = 0;          // expected PSN (rq_psn)
  uint32_t msn = 0;
  uint32_t told_lsn = kNotTold;   // the MSN plus credit count of our last ACK
  static constexpr uint32_t kNotTold = ~0u;   // (no ACK gave one: an MSN has 24 bits)
  bool in_msg = false;        // a multi-packet message is being received
  bool in_send = false;       //   ... and it is a SEND (else a WRITE)
  bool nak_sent = false;      // a sequence NAK for epsn was sent: wait (IBA 9.7.5.2.3, NAK once)
  bool rnr_sent = false;      // an RNR NAK was sent: the next receive posted is told (post_recv_slot)
  uint16_t held = 0;          // requests beyond epsn kept (Engine::hold)
  bool hold_missed = false;   // ... and some not (no room): NAK after the drain
  bool ack_pending = false;   // coalesced ACK to send at the end of the pass
  bool comm_est = false;      // first request seen (IBV_EVENT_COMM_EST)
  uint64_t tail_at_hold = ~0ull;  // sq.tail when Engine::replies() last looked (~0: never)
  uint64_t again_at = 0;      // when to send the last ACK again (Engine::ack_again; 0: not)
  uint32_t again_epsn = 0;    // ... while epsn is still this
  uint8_t agains = 0;         // ... and how many times it was
  uint32_t recv_offset = 0;
  // The receive WQE of the SEND message being received (has_cur), taken
  // off the receive queue at its first packet.
  RecvWqe cur;
  bool has_cur = false;
  // Executed ATOMICs, kept to answer duplicates: a duplicate ATOMIC returns
  // the saved result and is never executed again (IBA 9.7.5.2.2).
  struct AtomicRes {
    bool valid = false;
    uint32_t psn = 0;
    uint64_t orig = 0;
  };
  AtomicRes res[kMaxRdAtomic];
  uint32_t res_next = 0;
  // The RDMA WRITE being received: where its next byte goes, through
  // which rkey (resolved again for every packet: an MR deregistered in the
  // middle of the message takes no more of it).
  uint64_t write_va = 0;
  uint32_t write_rkey = 0;
  uint32_t write_left = 0;
  uint32_t write_len = 0;
  TmRecv tm;
};

// The same-host path's state: the short cuts a peer on this host allows.
struct LocalPath {
  // The peer is on this host (net::Nic::same_host): packets to it carry no
  // ICRC unless USRC_ICRC_LOCAL is set.
  bool same_host = false;
  // ... and packets to it are built in place in its shared-memory ring
  // (net::LocalPeers::tx_begin), without an ICRC: set on entering RTR or RTS.
  bool in_place = false;
  // The unsent WQEs from PSN small_tail on are small ones that
  // Engine::post_small left to be built in place with the next ones
  // (small_run: the last post was one of those).
  uint32_t small_tail = 0;
  bool small_run = false;
  uint32_t placed = 0;         // placed WQEs in the SQ (completed, not yet ACKed)
  bool gate_open = false;      // peers on this host may place into our memory
  uint32_t polls_at_post = ~0u;   // Engine::polls at the last post_send
};

// The transport service (IBA 9.8.2): reliable connected; unreliable
// connected, the same requester whose packets count as acknowledged once
// sent and a responder that drops what it cannot take (datagram.cpp); or
// unreliable datagram (datagram.cpp), which sends each WR as one packet to
// the WR's address and takes datagrams from anyone that has the QP's Q_Key.
enum class QpType : uint8_t { rc, uc, ud };

// XRC (IBA 9.8.2.5, 11.5): an initiator (XRC_SEND) is RC's requester and
// completer whose requests carry the XRCETH, the target's SRQ that each WR
// names; a target (XRC_RECV) is RC's responder with no queues of its own:
// each request names an SRQ of its XRC domain (Engine::xrc_target), whose
// receive WQEs, CQ and PD it then uses.
enum class XrcRole : uint8_t { none, ini, tgt };

// An XRC SRQ as targets find it by its number (Engine::add_xrc_srq).
struct XrcSrq {
  struct RecvQueue *q = nullptr;
  Cq *cq = nullptr;
  const void *pd = nullptr;
  const void *xrcd = nullptr;   // its XRC domain
};

// A SEND packet an XRC target took for an SRQ of its domain that another
// context owns (another process, on this host): what that context needs
// to place it and complete the receive as the target would have
// (EngineHooks::xrc_forward, Engine::xrc_deliver). abort: the target
// abandoned the message in progress (it left RTR/RTS, or went): its WQE
// completes flushed.
struct XrcForward {
  uint32_t srqn = 0, qpn = 0, src_qp = 0;   // the SRQ, the target, its peer
  uint16_t slid = 0;
  bool first = false, last = false, imm = false, solicited = false, abort = false;
  uint32_t imm_be = 0;
  const uint8_t *data = nullptr;
  uint32_t len = 0;
};

struct Qp {
  Qp() = default;
  Qp(const Qp &) = delete;     // (rq may point into it)
  Qp &operator=(const Qp &) = delete;
  uint32_t qpn = 0;
  QpType type = QpType::rc;
  XrcRole xrc = XrcRole::none;
  const void *xrcd = nullptr;  // a target's XRC domain
  uint32_t xrc_srqn = 0;       // a target's: the SRQ rq points into, if not own_rq
  // A target's: xrc_srqn is no SRQ of this context; its SENDs are handed
  // to the SRQ's owner (EngineHooks::xrc_forward).
  bool xrc_remote = false;
  QpState state = QpState::reset;
  bool sq_sig_all = false;
  Cq *send_cq = nullptr, *recv_cq = nullptr;
  const void *pd = nullptr;   // protection domain (compared with MR's)
  void *user = nullptr;       // owner's back pointer (the verbs QP)
  // Destroyed by the application but kept a little while to re-ACK
  // duplicates: the peer may not have our last ACK yet, and without it it
  // would retry until "retry exceeded" (the end of every pingpong).
  uint64_t linger_until = 0;  // 0: a live QP

  QpAttrs attr;
  // The peer takes our packets without an ICRC: one of its packets said so
  // (wire::bth::kIcrcOptional) and our NIC checksums what it sends
  // (Engine::icrc_optional_). Cleared when the peer changes.
  bool peer_icrc_optional = false;
  // ... and strips fill behind them (wire::bth::kTakesFill; set only with
  // peer_icrc_optional).
  bool peer_takes_fill = false;

  Ring<SendWqe> sq;            // sq_cap + kPlacedSlack slots
  RecvQueue own_rq;            // (unused on an SRQ)
  RecvQueue *rq = &own_rq;     // the receive queue: own_rq or an SRQ's
  bool on_srq() const { return rq != &own_rq; }
  uint32_t sq_cap = 1;         // WQEs the application may have outstanding
  // The engine's own WQEs in sq (kTmInternal: a rendezvous's READ and
  // FIN), in kTmWqes slots beyond the application's.
  uint32_t tm_wqes = 0;
  // Room for this many more send WRs (placed and internal ones do not count).
  uint32_t send_room() const {
    const uint64_t busy = sq.tail - sq.head - local.placed - tm_wqes;
    return busy >= sq_cap ? 0 : sq_cap - static_cast<uint32_t>(busy);
  }

  ReqState req;
  CompState comp;
  RespState resp;
  LocalPath local;
};

// A QP's two arrays, made before it (Engine::create_qp takes them; made
// outside the engine's lock, where an application's allocator may be
// called) and, those that came from a source, handed back when it is
// destroyed (Engine::destroy_qp), to be freed outside the lock too.
struct QpStorage {
  Buffer<SendWqe> sq;
  Buffer<RecvWqe> rq;
  QpStorage() = default;
  // For max_send_wr and max_recv_wr WQEs (0 counts as 1), and extra send
  // WQEs of the engine's own (Qp::tm_wqes).
  QpStorage(uint32_t max_send_wr, uint32_t max_recv_wr, BufferSource *src, uint32_t extra_send = 0)
      : sq((max_send_wr ? max_send_wr : 1) + kPlacedSlack + extra_send, src, BufferKind::send_queue),
        rq(max_recv_wr ? max_recv_wr : 1, src, BufferKind::recv_queue) {}
};

}  // namespace usrc::rc
