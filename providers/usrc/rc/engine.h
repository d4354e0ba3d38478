// The RC transport engine of one context: its QPs, its NIC, its timers.
// Everything is driven by calls that hold `mu`: post_send/post_recv from the
// application, progress() from whichever thread polls (the application in
// poll_cq, or the progress thread). There is no allocation on the per-packet
// path: packets are built into a fixed transmit batch and sent with one
// NIC call.
#pragma once

#include <array>
#include <cerrno>
#include <atomic>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "usrc/common/guard.h"
#include "usrc/common/lock.h"
#include "usrc/common/tunables.h"
#include "usrc/device.h"
#include "usrc/net/nic.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"
#include "usrc/rc/qp.h"
#include "usrc/rc/tm.h"
#include "usrc/rc/wr_opcode.h"

namespace usrc::rc {

// Remote memory as the responder sees it; the verbs glue implements it with
// its MR table (rkey, PD, bounds, access flags), memory windows included
// (a type 2 window serves the QP it is bound to only).
struct MemoryAccess {
  virtual uint8_t *resolve(const void *pd, uint32_t qpn, uint32_t rkey, uint64_t va, uint64_t len,
                           uint32_t access) = 0;
  // A SEND_WITH_INV's R_Key: a type 2 window of pd bound to qpn is
  // invalidated (false: there is none such).
  virtual bool invalidate(const void *pd, uint32_t qpn, uint32_t rkey) = 0;
 protected:
  ~MemoryAccess() = default;
};

// Events the owner delivers as verbs async events.
// last_wqe: a QP on an SRQ entered the Error state: it takes no more of
// the SRQ's WQEs (IBA 11.6.3.1, Last WQE Reached).
enum class QpEvent { comm_est, fatal, req_err, access_err, sq_drained, last_wqe };
struct EngineHooks {
  virtual void qp_event(Qp &, QpEvent) = 0;
  // An SRQ's limit was reached (RecvQueue::limit); it is disarmed.
  virtual void srq_event(RecvQueue &) = 0;
  // An XRC target's SEND packet for an SRQ of its domain (xrcd) that is
  // not this context's, handed to the SRQ's owner: 0 (handed over),
  // EAGAIN (the owner cannot take it now: RNR) or another errno (no such
  // SRQ: an invalid request).
  virtual int xrc_forward(const void * /*xrcd*/, const XrcForward &) { return ENOENT; }
 protected:
  ~EngineHooks() = default;
};

// Copies len bytes from src into a scatter/gather list at offset off (a
// receive WQE's buffers, a READ's); false if one of them is no longer
// mapped (guard.h).
bool scatter(const Sge *sge, uint32_t num_sge, uint32_t off, const uint8_t *src, uint32_t len);

constexpr uint32_t kAccessRemoteWrite = 2, kAccessRemoteRead = 4, kAccessRemoteAtomic = 8;

class Engine {
 public:
  using Clock = std::function<uint64_t()>;
  Engine(std::unique_ptr<net::Nic> nic, uint32_t slot, uint16_t base_port, Clock clock,
         MemoryAccess *mem, EngineHooks *hooks);
  ~Engine();

  Lock mu;

  // --- everything below requires mu ---
  // A WR that failed local checks at post time: it completes with st and
  // the QP goes to the Error state (IBA 10.8.3.1, local errors).
  void post_error(Qp &qp, uint64_t wr_id, WcOpcode op, WcStatus st, bool recv);
  // nullptr: no QPN left. st: the QP's arrays, made for these depths
  // (taken from it; without it they come from the heap).
  Qp *create_qp(uint32_t max_send_wr, uint32_t max_recv_wr, QpStorage *st = nullptr);
  // give_back: the arrays that came from a source are moved there (a QP
  // that lingers keeps an empty heap slot of each instead).
  void destroy_qp(Qp *qp, QpStorage *give_back = nullptr);
  // True while destroyed QPs still linger (see Qp::linger_until).
  bool lingering() const { return lingering_ != 0; }
  Qp *find_qp(uint32_t qpn);
  // XRC SRQs by number (XrcSrq), for the targets' requests.
  void add_xrc_srq(uint32_t srqn, const XrcSrq &s) { xrc_srqs_[srqn] = s; }
  void remove_xrc_srq(uint32_t srqn);
  bool has_xrc_srq(uint32_t srqn) const { return xrc_srqs_.contains(srqn); }
  const XrcSrq *find_xrc_srq(uint32_t srqn) const {
    auto it = xrc_srqs_.find(srqn);
    return it == xrc_srqs_.end() ? nullptr : &it->second;
  }
  // A packet another context's target forwarded (xrc_forward) into the
  // XRC SRQ s, whose state for that target is in (in s.q->inbound, which
  // invalidate_lkey looks at too): false if it must wait
  // (a message's first packet, and no WQE posted); else taken (placed and,
  // at its last packet, completed on the SRQ's CQ; or failed, its WQE
  // completed with the error).
  bool xrc_deliver(const XrcSrq &s, XrcInbound &in, const XrcForward &f);
  // The one source check of every packet a QP takes, on every receive path
  // (handle_packet, fast_ack, fast_sends): from the peer's address and its
  // UDP port (base port + the slot of its QPN), or, where the QP's path
  // carries a RoCE v2 flow label, the source port that label gives
  // (0xC000 | label & 0x3FFF: the peer's path carries the same label, and
  // its packets leave from that port; from its own port where that one
  // could not be bound, see UdpNic::source_fd).
  // (A peer on another host sends to the RoCE v2 port from a port of its
  // choosing: RoCE v2's source port is flow entropy, IBA A17.3.2.)
  bool from_peer(const Qp &qp, net::Endpoint src) const {
    const QpAttrs &a = qp.attr;
    return src.ip == a.peer.ip && (src.port == a.peer.port || (a.sport && src.port == a.sport) ||
                                   (roce_port && a.peer.port == roce_port && !qp.local.same_host));
  }
  // One modify_qp, as the verbs glue (or a test) hands it over once it has
  // checked it (the attributes' values and the state transition, IBA
  // 10.3.1, are the glue's): the QP's attributes after the change, the
  // PSNs it sets, the state it moves to.
  struct QpChange {
    QpAttrs attr;
    bool new_peer = false;   // attr.peer given (AV or destination QPN): look its path up
    bool set_rq_psn = false, set_sq_psn = false;
    uint32_t rq_psn = 0, sq_psn = 0;
    QpState state = QpState::reset;
  };
  void modify(Qp &qp, const QpChange &c);
  // Moves the QP to a new state with the IBA side effects (flush on ERR,
  // clear on RESET, PSNs loaded on RTR/RTS). Attribute checks are the glue's.
  void set_state(Qp &qp, QpState s);

  int post_send(Qp &qp, const SendWr &wr);   // 0 or an errno
  // The same in two steps, without a copy of the WR: the slot the next
  // send WR goes into (nullptr: the send queue is full), then, once the
  // caller has filled it with a WR that passed post_send's checks, the post.
  SendWr *send_slot(Qp &qp) { return qp.send_room() ? &qp.sq.back().wr : nullptr; }
  void post_slot(Qp &qp, uint64_t len);
  void start_wqe(Qp &qp, SendWqe &w, uint32_t len, uint32_t npkts, bool placed);
  // The same for a local operation (a WR_LOCAL opcode: BIND_MW, LOCAL_INV)
  // whose effect the glue made as it posted it: a WQE of no packets that
  // completes in send queue order, once every WQE before it has.
  void post_local(Qp &qp);
  // The small message's way (post_small): whether a WQE of len bytes
  // posted now is built in place, behind what is still unsent, as far as
  // the QP decides it (in place, RTS, no RNR wait, no pacing, a size of one
  // packet of at most kTxCopy bytes); small_wr() adds the WR's part. The
  // glue's short cut for a lone small SEND (post_small_send in qp.cpp)
  // fills the slot itself and calls post_small() when this holds.
  bool small_ready(const Qp &qp, uint64_t len) const {
    return qp.local.in_place && len <= kTxCopy && len <= qp.attr.pmtu && qp.state == QpState::rts &&
           !qp.comp.rnr_deadline && !qp.attr.rate_bps &&
           qp.req.within_credits(msn_add(qp.req.ssn, 1)) &&   // (the next message)
           (qp.req.tx_psn == qp.req.next_psn ||
            (qp.local.small_run && psn_diff(qp.req.tx_psn, qp.local.small_tail) >= 0));
  }
  void post_small(Qp &qp, SendWqe &w, uint32_t len);
  // UD (datagram.cpp): where one datagram goes, from its address handle
  // (the path) and its WR (QPN, Q_Key).
  struct UdDest {
    net::Endpoint peer;       // the AH's address; the port from the QPN's slot
    uint8_t tos = 0, ttl = 0;
    uint16_t sport = 0;       // from the AH's flow label (0: the context's port)
    bool same_host = false;
    uint32_t qpn = 0, qkey = 0;
  };
  // Sends the WR (a SEND of len bytes, at most one packet) as one datagram
  // now, and completes it: a UD WR is done once sent.
  void post_datagram(Qp &qp, const SendWr &wr, uint32_t len, const UdDest &d);
  // The RoCE link layer: a UD receive's first 40 bytes (the GRH area) hold
  // the datagram's IPv4 header, as RoCE v2 puts it (IBV_WC_GRH); on the
  // InfiniBand link layer there is no GRH and the source is the SLID.
  bool ud_grh_ipv4 = false;
  // The RoCE v2 port this context also receives at (net/roce_port.h), 0
  // if none: datagrams there for another process's slot are handed on.
  uint16_t roce_port = 0;
  // A port with a subnet administrator (docs/sa.md): the LIDs of the
  // registered ports by address, read once when the context opens (never
  // changed after), for a UD completion's SLID; an address not in it has
  // SLID 0. Null: LIDs are the low bits of the address (lid_for).
  std::shared_ptr<const std::unordered_map<uint32_t, uint16_t>> sa_lids;
  uint16_t slid_of(uint32_t ip) const {
    if (!sa_lids) return lid_for(ip);
    auto it = sa_lids->find(ip);
    return it == sa_lids->end() ? 0 : it->second;
  }
  static constexpr uint32_t kGrhLen = 40;
  int post_recv(Qp &qp, const RecvWr &wr);
  // As send_slot/post_slot, into a QP's own receive queue (not in RESET)
  // or a shared one (an SRQ).
  static RecvWr *recv_slot(RecvQueue &q) { return q.full() ? nullptr : &q.back().wr; }
  RecvWr *recv_slot(Qp &qp) { return recv_slot(*qp.rq); }
  // bad: an SGE failed its checks (RecvWqe::bad).
  static void post_recv_slot(RecvQueue &q, uint64_t len, bool bad = false) {   // (inline: every receive of a stream takes it)
    RecvWqe &r = q.back();
    r.length = static_cast<uint32_t>(std::min<uint64_t>(len, kMaxMsgSize));
    r.bad = bad;
    q.push();
  }
  void post_recv_slot(Qp &qp, uint64_t len, bool bad = false) {
    post_recv_slot(*qp.rq, len, bad);
    if (qp.state == QpState::err) flush_queues(qp);
    if ((credits_behind(qp) || qp.resp.rnr_sent) && receives(qp.state)) {
      qp.resp.rnr_sent = false;
      schedule_ack(qp);
    }
  }
  // A requester that waits for credits (ack_syndrome) learns of new
  // receives from a duplicate ACK (IBA 9.7.7.2) when it was told of fewer
  // than half of those posted now, not from the RNR NAK its next SEND
  // would get; one that got an RNR NAK, of the first one posted after it
  // (its wait ends there, Engine::rnr_credits).
  static bool credits_behind(const Qp &qp) {
    return qp.resp.told_lsn != RespState::kNotTold &&
           2 * static_cast<uint32_t>(std::max(psn_diff(qp.resp.told_lsn, qp.resp.msn), 0)) < qp.rq->size();
  }
  // A QP takes its receives from the SRQ q from now (created on it), or
  // from its own queue again (q nullptr: destroyed, it takes none).
  void use_srq(Qp &qp, RecvQueue *q) { qp.rq = q ? q : &qp.own_rq; }
  // Moves a shared receive queue's WQEs into slots (at least as many as
  // it holds), which it keeps; slots gets its old array (for the caller to
  // free outside the lock).
  static void resize(RecvQueue &q, Buffer<RecvWqe> &slots);
  // The SRQs of the context (invalidate_lkey walks them).
  void add_srq(RecvQueue *q) { srqs_.push_back(q); }
  void remove_srq(RecvQueue *q) { std::erase(srqs_, q); }
  // The MR of key was deregistered or re-registered: the posted WQEs that
  // write through it (receives; READ and ATOMIC results) must not write
  // where it mapped before. They are marked bad (RecvWqe::bad,
  // SendWqe::bad): such a WQE completes with a local protection error when
  // used, as an lkey checked then would.
  void invalidate_lkey(uint32_t key);

  // Who runs a progress pass, and so what it does with its ACKs.
  enum class Poller : uint8_t {
    thread,   // the progress thread: up to four batches; ACKs sent
    // The application's poll, which is about to return the completions
    // this pass made and will call in again: one batch; if all the pass
    // has to send is ACKs, they wait for the reply (the next post_send;
    // later such passes keep them for kAckHoldNs), so that a reply posted
    // at once leaves with them in one system call.
    app,
    // The progress thread, for packets a polling application left to it
    // (a passive target spinning on its memory): up to four batches; ACKs
    // as app's (the thread then gives the application a moment to reply).
    handed,
  };
  // Receive and execute a bounded batch, fire expired timers, transmit.
  // now: the caller's clock reading, if it has one (0: read it here).
  // direct: a poller's array this pass may write receive completions
  // into (DirectWc); its n is set to how many it wrote.
  // Returns how many packets it received; wire_received() how many of
  // those came off the NIC itself (not a same-host peer's ring).
  struct DirectWc;
  size_t progress(Poller who = Poller::thread, uint64_t now = 0, DirectWc *direct = nullptr);
  size_t wire_received() const { return wire_received_; }
  // Held ACKs wait this long at most for a reply while the application
  // polls on (its passes keep them): a request and the ACK that a peer's
  // post sent with it may arrive in two passes, and an ACK sent alone
  // after the first leaves the peer spinning on its memory when our reply
  // comes (ib_write_lat), for its progress thread to take.
  static constexpr uint64_t kAckHoldNs = 10'000;
  // A pass for the application (Poller::app, handed) may hold its ACKs for
  // its reply: whether they are held, and sending them now.
  bool acks_held() const { return acks_held_; }
  void flush_acks() {
    if (acks_held_) tx_flush();
  }
  // A poller's array that progress() may write the receive completions of
  // one CQ into, straight, instead of that CQ's ring (a poll that found
  // the ring empty: the completion is then written once, not pushed,
  // taken and converted). Used only while that CQ is idle() (nothing older
  // in its ring, no arm): the poller returns these first, then what the
  // ring took after them. n counts what was written.
  struct DirectWc {
    const Cq *cq = nullptr;
    Wc *wc = nullptr;
    uint32_t room = 0, n = 0;
  };
  // Absolute time (clock units, ns) of the next timer, or UINT64_MAX. The
  // one read that needs no lock: kick() makes it after releasing the lock,
  // while another thread may hold it.
  uint64_t next_deadline() const { return next_deadline_.load(std::memory_order_relaxed); }
  net::Nic &nic() { return *nic_; }
  // The NIC's same-host short cuts (net::LocalPeers), or one that has none
  // (whose calls answer "not here").
  net::LocalPeers &local_peers() { return *lp_; }
  uint64_t now() const { return clock_(); }

  // The protocol counters (Counter), counted under mu: in the engine, or
  // where its context points them (its process's counters file, mapped:
  // `usrc stats` reads them as they are made, even after a kill).
  std::array<uint64_t, kNumCounters> own_counters{};
  uint64_t *counters = own_counters.data();
  // A post completed a WQE since the last progress pass (a placed WRITE, a
  // UC or UD send, done once sent): a poll that finds that completion
  // should still receive (the peer's notices, ACKs and requests), as an
  // empty poll would. Read without the lock.
  alignas(64) std::atomic<bool> completed_at_post{false};
  // Calls to poll a CQ of this context (a heuristic, racy by design): an
  // application that polls between two posts on a QP waits for each one.
  std::atomic<uint32_t> polls{0};
  void note_poll() { polls.store(polls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  uint32_t slot() const { return slot_; }
  uint32_t max_window = 64;       // packets in flight, shared by the QPs (from the socket buffer)
  uint32_t hold_max;              // requests kept beyond a gap (USRC_RX_HOLD)

 private:
  void set_sq_psn(Qp &qp, uint32_t psn);
  void set_rq_psn(Qp &qp, uint32_t psn) { qp.resp.epsn = psn & kPsnMask; }
  // requester.cpp
  void requester_tx(Qp &qp);
  bool send_single(Qp &qp, SendWqe &w);
  bool small_wr(const Qp &qp, const SendWr &wr, uint64_t len) const;
  bool send_direct(Qp &qp);
  void sent(Qp &qp, const SendWqe &w, uint32_t next);
  void sent_run(Qp &qp, uint32_t k);
  // The WQE at tx_pos is sent: past the local operations behind it (no
  // packets, Engine::post_local), so that tx_pos holds tx_psn's WQE.
  void skip_local(Qp &qp) {
    while (qp.req.tx_pos != qp.sq.tail && !qp.sq.at(qp.req.tx_pos).npkts) qp.req.tx_pos++;
  }
  uint8_t *ring_slot(const Qp &qp, size_t *cap);
  void ring_slot_done(size_t len, size_t seg, uint32_t n);
  void build_request(Qp &qp, SendWqe &w, uint32_t psn, uint32_t next, bool ack_req);
  void go_back_n(Qp &qp, uint32_t psn);
  static uint64_t wqe_of(Qp &qp, uint32_t psn);
  bool resend_one(Qp &qp, uint32_t psn, bool probe = false, uint32_t run = 1);
  void time_round_trip(Qp &qp, uint32_t psn);
  void sel_acked(Qp &qp);
  void una_to(Qp &qp, uint32_t new_una);
  bool place(Qp &qp, const SendWr &wr, uint64_t len);
  void update_gate(Qp &qp, bool live = true);
  // completer.cpp
  void completer_rx(Qp &qp, const struct PacketView &p);
  bool ack_through(Qp &qp, uint32_t psn);
  bool probe_ok(const Qp &qp) const;
  void read_response(Qp &qp, const struct PacketView &p);
  void atomic_ack(Qp &qp, const struct PacketView &p);
  void implied_ack(Qp &qp, uint32_t psn);
  void complete_head(Qp &qp);
  void completed(Qp &qp, const SendWqe &w);
  void advanced(Qp &qp);
  void implied_nak(Qp &qp);
  void rtt_sample(Qp &qp, uint32_t new_una);
  void window_loss(Qp &qp, bool timeout);
  void window_acked(Qp &qp, uint32_t npkts);
  void arm_retransmit(Qp &qp);
  void fail_head(Qp &qp, WcStatus st);
  void check_timers(Qp &qp, uint64_t now);
  void rnr_resume(Qp &qp);
  uint8_t ack_syndrome(Qp &qp);
  void take_credits(Qp &qp, uint8_t syndrome, uint32_t msn);
  bool credit_wait(const Qp &qp, const SendWqe &w) const;
  void sel_go_back(Qp &qp);
  void resend_from(Qp &qp, uint32_t psn, uint32_t run = 1);
  bool fast_ack(const net::RxPacket &pkt);
  bool use_retry(Qp &qp);
  void ack_rcvd(Qp &qp, uint32_t psn, uint8_t syndrome, uint32_t msn);
  void rnr_nak_rcvd(Qp &qp, uint32_t psn, uint8_t timer);
  void seq_nak_rcvd(Qp &qp, uint32_t psn, uint32_t hole);
  void rnr_credits(Qp &qp);
  void error_nak_rcvd(Qp &qp, uint32_t psn, uint8_t code);
  // responder.cpp
  size_t fast_sends(const net::RxPacket *pkts, size_t n);
  // The responder (IBA 9.7.5.2) as short steps, each returning the next
  // (as rxe's rxe_responder()): responder_rx runs them for one request.
  enum class RespStep : uint8_t {
    check_psn, duplicate, out_of_sequence, check_op_seq, check_op_valid, check_length,
    check_resource, check_rkey, execute, complete, acknowledge, error, done
  };
  // Why a request is not taken, each with the responder's answer
  // (respond_error): the IBA's error classes on the responder's side.
  enum class RespErr : uint8_t {
    psn_seq,      // class B: PSN sequence error: one sequence NAK per expected PSN
    rnr,          // receiver not ready: RNR NAK, the requester retries
    inv_req,      // class C: invalid request: NAK, QP to ERR, IBV_EVENT_QP_REQ_ERR
    rem_access,   // class C: remote access error: NAK, QP to ERR, IBV_EVENT_QP_ACCESS_ERR
    rem_op,       // class C: remote operational error: NAK, QP to ERR (the receive's
                  //   completion says why: no async event)
  };
  struct RecvSink;
  // The request responder_rx is taking: the packet and what the steps
  // learn of it.
  struct Request {
    const PacketView &v;
    uint32_t psn, mask, len;
    bool first, last, is_send, is_write, placed;
    uint8_t *to = nullptr;   // check_rkey: where a WRITE's payload goes
    uint32_t skip = 0;       // payload bytes not placed (a matched TMH: tm_receive)
    RespErr err = RespErr::inv_req;
  };
  void responder_rx(Qp &qp, const struct PacketView &p);
  static bool is_atomic_write(const PacketView &v) {   // (RC or XRC)
    return (v.opcode() & 0x1f) == static_cast<uint8_t>(wire::Opcode::RC_ATOMIC_WRITE);
  }
  bool xrc_target(Qp &qp, const PacketView &v);
  RespStep xrc_forward(Qp &qp, Request &r);
  void xrc_abort(Qp &qp);
  RespStep check_psn(Qp &qp, Request &r);
  RespStep duplicate(Qp &qp, Request &r);
  RespStep out_of_sequence(Qp &qp, Request &r);
  RespStep check_op_seq(Qp &qp, Request &r);
  RespStep check_op_valid(Qp &qp, Request &r);
  RespStep check_length(Qp &qp, Request &r);
  RespStep check_resource(Qp &qp, Request &r);
  RespStep check_rkey(Qp &qp, Request &r);
  RespStep execute(Qp &qp, Request &r);
  RespStep complete(Qp &qp, Request &r);
  RespStep acknowledge(Qp &qp, Request &r);
  void respond_error(Qp &qp, RespErr err, uint32_t psn);
  // The coalesced ACK of a QP, sent once per transmit (build_acks).
  [[gnu::always_inline]] void schedule_ack(Qp &qp) {
    if (!qp.resp.ack_pending) ack_list_.push_back(&qp);
    qp.resp.ack_pending = true;
  }
  // The first request taken: a QP still in RTR reports it
  // (IBV_EVENT_COMM_EST).
  [[gnu::always_inline]] void note_first_request(Qp &qp) {
    if (!qp.resp.comm_est) [[unlikely]] first_request(qp);
  }
  void first_request(Qp &qp);
  bool execute_send(Qp &qp, const RecvWqe &r, uint32_t off, const uint8_t *src, uint32_t len);
  void complete_send(Qp &qp, RecvSink &k, const RecvWqe &r, bool last, bool imm, uint32_t imm_be,
                     bool solicited);
  // A request taken in order: the expected PSN moves on, a message's last
  // packet counts in the MSN, the NAK-once flag clears, an ACK is due if
  // asked for (acknowledge's state change; fast_sends' for each packet).
  [[gnu::always_inline]] void accept_request(Qp &qp, bool last, bool ack_req) {
    if (last) qp.resp.msn = msn_add(qp.resp.msn, 1);
    qp.resp.epsn = psn_add(qp.resp.epsn, 1);
    qp.resp.nak_sent = false;
    if (ack_req) schedule_ack(qp);
  }
  void send_ack(Qp &qp, uint8_t syndrome, uint32_t psn, uint32_t hole = 0);
  bool ack_in_place(Qp &qp, uint8_t syndrome, uint32_t psn);
  void send_ack_packet(Qp &qp, uint8_t syndrome, uint32_t psn, uint32_t hole = 0);
  void read_request(Qp &qp, const struct PacketView &p, bool duplicate);
  void atomic_request(Qp &qp, const struct PacketView &p, bool duplicate);
  void send_read_responses(Qp &qp, uint32_t psn, const uint8_t *data, uint32_t len);
  void send_atomic_ack(Qp &qp, uint32_t psn, uint64_t orig);
  // Where receive completions go: a poller's array while it has room
  // (DirectWc, taken for a run by recv_sink), else the QP's receive CQ.
  struct RecvSink {
    Wc *out = nullptr, *end = nullptr;
  };
  RecvSink recv_sink(const Qp &qp) {
    Cq *const cq = qp.recv_cq;
    if (cq && direct.cq == cq && direct.n < direct.room && cq->idle())
      return {direct.wc + direct.n, direct.wc + direct.room};
    return {};
  }
  void recv_sink_done(const RecvSink &k) {
    if (k.out) direct.n = static_cast<uint32_t>(k.out - direct.wc);
  }
  // The receive WQE r, the oldest not yet completed, completes (the
  // caller pops it: fast_sends pops a run of them at once).
  // inv: a SEND_WITH_INV's, imm_be the R_Key it invalidated (host order).
  [[gnu::always_inline]] void complete_recv(Qp &qp, RecvSink &k, const RecvWqe &r, WcStatus st, WcOpcode op,
                                            uint32_t len, bool imm, uint32_t imm_be, bool solicited,
                                            bool inv = false) {
    if (k.out != k.end) {
      *k.out++ = {r.wr.wr_id, uint32_t(st), uint32_t(op), 0, len, imm_be, qp.qpn, qp.attr.dest_qpn,
                  imm ? kWcWithImm : inv ? kWcWithInv : 0, 0, qp.attr.dlid, 0, 0};
    } else {
      Completion c{r.wr.wr_id, st, op, imm, solicited, len, imm_be, qp.qpn, qp.attr.dest_qpn, qp.attr.dlid, stamp()};
      c.with_inv = inv;
      push(qp.recv_cq, c);
    }
  }
  // The same for the receive WQE a request goes into (recv_wqe), into
  // the CQ, released.
  void complete_recv(Qp &qp, WcStatus st, WcOpcode op, uint32_t len, bool imm, uint32_t imm_be,
                     bool solicited) {
    RecvSink none;
    complete_recv(qp, none, *recv_wqe(qp), st, op, len, imm, imm_be, solicited);
    release_recv(qp);
  }
  // The receive WQE recv_wqe() gave completed: off the queue, or no more
  // the message's.
  void release_recv(Qp &qp) {
    if (qp.resp.has_cur) qp.resp.has_cur = false;
    else took_recv(qp, 1);
  }
  // The receive WQE a SEND's (or WRITE with immediate's) packet goes
  // into: the one its message took, or the queue's head; nullptr: none.
  static RecvWqe *recv_wqe(Qp &qp) {
    return qp.resp.has_cur ? &qp.resp.cur : qp.rq->empty() ? nullptr : &qp.rq->front();
  }
  // A multi-packet SEND's first packet: its WQE comes off the queue.
  void take_recv(Qp &qp) {
    copy_wr(qp.resp.cur.wr, qp.rq->front().wr);
    qp.resp.cur.length = qp.rq->front().length;
    qp.resp.cur.bad = qp.rq->front().bad;
    qp.resp.has_cur = true;
    took_recv(qp, 1);
  }
  // n WQEs came off the head of the QP's receive queue: an SRQ's limit
  // may be reached.
  void took_recv(Qp &qp, uint32_t n) {
    RecvQueue &q = *qp.rq;
    q.pop(n);
    if (q.limit && q.size() < q.limit) [[unlikely]] srq_limit(q);
  }
  void srq_limit(RecvQueue &q);
  // tm.cpp: tag matching on a TM SRQ (tm.h). tm_receive: check_resource's
  // part for a SEND's packet (false: not taken, r.err says why);
  // tm_complete: a tag matching message's last packet completes it.
  bool tm_receive(Qp &qp, Request &r);
  void tm_complete(Qp &qp, const Request &r);
  void tm_post(Qp &qp, uint32_t len);
  // An internal WQE (kTmInternal) is done, with st.
  void tm_wqe_done(Qp &qp, const SendWqe &w, WcStatus st);
  void datagram_rx(Qp &qp, const struct PacketView &v, size_t pkt_len);
  void uc_rx(Qp &qp, const struct PacketView &v);
  void hold(Qp &qp, const struct PacketView &p);
  void drain_held(Qp &qp);
  void ack_again_later(Qp &qp);
  void ack_again(Qp &qp, uint64_t now);
  void drop_held(Qp &qp);
  // engine.cpp
  void handle_packet(const net::RxPacket &pkt);
  void roce_forward(const net::RxPacket &pkt, uint32_t slot);
  void flush_queues(Qp &qp);
  [[gnu::always_inline]] void push(Cq *cq, const Completion &c) {
    if (cq && !cq->push(c)) [[unlikely]] cq_overflow_ = true;
  }
  void arm_timer(uint64_t deadline);
  void check_drained(Qp &qp);
  // After a step: a guarded copy that faulted fails its WQE, a full CQ
  // fails its QPs.
  void check_faults() {
    if (guard::faults() != faults_seen_ || cq_overflow_) [[unlikely]] source_faults();
  }
  void source_faults();
  void cq_overflowed();
  uint64_t faults_seen_ = 0;
  bool cq_overflow_ = false;   // a push found its CQ full
  struct TxSlot;
  TxSlot &tx_slot();
  void tx_commit(const Qp &qp, size_t hdr_len, size_t payload_len, size_t pieces);
  void tx_flush();    // the pending ACKs, then the batch
  void send_batch();  // the batch as it is
  void build_acks();
  bool replies();
  void count(Counter c, uint64_t n = 1) { counters[static_cast<uint32_t>(c)] += n; }
  // The time for completion timestamps and timers: read once per progress
  // pass (a clock read per completion cost a few % of a core at 1 Mpps).
  // A pass (progress(), post_send()) reads the clock at most once: at its
  // start, or (now 0) at its first stamp(). Outside a pass, every stamp()
  // reads it.
  [[gnu::always_inline]] uint64_t stamp() const {
    if (pass_time_) [[likely]] return pass_time_;
    return read_clock();
  }
  [[gnu::noinline]] uint64_t read_clock() const {
    const uint64_t t = clock_();
    if (in_pass_) pass_time_ = t;
    return t;
  }
  struct Pass {
    Engine &e;
    const bool outer;   // not nested in another pass
    Pass(Engine &en, uint64_t now) : e(en), outer(!en.in_pass_) {
      if (outer) e.in_pass_ = true, e.pass_time_ = now;
    }
    ~Pass() {
      if (outer) e.in_pass_ = false, e.pass_time_ = 0;
    }
  };
  mutable uint64_t pass_time_ = 0;   // 0: not in a pass, or not read yet
  DirectWc direct;   // progress()'s direct, for this pass (empty outside one)
  bool in_pass_ = false;

  std::unique_ptr<net::Nic> nic_;
  net::LocalPeers no_local_peers_;
  net::LocalPeers *const lp_;   // nic_->local_peers(), else &no_local_peers_
  uint32_t slot_;
  uint16_t base_port_;
  Clock clock_;
  MemoryAccess *mem_;
  EngineHooks *hooks_;
  std::vector<RecvQueue *> srqs_;
  std::vector<Qp *> qps_;          // by QPN index
  std::unordered_map<uint32_t, XrcSrq> xrc_srqs_;
  // QPN indices are handed out along a walk of all 4096 from a random start
  // with a random odd stride: unpredictable to another process, and a
  // destroyed QP's QPN comes back only after the other 4095 (its stale
  // packets then find no QP, rather than its successor).
  uint32_t qpn_walk_, qpn_stride_;
  std::vector<Qp *> live_;         // the same QPs, compact, for timer/tx scans
  std::vector<Qp *> ack_list_;     // QPs with ack_pending
  std::atomic<uint64_t> next_deadline_{UINT64_MAX};
  uint32_t lingering_ = 0;
  void reap(Qp *qp);
  void share_window();

  // The transmit batch: up to kTxBatch packets, each built in a slot (its
  // headers and trailer) with its iovecs in one flat array, so that a run of
  // equal-sized packets on the same path becomes one segmented TxPacket (UDP
  // GSO) by extending the iovecs of the one before. 120: eight whole sends
  // of 15 segments of 4 KB (kMaxGsoBytes) at MTU 9000, where 64 left a
  // fifth send of 4 in every batch.
  static constexpr size_t kTxBatch = 120, kIovPerPkt = kMaxSge + 3;
  // Packets a post_send sends at once to a peer where that is cheap
  // (net::LocalPeers::cheap_send): about a shared-memory ring slot of 64 B sends.
  static constexpr size_t kTxEager = 16;
  // How soon a pass looks again at packets the NIC holds (LocalPeers::tx_pending).
  static constexpr uint64_t kTxRetryNs = 50'000;
  // ack_again: the last ACK again after 1, 4, 16 and 64 ms of silence.
  static constexpr uint64_t kAckAgainNs = 1'000'000;
  static constexpr uint8_t kAcksAgain = 4;
  size_t tx_next_ = 0;   // the live_ index the next pass's transmit starts at
  // A payload up to kTxCopy bytes is copied behind the headers: one iovec
  // per packet instead of three or more (the kernel imports each one).
  static constexpr size_t kTxCopy = 256;
  static_assert(kTxCopy <= kMaxInline, "small_ready() admits inline data without its own check");
  // Received packets prefetched ahead of the one being handled.
  static constexpr size_t kRxAhead = 2;
  struct TxSlot {
    uint8_t hdr[64 + kTxCopy + 8];   // headers [+ payload + pad + ICRC]
    uint8_t trailer[8];          // pad + ICRC
    iovec *iov;                  // into tx_iov_
  };
  std::unique_ptr<TxSlot[]> tx_slots_;
  std::unique_ptr<iovec[]> tx_iov_;
  std::array<net::TxPacket, kTxBatch> tx_pkts_{};
  size_t tx_count_ = 0;          // TxPackets
  size_t tx_nslots_ = 0, tx_niov_ = 0;
  size_t wire_received_ = 0;     // the last progress()'s, for wire_received()
  bool acks_held_ = false;       // an app or handed pass left its ACKs for the reply
  uint64_t acks_held_at_ = 0;    // ... in a pass at this time
  // The last TxPacket as a GSO group: its segment size and bytes.
  uint32_t grp_size_ = 0, grp_bytes_ = 0, grp_max_ = 1;
  bool grp_open_ = false;
  const Tunables &tun_;          // read once (USRC_ICRC_LOCAL, USRC_DIRECT_WRITE, ...)
  // Our packets say, and we take, that a UDP checksum stands for the ICRC
  // (net::Nic::udp_checksummed; not with USRC_ICRC_LOCAL, which computes
  // every ICRC and leaves the reserved bits 0).
  const bool icrc_optional_;
  // What one receive hands out: a member, so that an empty poll does not
  // initialize a fresh array of them (1.5 KB of stores) every time.
  std::array<net::RxPacket, 64> rx_pkts_;
  PacketView rx_view_;   // the packet being handled (not built afresh for each)
  // SEND and WRITE packets that arrived beyond a gap in their QP's PSNs
  // (Engine::hold), copied, to be taken in order once the gap is filled:
  // hold_max of them per context, payloads of up to kHoldBytes; allocated
  // on the first one.
  static constexpr size_t kHoldBytes = 4096;   // the largest path MTU
  static constexpr uint32_t kMaxHold = 1024;   // hold_max's cap
  struct Held {
    Qp *qp = nullptr;   // nullptr: free
    PacketView v;       // its payload in data
    std::unique_ptr<uint8_t[]> data;
  };
  std::vector<Held> held_;
};

}  // namespace usrc::rc
