// The RC transport between two engines over the deterministic simulated
// network: exactly-once, in-order, byte-exact delivery under drop,
// duplication, reordering, delay and corruption, and the right error
// statuses when the peer vanishes or retries run out.
#include <arpa/inet.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "usrc/net/sim.h"
#include "usrc/net/trace.h"
#include "usrc/progress_policy.h"
#include "usrc/rc/engine.h"
#include "usrc/rc/psn.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

#include "temp_dir.h"

using namespace usrc;
using namespace usrc::rc;

namespace {

struct Mem final : MemoryAccess {
  struct Region { uint8_t *p; uint64_t va, len; uint32_t access; };
  std::map<uint32_t, Region> regions;
  bool invalidate(const void *, uint32_t, uint32_t) override { return false; }
  uint8_t *resolve(const void *, uint32_t, uint32_t rkey, uint64_t va, uint64_t len,
                   uint32_t access) override {
    auto it = regions.find(rkey);
    if (it == regions.end() || (it->second.access & access) != access) return nullptr;
    const Region &r = it->second;
    if (va < r.va || va + len > r.va + r.len) return nullptr;
    return r.p + (va - r.va);
  }
};

// The async events an engine raised, in order.
struct Events final : EngineHooks {
  std::vector<QpEvent> seen;
  void qp_event(Qp &, QpEvent ev) override { seen.push_back(ev); }
  std::vector<RecvQueue *> srq_limits;
  void srq_event(RecvQueue &q) override { srq_limits.push_back(&q); }
};

struct Side {
  Cq scq{65536, nullptr}, rcq{65536, nullptr};
  Mem mem;
  Events events;
  std::unique_ptr<Engine> e;
  Qp *qp = nullptr;
};

struct Pair {
  net::SimNetwork net;
  Side a, b;
  static constexpr uint16_t kBase = 20000;

  // trace: each engine's NIC is traced (net::TraceNic), a's to trace + "a",
  // b's to trace + "b".
  explicit Pair(uint64_t seed, net::SimFaults f = {}, uint32_t pmtu = 1024, uint32_t psn_a = 0,
                uint32_t psn_b = 0, uint32_t depth = 4096, const std::string &trace = {})
      : net(seed, f) {
    net::Endpoint ea{0x0a000001, kBase + 1}, eb{0x0a000002, kBase + 2};
    auto clock = [this] { return net.now(); };
    auto nic = [&](net::Endpoint e, const char *side) {
      std::unique_ptr<net::Nic> n = std::make_unique<net::SimNic>(net, e);
      if (trace.empty()) return n;
      std::string err;
      auto t = net::TraceNic::wrap(n, trace + side, &err);
      INFO(err);
      REQUIRE(t);
      return t;
    };
    a.e = std::make_unique<Engine>(nic(ea, "a"), 1, kBase, clock, &a.mem, &a.events);
    b.e = std::make_unique<Engine>(nic(eb, "b"), 2, kBase, clock, &b.mem, &b.events);
    a.qp = a.e->create_qp(depth, depth);
    b.qp = b.e->create_qp(depth, depth);
    connect(a, *a.qp, b.qp->qpn, eb, pmtu, psn_a, psn_b);
    connect(b, *b.qp, a.qp->qpn, ea, pmtu, psn_b, psn_a);
  }
  // Takes q (of s's engine, completing on s's CQs) through INIT and RTR to
  // RTS, connected to QP dest_qpn at pe.
  static void connect(Side &s, Qp &q, uint32_t dest_qpn, net::Endpoint pe, uint32_t pmtu,
                      uint32_t my_psn, uint32_t peer_psn) {
    q.send_cq = &s.scq;
    q.recv_cq = &s.rcq;
    // The three modify_qp calls of a verbs application, as the glue hands
    // them to the engine.
    Engine::QpChange c;
    c.attr.access = kAccessRemoteWrite;
    c.state = QpState::init;
    s.e->modify(q, c);
    c.attr.dest_qpn = dest_qpn;
    c.attr.peer = pe;
    c.new_peer = true;
    c.attr.pmtu = pmtu;
    c.attr.min_rnr_timer = 1;   // 10 us
    c.set_rq_psn = true, c.rq_psn = peer_psn;
    c.state = QpState::rtr;
    s.e->modify(q, c);
    c = {q.attr};
    c.attr.timeout = 10;        // 4 ms
    c.attr.retry_cnt = 7;
    c.attr.rnr_retry = 7;
    c.set_sq_psn = true, c.sq_psn = my_psn;
    c.state = QpState::rts;
    s.e->modify(q, c);
  }
  // Both QPs on one host's loopback (net::Nic::same_host): no ICRC, small
  // messages built in place (the SimNic offers tx_begin there, as the
  // shared-memory ring does; LocalPath::in_place is looked up on entering
  // RTS), and small SENDs take the responder's short path.
  void same_host() {
    net.loopback = true;
    for (Side *s : {&a, &b}) {
      Engine::QpChange c{s->qp->attr};
      c.new_peer = true;   // (the path looked up again: now on this host)
      c.state = QpState::rts;
      s->e->modify(*s->qp, c);
    }
    REQUIRE(a.qp->local.same_host);
    REQUIRE(a.qp->local.in_place);
  }
  bool collect(std::vector<Completion> &sc, size_t ns, std::vector<Completion> *rcv = nullptr,
               size_t nr = 0);
  // Runs both engines until pred() or the virtual time limit.
  template <class P>
  bool run(P pred, uint64_t limit_ns = 60'000'000'000ull) {
    for (int iter = 0; iter < 50'000'000; iter++) {
      a.e->progress();
      b.e->progress();
      if (pred()) return true;
      uint64_t next = std::min({net.next_delivery(), a.e->next_deadline(), b.e->next_deadline()});
      if (next == UINT64_MAX || net.now() > limit_ns) return pred();
      if (next > net.now()) net.advance(next - net.now());
      else net.advance(100);
    }
    return pred();
  }
};

std::vector<Completion> drain(Cq &cq) {
  std::vector<Completion> out;
  Completion c[64];
  while (size_t n = cq.poll(c, 64)) out.insert(out.end(), c, c + n);
  return out;
}

// Runs until a's send CQ has given ns completions (appended to sc) and,
// with rcv, b's receive CQ nr (appended to *rcv); false at the time limit.
bool Pair::collect(std::vector<Completion> &sc, size_t ns, std::vector<Completion> *rcv, size_t nr) {
  return run([&] {
    auto s = drain(a.scq);
    sc.insert(sc.end(), s.begin(), s.end());
    if (rcv) {
      auto r = drain(b.rcq);
      rcv->insert(rcv->end(), r.begin(), r.end());
    }
    return sc.size() == ns && (!rcv || rcv->size() == nr);
  });
}

// Sends n messages of random sizes from a to b and checks delivery.
void send_messages(Pair &p, int n, uint32_t max_len, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> tx(n), rx(n);
  for (int i = 0; i < n; i++) {
    uint32_t len = std::uniform_int_distribution<uint32_t>(0, max_len)(rng);
    tx[i].resize(len);
    for (auto &x : tx[i]) x = static_cast<uint8_t>(rng());
    rx[i].assign(max_len + 16, 0xee);
    RecvWr r;
    r.wr_id = 1000 + i;
    // Two SGEs to exercise scatter.
    uint32_t half = (max_len + 16) / 2;
    r.num_sge = 2;
    r.sge[0] = {rx[i].data(), half};
    r.sge[1] = {rx[i].data() + half, max_len + 16 - half};
    REQUIRE(p.b.e->post_recv(*p.b.qp, r) == 0);
  }
  for (int i = 0; i < n; i++) {
    SendWr w;
    w.wr_id = i;
    w.opcode = (i % 3 == 0) ? WrOpcode::send_imm : WrOpcode::send;
    w.imm_be = 0x01020304u + i;
    w.flags = kSignaled;
    w.num_sge = 1;
    w.sge[0] = {tx[i].data(), static_cast<uint32_t>(tx[i].size())};
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  }
  std::vector<Completion> sc, rcv;
  bool ok = p.run([&] {
    auto s = drain(p.a.scq), r = drain(p.b.rcq);
    sc.insert(sc.end(), s.begin(), s.end());
    rcv.insert(rcv.end(), r.begin(), r.end());
    return sc.size() == size_t(n) && rcv.size() == size_t(n);
  });
  INFO("sent " << p.net.stats.sent << " dropped " << p.net.stats.dropped << " dup "
               << p.net.stats.duplicated << " reordered " << p.net.stats.reordered
               << " corrupted " << p.net.stats.corrupted);
  REQUIRE(ok);
  for (int i = 0; i < n; i++) {
    CHECK(sc[i].status == WcStatus::success);
    CHECK(sc[i].wr_id == uint64_t(i));
    REQUIRE(rcv[i].status == WcStatus::success);
    REQUIRE(rcv[i].wr_id == uint64_t(1000 + i));   // in order, exactly once
    REQUIRE(rcv[i].byte_len == tx[i].size());
    CHECK(rcv[i].with_imm == (i % 3 == 0));
    if (i % 3 == 0) CHECK(rcv[i].imm_be == 0x01020304u + i);
    REQUIRE(std::equal(tx[i].begin(), tx[i].end(), rx[i].begin()));   // (tx[i] may be empty: no memcmp of null)
    CHECK(rx[i][tx[i].size()] == 0xee);   // nothing written past the message
  }
  // Nothing more arrives later (no duplicate delivery).
  p.run([] { return false; }, p.net.now() + 200'000'000);
  CHECK(drain(p.b.rcq).empty());
  CHECK(drain(p.a.scq).empty());
}

// A receive of len bytes at buf.
RecvWr recv_wr(uint8_t *buf, uint32_t len, uint64_t id = 0) {
  RecvWr r;
  r.wr_id = id;
  r.num_sge = 1;
  r.sge[0] = {buf, len};
  return r;
}

// A signaled SEND of len bytes from buf.
SendWr send_wr(uint8_t *buf, uint32_t len, uint64_t id = 0) {
  SendWr w;
  w.wr_id = id;
  w.flags = kSignaled;
  w.num_sge = 1;
  w.sge[0] = {buf, len};
  return w;
}

// A signaled RDMA READ or ATOMIC (op) of len bytes into buf, from
// remote_va under rkey.
SendWr rdma_wr(WrOpcode op, uint8_t *buf, uint32_t len, uint64_t remote_va, uint32_t rkey, uint64_t id = 0) {
  SendWr w = send_wr(buf, len, id);
  w.opcode = op;
  w.remote_va = remote_va;
  w.rkey = rkey;
  return w;
}

// One receive at b (128 bytes of rx, slot id) and a signaled 100-byte SEND
// from a.
void post_small_send(Pair &p, std::vector<uint8_t> &buf, std::vector<uint8_t> &rx, uint64_t id) {
  REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * id, 128, id)) == 0);
  REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(buf.data(), 100, id)) == 0);
}

}  // namespace

TEST_CASE("messages from 0 bytes to several MTUs arrive exactly once, in order", "[sim]") {
  Pair p(1);
  send_messages(p, 200, 5000, 11);
  CHECK(p.a.e->counters[uint32_t(Counter::retransmits)] == 0);
}

TEST_CASE("delivery survives seeded drop rates from 1% to 30%", "[sim]") {
  for (double drop : {0.01, 0.05, 0.1, 0.3}) {
    DYNAMIC_SECTION("drop " << drop) {
      net::SimFaults f;
      f.drop = drop;
      Pair p(42 + uint64_t(drop * 100), f);
      send_messages(p, 100, 4000, 7);
      CHECK(p.a.e->counters[uint32_t(Counter::retransmits)] > 0);
    }
  }
}

TEST_CASE("duplication, reordering, delay and corruption", "[sim]") {
  net::SimFaults f;
  f.duplicate = 0.05;
  f.reorder = 0.1;
  f.corrupt = 0.02;
  f.drop = 0.02;
  f.delay_ns = 50'000;
  Pair p(7, f);
  send_messages(p, 150, 3000, 3);
  CHECK(p.a.e->counters[uint32_t(Counter::malformed_drops)] +
            p.b.e->counters[uint32_t(Counter::malformed_drops)] > 0);
  CHECK(p.b.e->counters[uint32_t(Counter::duplicates)] > 0);
}

// The responder's short path (Engine::fast_sends) takes in-order SEND
// ONLY packets from this host; what it leaves to the general path must
// still come out right.
TEST_CASE("same host: small SENDs under loss, duplication and reordering; SQD; RNR; a short receive buffer", "[sim]") {
  SECTION("loss, duplication, reordering") {
    net::SimFaults f;
    f.drop = 0.03;
    f.duplicate = 0.05;
    f.reorder = 0.1;
    Pair p(31, f);
    p.same_host();
    send_messages(p, 400, 300, 9);   // (all single-packet messages)
    CHECK(p.a.e->counters[uint32_t(Counter::retransmits)] > 0);
    CHECK(p.b.e->counters[uint32_t(Counter::duplicates)] > 0);
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 0);
  }
  SECTION("small messages posted in RTS, not yet built, all leave after a move to SQD") {
    Pair p(34);
    p.same_host();
    std::vector<uint8_t> tx(64, 7), rx(64 * 8, 0);
    for (int i = 0; i < 8; i++)
      REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 64 * i, 64, i)) == 0);
    for (int i = 0; i < 8; i++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 64, i)) == 0);
    // The first left at once; the others wait to be built with later posts.
    REQUIRE(p.a.qp->req.tx_psn != p.a.qp->req.next_psn);
    p.a.e->set_state(*p.a.qp, QpState::sqd);
    std::vector<Completion> sc;
    REQUIRE(p.collect(sc, 8));
    for (const Completion &c : sc) CHECK(c.status == WcStatus::success);
    CHECK(std::all_of(rx.begin(), rx.end(), [](uint8_t x) { return x == 7; }));
  }
  SECTION("no receive posted: RNR NAKs until there is one") {
    Pair p(32);
    p.same_host();
    std::vector<uint8_t> tx(60, 0x3c), rx(64, 0);
    REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 60, 1)) == 0);
    p.run([] { return false; }, p.net.now() + 2'000'000);
    CHECK(p.b.e->counters[uint32_t(Counter::rnr_naks_sent)] > 0);
    CHECK(drain(p.a.scq).empty());
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 64, 2)) == 0);
    std::vector<Completion> sc, rcv;
    REQUIRE(p.collect(sc, 1, &rcv, 1));
    CHECK(sc[0].status == WcStatus::success);
    CHECK(rcv[0].status == WcStatus::success);
    CHECK(rcv[0].byte_len == 60);
    CHECK(std::equal(tx.begin(), tx.end(), rx.begin()));
  }
  SECTION("two QPs between the same engines: their packets meet in one receive, each QP takes its own") {
    Pair p(35);
    // A second pair whose PSNs run one ahead of the first's: in a receive
    // where the first QP's packet is followed by the second's, that one
    // bears the PSN the first QP expects next, and only its QPN tells.
    Qp *qa = p.a.e->create_qp(4096, 4096), *qb = p.b.e->create_qp(4096, 4096);
    Pair::connect(p.a, *qa, qb->qpn, p.b.e->nic().local(), 1024, 1, 1);
    Pair::connect(p.b, *qb, qa->qpn, p.a.e->nic().local(), 1024, 1, 1);
    p.same_host();
    for (auto [e, q] : {std::pair{p.a.e.get(), qa}, std::pair{p.b.e.get(), qb}}) {
      Engine::QpChange c{q->attr};
      c.new_peer = true;
      c.state = QpState::rts;
      e->modify(*q, c);
    }
    REQUIRE(qa->local.in_place);
    constexpr int n = 300;
    std::vector<uint8_t> tx(2 * n * 48), rx(2 * n * 64, 0);
    for (size_t i = 0; i < tx.size(); i++) tx[i] = static_cast<uint8_t>(i * 7 + i / 251);
    Qp *from[2] = {p.a.qp, qa}, *to[2] = {p.b.qp, qb};
    for (int q = 0; q < 2; q++)
      for (int i = 0; i < n; i++)
        REQUIRE(p.b.e->post_recv(*to[q], recv_wr(rx.data() + (q * n + i) * 64, 64, q * n + i)) == 0);
    // One message on each QP, each sent before the receiver looks.
    for (int i = 0; i < n; i++) {
      for (int q = 0; q < 2; q++) {
        REQUIRE(p.a.e->post_send(*from[q], send_wr(tx.data() + (q * n + i) * 48, 48, q * n + i)) == 0);
        p.a.e->progress();
      }
      p.b.e->progress();
    }
    std::vector<Completion> sc, rcv;
    REQUIRE(p.collect(sc, 2 * n, &rcv, 2 * n));
    for (const Completion &c : sc) CHECK(c.status == WcStatus::success);
    for (const Completion &c : rcv) {
      REQUIRE(c.status == WcStatus::success);
      CHECK(c.byte_len == 48);
      CHECK(c.qp_num == (c.wr_id < n ? p.b.qp->qpn : qb->qpn));
    }
    // Each receive holds its own QP's message, in posting order.
    for (int i = 0; i < 2 * n; i++)
      CHECK(std::equal(tx.begin() + i * 48, tx.begin() + (i + 1) * 48, rx.begin() + i * 64));
  }
  SECTION("a SEND longer than the receive buffer fails both sides") {
    Pair p(33);
    p.same_host();
    std::vector<uint8_t> tx(100, 1), rx(150, 0);
    // One that fits first (the QP's first request takes the general path),
    // then one 50 bytes too long.
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 100, 1)) == 0);
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 100, 50, 2)) == 0);
    REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 100, 1)) == 0);
    REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 100, 2)) == 0);
    std::vector<Completion> sc, rcv;
    REQUIRE(p.collect(sc, 2, &rcv, 2));
    CHECK(sc[0].status == WcStatus::success);
    CHECK(rcv[0].status == WcStatus::success);
    CHECK(sc[1].status == WcStatus::rem_inv_req_err);
    CHECK(rcv[1].status == WcStatus::loc_len_err);
    CHECK(std::all_of(rx.begin() + 100, rx.end(), [](uint8_t x) { return x == 0; }));
  }
}

namespace {

// The UDP payloads of the packets in a pcap file TraceNic wrote (raw IPv4,
// 28 bytes of IPv4 and UDP header before each).
std::vector<std::vector<uint8_t>> pcap_payloads(const std::string &path) {
  std::vector<std::vector<uint8_t>> out;
  FILE *f = fopen(path.c_str(), "rb");
  REQUIRE(f);
  uint8_t h[24];
  REQUIRE(fread(h, 1, sizeof h, f) == sizeof h);
  for (uint32_t r[4]; fread(r, 1, sizeof r, f) == sizeof r;) {
    std::vector<uint8_t> pkt(r[2]);
    REQUIRE(fread(pkt.data(), 1, pkt.size(), f) == pkt.size());
    REQUIRE(pkt.size() >= 28);
    out.emplace_back(pkt.begin() + 28, pkt.end());
  }
  fclose(f);
  return out;
}

}  // namespace

TEST_CASE("tracing a same-host pair changes nothing, and the trace holds the packets built in place", "[sim][trace]") {
  // The same seeded run twice, untraced and traced: the same packets on the
  // same paths (built in place in the peer's ring, as the shared-memory
  // NIC offers it) and every counter alike; the trace holds every packet
  // each side sent and received.
  const TempDir dir("usrc-simtrace");
  const std::string prefix = dir.path + "/";
  struct Run {
    std::array<uint64_t, kNumCounters> a, b;
    net::SimNetwork::Stats net;
  };
  auto run = [&](const std::string &trace) {
    net::SimFaults f;
    f.drop = 0.02;   // (resends and ACKs of every kind)
    Pair p(57, f, 1024, 0, 0, 4096, trace);
    p.same_host();
    send_messages(p, 300, 300, 11);
    Run r;
    std::copy_n(p.a.e->counters, kNumCounters, r.a.begin());
    std::copy_n(p.b.e->counters, kNumCounters, r.b.begin());
    r.net = p.net.stats;
    return r;
  };
  const Run plain = run({}), traced = run(prefix);
  CHECK(plain.net.in_place > 0);
  CHECK(traced.net.in_place == plain.net.in_place);
  CHECK(traced.net.sent == plain.net.sent);
  for (uint32_t i = 0; i < kNumCounters; i++) {
    INFO("counter " << i);
    CHECK(traced.a[i] == plain.a[i]);
    CHECK(traced.b[i] == plain.b[i]);
  }
  const auto a = pcap_payloads(prefix + "a"), b = pcap_payloads(prefix + "b");
  auto sent_and_received = [](const std::array<uint64_t, kNumCounters> &c) {
    return c[uint32_t(Counter::tx_packets)] + c[uint32_t(Counter::rx_packets)];
  };
  CHECK(a.size() == sent_and_received(traced.a));
  CHECK(b.size() == sent_and_received(traced.b));
  // Every SEND a made, among them the ones built in place, is in a's trace.
  std::set<uint32_t> psns;
  for (const auto &pkt : a)
    if (pkt.size() >= wire::kBthLen &&
        (wire::Opcode(wire::bth::opcode(pkt.data())) == wire::Opcode::RC_SEND_ONLY ||
         wire::Opcode(wire::bth::opcode(pkt.data())) == wire::Opcode::RC_SEND_ONLY_IMM))
      psns.insert(wire::bth::psn(pkt.data()));
  CHECK(psns.size() == 300);
}

TEST_CASE("PSNs roll over from FFFFFFh to 0", "[sim]") {
  Pair p(5, {}, 256, 0xfffff0, 0xffffe0);
  send_messages(p, 40, 2000, 9);
  CHECK(psn_lt(0xfffff0, p.a.qp->req.next_psn));
  CHECK(p.a.qp->req.next_psn < 0x1000);   // wrapped
}

TEST_CASE("a vanished peer gives RETRY_EXC_ERR after retry_cnt+1 timeouts, then flushes", "[sim]") {
  Pair p(3);
  p.a.qp->attr.retry_cnt = 3;
  p.a.e->set_state(*p.a.qp, QpState::rts);
  p.a.qp->comp.retry_left = 3;
  p.net.set_partitioned(p.b.e->nic().local(), true);
  std::vector<uint8_t> buf(100, 1);
  for (int i = 0; i < 3; i++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(buf.data(), 100, i)) == 0);
  uint64_t t0 = p.net.now();
  std::vector<Completion> sc;
  REQUIRE(p.collect(sc, 3));
  uint64_t elapsed = p.net.now() - t0;
  uint64_t t = local_ack_timeout_ns(10);
  CHECK(sc[0].status == WcStatus::retry_exc_err);
  CHECK(sc[1].status == WcStatus::wr_flush_err);
  CHECK(sc[2].status == WcStatus::wr_flush_err);
  CHECK(elapsed >= 4 * t);
  CHECK(elapsed < 5 * t);
  CHECK(p.a.qp->state == QpState::err);
  CHECK(p.a.e->counters[uint32_t(Counter::timeouts)] == 4);
  // A WR posted in ERR completes with "flushed" at once.
  SendWr w;
  w.wr_id = 99;
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  auto s = drain(p.a.scq);
  REQUIRE(s.size() == 1);
  CHECK(s[0].status == WcStatus::wr_flush_err);
}

TEST_CASE("a lost packet nothing reveals is resent by the probe, not the Local ACK Timeout", "[sim]") {
  Pair p(4);
  p.a.qp->attr.timeout = 20;   // Local ACK Timeout 4.3 s
  p.a.e->set_state(*p.a.qp, QpState::rts);
  std::vector<uint8_t> buf(100, 1), rx(2 * 128);
  auto post = [&](uint64_t id) { post_small_send(p, buf, rx, id); };
  std::vector<Completion> sc;
  auto done = [&](size_t n) {
    return [&, n] {
      auto s = drain(p.a.scq);
      sc.insert(sc.end(), s.begin(), s.end());
      return sc.size() == n;
    };
  };
  post(0);   // a round trip measured
  REQUIRE(p.run(done(1)));
  // The only packet of the next message is lost: no later packet, so no
  // NAK; only a timer can resend it.
  p.net.set_faults({.drop = 1.0});
  post(1);
  p.net.set_faults({});
  const uint64_t t0 = p.net.now();
  REQUIRE(p.run(done(2)));
  CHECK(sc[1].status == WcStatus::success);
  CHECK(p.net.now() - t0 < 1'000'000);   // the probe: well inside the 4.3 s timeout
  CHECK(p.a.e->counters[uint32_t(Counter::probes)] == 1);
  CHECK(p.a.e->counters[uint32_t(Counter::rto_resends)] == 0);
  CHECK(p.a.e->counters[uint32_t(Counter::timeouts)] == 0);
  CHECK(p.a.qp->comp.retry_left == p.a.qp->attr.retry_cnt);   // not a retry (IBA 9.7.6.1.3)

  // A vanished peer still takes retry_cnt + 1 Local ACK Timeouts.
  p.a.qp->attr.timeout = 14;   // 67 ms
  p.net.set_partitioned(p.b.e->nic().local(), true);
  post(0);
  const uint64_t t1 = p.net.now(), resends = p.a.e->counters[uint32_t(Counter::rto_resends)];
  REQUIRE(p.run(done(3)));
  CHECK(sc[2].status == WcStatus::retry_exc_err);
  CHECK(p.net.now() - t1 >= 8 * local_ack_timeout_ns(14));
  CHECK(p.a.e->counters[uint32_t(Counter::timeouts)] == 8);
  CHECK(p.a.e->counters[uint32_t(Counter::rto_resends)] > resends);
}

TEST_CASE("a QP that only reads times its READs: a lost one is resent by the retransmission timer", "[sim]") {
  Pair p(6);
  p.a.qp->attr.timeout = 20;   // Local ACK Timeout 4.3 s
  std::vector<uint8_t> remote(64, 7), local(64, 0);
  p.b.mem.regions[9] = {remote.data(), 0x100000, remote.size(), kAccessRemoteRead};
  p.b.qp->attr.access = kAccessRemoteRead;
  std::vector<Completion> sc;
  auto read = [&](uint64_t id) {
    REQUIRE(p.a.e->post_send(*p.a.qp, rdma_wr(WrOpcode::rdma_read, local.data(), 64, 0x100000, 9, id)) == 0);
  };
  auto done = [&](size_t n) {
    return [&, n] {
      auto s = drain(p.a.scq);
      sc.insert(sc.end(), s.begin(), s.end());
      return sc.size() == n;
    };
  };
  read(0);   // a round trip measured, by its response alone (no ACK comes)
  REQUIRE(p.run(done(1)));
  CHECK(p.a.qp->comp.srtt > 0);
  // The next READ is lost: no later packet reveals it.
  p.net.set_faults({.drop = 1.0});
  read(1);
  p.net.set_faults({});
  const uint64_t t0 = p.net.now();
  REQUIRE(p.run(done(2)));
  CHECK(sc[1].status == WcStatus::success);
  CHECK(p.net.now() - t0 < 10'000'000);   // the timer (at least 2 ms), not the 4.3 s timeout
  CHECK(p.a.e->counters[uint32_t(Counter::rto_resends)] == 1);
  CHECK(p.a.e->counters[uint32_t(Counter::timeouts)] == 0);
  CHECK(std::all_of(local.begin(), local.end(), [](uint8_t b) { return b == 7; }));
}

TEST_CASE("a silent peer gets the oldest packet alone on each retransmission timeout, the window kept; the answer that shows loss halves it", "[sim]") {
  Pair p(5);
  p.a.qp->attr.timeout = 20;   // Local ACK Timeout 4.3 s: only the retransmission timer acts
  std::vector<uint8_t> buf(100, 1), rx(128 * 9);
  size_t done = 0;
  auto completed = [&](size_t n) {
    return [&, n] {
      for (const Completion &c : drain(p.a.scq)) done += c.status == WcStatus::success;
      return done == n;
    };
  };
  auto counter = [&](Counter c) { return p.a.e->counters[uint32_t(c)]; };
  // (The receives first: the round trip's ACK gives their credits.)
  for (uint64_t id = 1; id <= 8; id++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * id, 128, id)) == 0);
  post_small_send(p, buf, rx, 0);   // a round trip measured
  REQUIRE(p.run(completed(1)));
  const uint32_t full = p.a.qp->req.cwnd;
  REQUIRE(full > 32);
  // Silence: the peer is gone (descheduled, partitioned) with 8 packets
  // in flight. Each expiry resends the oldest alone; the window stays.
  p.net.set_partitioned(p.b.e->nic().local(), true);
  for (uint64_t id = 1; id <= 8; id++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(buf.data(), 100, id)) == 0);
  const uint64_t resent0 = counter(Counter::retransmits);
  REQUIRE(p.run([&] { return counter(Counter::rto_resends) >= 3; }));
  CHECK(counter(Counter::retransmits) - resent0 == counter(Counter::probes) + counter(Counter::rto_resends));
  CHECK(p.a.qp->req.cwnd == full);
  // Back: what it answers (the oldest alone, all of the rest lost) is a
  // loss: the rest goes back N once and the window halves.
  p.net.set_partitioned(p.b.e->nic().local(), false);
  REQUIRE(p.run(completed(9)));
  CHECK(p.a.qp->req.cwnd == std::max<uint32_t>(full / 2, 32));
  CHECK(counter(Counter::timeouts) == 0);
}

TEST_CASE("a receiver that stops running for milliseconds is not taken for a loss: the timer's packets go alone, nothing goes back N", "[sim]") {
  Pair p(6);
  p.a.qp->attr.timeout = 20;   // Local ACK Timeout 4.3 s: only the retransmission timer acts
  constexpr size_t kMsgs = 48;
  std::vector<uint8_t> buf(100, 1), rx(128 * (kMsgs + 1));
  size_t done = 0;
  auto completed = [&](size_t n) {
    return [&, n] {
      for (const Completion &c : drain(p.a.scq)) done += c.status == WcStatus::success;
      return done == n;
    };
  };
  auto ctr = [&](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  // (The receives first: the round trip's ACK gives their credits.)
  for (uint64_t id = 1; id <= kMsgs; id++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * id, 128, id)) == 0);
  post_small_send(p, buf, rx, 0);   // a round trip measured
  REQUIRE(p.run(completed(1)));
  // b is descheduled for 5 ms: its datagrams wait for it, and a's timers
  // run (the probe, then the retransmission timer).
  for (uint64_t id = 1; id <= kMsgs; id++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(buf.data(), 100, id)) == 0);
  const uint64_t resent0 = ctr(p.a, Counter::retransmits), t_end = p.net.now() + 5'000'000;
  while (p.net.now() < t_end) {
    p.a.e->progress();
    p.net.advance(std::max<uint64_t>(std::min(p.a.e->next_deadline(), t_end) - p.net.now(), 100));
  }
  const uint64_t alone = ctr(p.a, Counter::probes) + ctr(p.a, Counter::rto_resends);
  REQUIRE(alone >= 2);
  CHECK(ctr(p.a, Counter::retransmits) - resent0 == alone);
  // Back, it takes one datagram per pass at first, as a host that has just
  // been idle does: its first ACK answers the oldest packet's first
  // sending alone, and the rest follows.
  p.net.set_rx_batch(p.b.e->nic().local(), 1);
  REQUIRE(p.run(completed(kMsgs + 1)));
  CHECK(ctr(p.a, Counter::retransmits) - resent0 == alone);   // nothing went back N
  CHECK(ctr(p.b, Counter::duplicates) == alone);
  for (const Completion &c : drain(p.b.rcq)) CHECK(c.status == WcStatus::success);
}

TEST_CASE("READs and ATOMICs in flight to a responder that stops running: the timer resends the oldest alone, nothing goes back N, none executes twice", "[sim]") {
  Pair p(7);
  p.a.qp->attr.timeout = 20;   // Local ACK Timeout 4.3 s: only the retransmission timer acts
  p.a.qp->attr.max_rd_atomic = 16;
  const bool atomic = GENERATE(false, true);
  constexpr uint64_t kOps = 16;
  alignas(8) uint64_t word = 1000;
  std::vector<uint8_t> remote(kOps * 2048), local(kOps * 2048, 0);
  for (size_t i = 0; i < remote.size(); i++) remote[i] = uint8_t(i * 7 + 1);
  p.b.mem.regions[3] = {reinterpret_cast<uint8_t *>(&word), 0x2000, 8, kAccessRemoteAtomic};
  p.b.mem.regions[4] = {remote.data(), 0x100000, remote.size(), kAccessRemoteRead};
  p.b.qp->attr.access = kAccessRemoteAtomic | kAccessRemoteRead;
  std::vector<uint64_t> orig(kOps + 1, 0);
  auto post = [&](uint64_t i) {
    SendWr w = atomic ? rdma_wr(WrOpcode::atomic_fetch_add, reinterpret_cast<uint8_t *>(&orig[i]), 8, 0x2000, 3, i)
                      : rdma_wr(WrOpcode::rdma_read, local.data() + i * 2048 % local.size(), 2048,
                                0x100000 + i * 2048 % remote.size(), 4, i);   // two packets each
    w.compare_add = 3;
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  };
  std::vector<Completion> sc;
  auto ctr = [&](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  post(kOps);   // a round trip measured
  REQUIRE(p.collect(sc, 1));
  // b is descheduled for 5 ms with them all in flight: a's timer runs.
  for (uint64_t i = 0; i < kOps; i++) post(i);
  const uint64_t resent0 = ctr(p.a, Counter::retransmits), t_end = p.net.now() + 5'000'000;
  while (p.net.now() < t_end) {
    p.a.e->progress();
    p.net.advance(std::max<uint64_t>(std::min(p.a.e->next_deadline(), t_end) - p.net.now(), 100));
  }
  const uint64_t alone = ctr(p.a, Counter::rto_resends);
  REQUIRE(alone >= 1);
  CHECK(ctr(p.a, Counter::retransmits) - resent0 == alone);   // one request each time
  // Back, it answers the originals first (one datagram per pass at
  // first), then each duplicate from the request it saved.
  p.net.set_rx_batch(p.b.e->nic().local(), 1);
  REQUIRE(p.collect(sc, kOps + 1));
  for (const Completion &c : sc) CHECK(c.status == WcStatus::success);
  CHECK(ctr(p.a, Counter::retransmits) - resent0 == alone);   // nothing went back N
  CHECK(ctr(p.b, Counter::duplicates) == alone);
  if (atomic) {
    CHECK(word == 1000 + 3 * (kOps + 1));   // each add once
    for (uint64_t i = 0; i < kOps; i++) CHECK(orig[i] == 1000 + 3 * (i + 1));
  } else {
    CHECK(std::memcmp(local.data(), remote.data(), remote.size()) == 0);
  }
}

TEST_CASE("RNR: no receive WQE, rnr_retry exhausted gives RNR_RETRY_EXC_ERR", "[sim]") {
  Pair p(4);
  p.a.qp->attr.rnr_retry = 2;
  p.a.qp->comp.rnr_left = 2;
  p.b.qp->attr.min_rnr_timer = 24;   // 40.96 ms in each RNR NAK
  SendWr w;
  w.wr_id = 1;
  w.flags = kSignaled;
  const uint64_t t0 = p.net.now();
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  std::vector<Completion> sc;
  REQUIRE(p.collect(sc, 1));
  CHECK(sc[0].status == WcStatus::rnr_retry_exc_err);
  CHECK(p.b.e->counters[uint32_t(Counter::rnr_naks_sent)] == 3);
  // The requester waited the NAK's time (IBA table 45) twice, no longer.
  const uint64_t elapsed = p.net.now() - t0;
  CHECK(elapsed >= 2 * rnr_timer_ns(24));
  CHECK(elapsed < 2 * rnr_timer_ns(24) + 1'000'000);
}

TEST_CASE("RNR with rnr_retry 7 waits until a receive is posted", "[sim]") {
  Pair p(6);
  std::vector<uint8_t> tx(3000, 0x5a), rx(3000, 0);
  SendWr w;
  w.wr_id = 1;
  w.flags = kSignaled;
  w.num_sge = 1;
  w.sge[0] = {tx.data(), 3000};
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  p.run([] { return false; }, p.net.now() + 5'000'000);   // 5 ms of RNR NAKs
  CHECK(p.b.e->counters[uint32_t(Counter::rnr_naks_sent)] > 10);
  CHECK(drain(p.a.scq).empty());
  RecvWr r;
  r.wr_id = 2;
  r.num_sge = 1;
  r.sge[0] = {rx.data(), 3000};
  REQUIRE(p.b.e->post_recv(*p.b.qp, r) == 0);
  std::vector<Completion> sc;
  REQUIRE(p.collect(sc, 1));
  CHECK(sc[0].status == WcStatus::success);
  CHECK(rx == tx);
}

TEST_CASE("after an RNR NAK the packet it names is resent alone: a responder that kept the rest takes them all", "[sim]") {
  Pair p(7);
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  const bool keeps = GENERATE(true, false);
  if (!keeps) p.b.e->hold_max = 0;   // (USRC_RX_HOLD=0, or rxe: dropped, then go-back-N)
  constexpr int kN = 48;
  std::vector<uint8_t> tx(kN * 100), rx(kN * 128, 0);
  for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 7 + 1);
  for (int i = 0; i < kN; i++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data() + 100 * i, 100, i)) == 0);
  p.run([] { return false; }, p.net.now() + 1'000'000);   // 1 ms with no receive posted
  REQUIRE(ctr(p.a, Counter::rnr_naks_rcvd) > 10);
  const uint64_t resent = ctr(p.a, Counter::retransmits);
  CHECK(resent <= ctr(p.a, Counter::rnr_naks_rcvd));   // the named packet, once a NAK
  for (int i = 0; i < kN; i++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * i, 128, i)) == 0);
  std::vector<Completion> sc, rc;
  REQUIRE(p.collect(sc, kN, &rc, kN));
  for (int i = 0; i < kN; i++) {
    CHECK(sc[i].status == WcStatus::success);
    REQUIRE(rc[i].status == WcStatus::success);
    REQUIRE(rc[i].wr_id == uint64_t(i));   // in order, once each
    REQUIRE(rc[i].byte_len == 100);
    REQUIRE(std::memcmp(rx.data() + 128 * i, tx.data() + 100 * i, 100) == 0);
  }
  if (keeps) {
    CHECK(ctr(p.b, Counter::held) == kN - 1);
    CHECK(ctr(p.a, Counter::retransmits) - resent <= 1);   // the named one, taken now
    CHECK(ctr(p.b, Counter::duplicates) == 0);
  } else {
    CHECK(ctr(p.a, Counter::retransmits) - resent >= kN - 1);   // the rest, back N
  }
}

TEST_CASE("end-to-end credits: no SEND goes beyond the receives the responder's ACKs count, so none is dropped after an RNR NAK", "[sim]") {
  Pair p(12);
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  p.b.e->hold_max = 0;   // (it drops what follows a refused packet, as rxe does)
  constexpr int kN = 48, kFirst = 8;
  std::vector<uint8_t> tx(kN * 100), rx(kN * 128, 0);
  for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 5 + 3);
  auto recv = [&](int i) { REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * i, 128, i)) == 0); };
  for (int i = 0; i < kFirst; i++) recv(i);
  // The first message's ACK gives b's credits (the WQEs left: 7).
  REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 100, 0)) == 0);
  std::vector<Completion> sc, rc;
  REQUIRE(p.collect(sc, 1, &rc, 1));
  CHECK(p.a.qp->req.limited);
  // All the rest at once: the 7 the credits cover go, then one at a time
  // (RNR NAKs, each for the one packet sent), until b posts more.
  for (int i = 1; i < kN; i++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data() + 100 * i, 100, i)) == 0);
  p.run([] { return false; }, p.net.now() + 1'000'000);
  CHECK(rc.size() + drain(p.b.rcq).size() == kFirst);
  REQUIRE(ctr(p.a, Counter::rnr_naks_rcvd) > 0);
  for (int i = kFirst; i < kN; i++) recv(i);
  REQUIRE(p.collect(sc, kN));
  for (int i = 0; i < kN; i++) {
    CHECK(sc[i].status == WcStatus::success);
    REQUIRE(std::memcmp(rx.data() + 128 * i, tx.data() + 100 * i, 100) == 0);
  }
  // Every resend was the one packet an RNR NAK named: nothing had followed it.
  CHECK(ctr(p.a, Counter::retransmits) == ctr(p.a, Counter::rnr_naks_rcvd));
  CHECK(ctr(p.b, Counter::duplicates) == 0);
}

// A responder that sent an RNR NAK says so, by an ACK with its credits,
// once a receive is posted: the requester's wait ends there, not when the
// NAK's timer (here 41 ms) runs out.
TEST_CASE("after an RNR NAK, the ACK of the receives posted ends the requester's wait", "[sim]") {
  Pair p(13);
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  p.b.qp->attr.min_rnr_timer = 24;   // 40.96 ms in each RNR NAK
  std::vector<uint8_t> tx(4 * 100), rx(4 * 128, 0);
  for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 3 + 7);
  const bool acked_before = GENERATE(false, true);   // credits known before, or never told
  std::vector<Completion> sc, rc;
  int n = 0;
  if (acked_before) {
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 128, 0)) == 0);
    REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 100, 0)) == 0);
    REQUIRE(p.collect(sc, 1, &rc, 1));
    n = 1;
  }
  for (int i = n; i < 4; i++) REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data() + 100 * i, 100, i)) == 0);
  p.run([] { return false; }, p.net.now() + 1'000'000);
  REQUIRE(ctr(p.a, Counter::rnr_naks_rcvd) == 1);
  const uint64_t t0 = p.net.now();
  for (int i = n; i < 4; i++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * i, 128, i)) == 0);
  REQUIRE(p.collect(sc, 4, &rc, 4));
  CHECK(p.net.now() - t0 < rnr_timer_ns(24) / 4);
  for (int i = 0; i < 4; i++) {
    CHECK(sc[i].status == WcStatus::success);
    REQUIRE(std::memcmp(rx.data() + 128 * i, tx.data() + 100 * i, 100) == 0);
  }
  CHECK(ctr(p.a, Counter::rnr_naks_rcvd) == 1);
}

TEST_CASE("a message longer than the receive buffer fails both sides", "[sim]") {
  Pair p(8);
  std::vector<uint8_t> tx(2000, 1), rx(1000, 0);
  RecvWr r;
  r.wr_id = 2;
  r.num_sge = 1;
  r.sge[0] = {rx.data(), 1000};
  REQUIRE(p.b.e->post_recv(*p.b.qp, r) == 0);
  SendWr w;
  w.wr_id = 1;
  w.flags = kSignaled;
  w.num_sge = 1;
  w.sge[0] = {tx.data(), 2000};
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  std::vector<Completion> sc, rcv;
  REQUIRE(p.collect(sc, 1, &rcv, 1));
  CHECK(sc[0].status == WcStatus::rem_inv_req_err);
  CHECK(rcv[0].status == WcStatus::loc_len_err);
  CHECK(p.a.qp->state == QpState::err);
}

TEST_CASE("RDMA WRITE lands byte-exact; WRITE with immediate consumes a receive", "[sim]") {
  net::SimFaults f;
  f.drop = 0.05;
  Pair p(9, f);
  std::vector<uint8_t> target(100000, 0), src(70000);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 7);
  p.b.mem.regions[77] = {target.data(), 0x10000, target.size(), kAccessRemoteWrite};
  RecvWr r;
  r.wr_id = 5;
  REQUIRE(p.b.e->post_recv(*p.b.qp, r) == 0);
  SendWr w;
  w.wr_id = 1;
  w.opcode = WrOpcode::rdma_write;
  w.flags = kSignaled;
  w.remote_va = 0x10000 + 100;
  w.rkey = 77;
  w.num_sge = 1;
  w.sge[0] = {src.data(), 50000};
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  w.wr_id = 2;
  w.opcode = WrOpcode::rdma_write_imm;
  w.imm_be = 0xabcd;
  w.remote_va = 0x10000 + 60000;
  w.sge[0] = {src.data() + 50000, 20000};
  REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  std::vector<Completion> sc, rcv;
  REQUIRE(p.collect(sc, 2, &rcv, 1));
  CHECK(sc[0].status == WcStatus::success);
  CHECK(sc[1].status == WcStatus::success);
  CHECK(sc[0].opcode == WcOpcode::rdma_write);
  CHECK(rcv[0].opcode == WcOpcode::recv_rdma_with_imm);
  CHECK(rcv[0].imm_be == 0xabcd);
  CHECK(rcv[0].byte_len == 20000);
  CHECK(std::memcmp(target.data() + 100, src.data(), 50000) == 0);
  CHECK(std::memcmp(target.data() + 60000, src.data() + 50000, 20000) == 0);
  CHECK(target[99] == 0);
  CHECK(target[50100] == 0);
  CHECK(target[80000] == 0);
}

TEST_CASE("a rate-limited QP is paced at its rate, neither faster nor slower", "[sim]") {
  Pair p(10);
  p.a.qp->attr.rate_bps = 200'000'000;   // IBV_QP_RATE_LIMIT 200000 kbit/s
  std::vector<uint8_t> target(1 << 20), src(1 << 20, 3);
  p.b.mem.regions[77] = {target.data(), 0x10000, target.size(), kAccessRemoteWrite};
  const uint64_t t0 = p.net.now();
  for (int i = 0; i < 4; i++) {
    SendWr w;
    w.wr_id = uint64_t(i);
    w.opcode = WrOpcode::rdma_write;
    w.flags = kSignaled;
    w.remote_va = 0x10000;
    w.rkey = 77;
    w.num_sge = 1;
    w.sge[0] = {src.data(), uint32_t(src.size())};
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  }
  std::vector<Completion> sc;
  REQUIRE(p.collect(sc, 4));
  for (auto &c : sc) CHECK(c.status == WcStatus::success);
  CHECK(target == src);
  // 4096 packets of 1 KB, each counted with 64 bytes of headers, less the
  // 64 KB burst the token bucket allows at once.
  const double paced = (4096.0 * (1024 + 64) - 65536) * 8 / 200e6 * 1e9;
  const uint64_t elapsed = p.net.now() - t0;
  INFO("4 MB in " << elapsed / 1000 << " us of virtual time; paced " << uint64_t(paced / 1000) << " us");
  CHECK(double(elapsed) >= paced * 0.98);
  CHECK(double(elapsed) <= paced * 1.05);
}

// The floor is kLossWindow, or half the QP's window where that is less.
TEST_CASE("a revealed loss halves the send window down to kLossWindow packets, or half the QP's window, no lower", "[sim]") {
  // (window, the floor it gives)
  const auto [window, floor] = GENERATE(std::pair<uint32_t, uint32_t>{64, 32}, std::pair<uint32_t, uint32_t>{256, 128},
                                        std::pair<uint32_t, uint32_t>{1024, kLossWindow});
  INFO("window " << window);
  net::SimFaults f;
  f.drop = 0.03;
  Pair p(21, f);
  p.a.qp->attr.timeout = 20;   // no Local ACK Timeout: only NAKs and the RTO act
  REQUIRE(p.a.qp->req.cwnd == 64);
  ReqState &r = p.a.qp->req;
  r.window = r.cwnd = r.ssthresh = window;
  std::vector<uint8_t> target(1 << 20, 0), src(1 << 20);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 13);
  p.b.mem.regions[5] = {target.data(), 0, target.size(), kAccessRemoteWrite};
  SendWr w;
  w.opcode = WrOpcode::rdma_write;
  w.flags = kSignaled;
  w.rkey = 5;
  w.num_sge = 1;
  for (uint32_t i = 0; i < 64; i++) {   // 64 x 16 packets
    w.wr_id = i;
    w.remote_va = i * 16384;
    w.sge[0] = {src.data() + i * 16384, 16384};
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  }
  uint32_t min_cwnd = r.cwnd;
  size_t done = 0;
  REQUIRE(p.run([&] {
    min_cwnd = std::min(min_cwnd, r.cwnd);
    done += drain(p.a.scq).size();
    return done == 64;
  }));
  CHECK(p.a.e->counters[uint32_t(Counter::seq_naks_rcvd)] >= 5);
  CHECK(p.a.e->counters[uint32_t(Counter::timeouts)] == 0);
  CHECK(min_cwnd == floor);   // halved down to the floor, never below
  CHECK(std::memcmp(target.data(), src.data(), src.size()) == 0);
}

TEST_CASE("after a loss, a QP that only READs grows its send window back as the responses come", "[sim]") {
  net::SimFaults f;
  f.drop = 0.03;
  Pair p(23, f);
  p.a.qp->attr.timeout = 20;   // no Local ACK Timeout: only implied NAKs and the RTO act
  REQUIRE(p.a.qp->req.cwnd == 64);
  std::vector<uint8_t> remote(1 << 20), local(1 << 20, 0);
  for (size_t i = 0; i < remote.size(); i++) remote[i] = uint8_t(i * 7 + 1);
  p.b.mem.regions[9] = {remote.data(), 0x100000, remote.size(), kAccessRemoteRead};
  p.b.qp->attr.access = kAccessRemoteRead;
  // 64 READs of 16 packets each, then as many again; returns the smallest
  // window seen meanwhile.
  auto reads = [&] {
    for (uint32_t i = 0; i < 64; i++)
      REQUIRE(p.a.e->post_send(*p.a.qp, rdma_wr(WrOpcode::rdma_read, local.data() + i * 16384, 16384,
                                                 0x100000 + i * 16384, 9, i)) == 0);
    uint32_t least = p.a.qp->req.cwnd;
    size_t done = 0;
    REQUIRE(p.run([&] {
      least = std::min(least, p.a.qp->req.cwnd);
      for (const Completion &c : drain(p.a.scq)) done += c.status == WcStatus::success;
      return done == 64;
    }));
    return least;
  };
  CHECK(reads() < 64);   // lost responses: the window fell
  REQUIRE(p.a.e->counters[uint32_t(Counter::implied_naks)] + p.a.e->counters[uint32_t(Counter::rto_resends)] > 0);
  p.net.set_faults({});
  for (int round = 0; round < 3; round++) reads();
  INFO("ssthresh " << p.a.qp->req.ssthresh);
  CHECK(p.a.qp->req.cwnd == 64);
  CHECK(std::memcmp(local.data(), remote.data(), local.size()) == 0);
}

// Four 16 KB RDMA WRITEs (64 packets of 1 KB) from a to b; the first
// transmission of each request packet whose PSN is in lose is dropped
// (0x800000: the first sequence NAK). Returns whether all four completed
// and landed byte-exact.
static bool write_losing(Pair &p, std::vector<uint32_t> lose) {
  std::vector<uint8_t> target(65536, 0), src(65536);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 11 + 3);
  p.b.mem.regions[6] = {target.data(), 0, target.size(), kAccessRemoteWrite};
  p.net.drop_if = [&lose](const std::vector<uint8_t> &d) {
    if (d.size() < 13) return false;
    const bool nak = d[0] == uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && d[12] == wire::aeth_nak(wire::NAK_PSN_SEQ);
    if (d[0] == uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && !nak) return false;
    const uint32_t psn = nak ? 0x800000u : wire::bth::psn(d.data());
    const auto it = std::find(lose.begin(), lose.end(), psn);
    if (it == lose.end()) return false;
    lose.erase(it);   // (once)
    return true;
  };
  SendWr w;
  w.opcode = WrOpcode::rdma_write;
  w.flags = kSignaled;
  w.rkey = 6;
  w.num_sge = 1;
  for (uint32_t i = 0; i < 4; i++) {
    w.wr_id = i;
    w.remote_va = i * 16384;
    w.sge[0] = {src.data() + i * 16384, 16384};
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  }
  std::vector<Completion> sc;
  const bool ok = p.collect(sc, 4);
  p.net.drop_if = nullptr;
  for (const Completion &c : sc) CHECK(c.status == WcStatus::success);
  return ok && lose.empty() && std::memcmp(target.data(), src.data(), src.size()) == 0;
}

TEST_CASE("a lost packet is resent alone: the responder keeps the ones after it", "[sim]") {
  Pair p(31);
  p.a.qp->attr.timeout = 20;   // no Local ACK Timeout: only the NAK acts
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  REQUIRE(write_losing(p, {10}));
  CHECK(ctr(p.b, Counter::seq_naks_sent) == 1);
  CHECK(ctr(p.b, Counter::held) > 8);          // the packets after it in flight
  CHECK(ctr(p.a, Counter::retransmits) == 1);  // the lost one, no more
  CHECK(ctr(p.a, Counter::selective_resends) == 1);
  CHECK(ctr(p.a, Counter::rto_resends) == 0);
  CHECK(p.b.qp->resp.held == 0);

  SECTION("two gaps: each NAKed once it is the next, each resent alone") {
    REQUIRE(write_losing(p, {64 + 5, 64 + 9}));
    CHECK(ctr(p.b, Counter::seq_naks_sent) == 3);
    CHECK(ctr(p.a, Counter::retransmits) == 3);
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
  }
  SECTION("a run of losses: resent from its second packet on, once") {
    const uint64_t naks = ctr(p.b, Counter::seq_naks_sent);
    const uint64_t resent = ctr(p.a, Counter::retransmits);
    REQUIRE(write_losing(p, {64 + 5, 64 + 6, 64 + 7, 64 + 8, 64 + 9, 64 + 10}));
    CHECK(ctr(p.b, Counter::seq_naks_sent) <= naks + 2);   // not one per packet
    CHECK(ctr(p.a, Counter::selective_resends) == 2);      // the first, alone
    CHECK(ctr(p.a, Counter::retransmits) - resent > 6);
    CHECK(ctr(p.a, Counter::retransmits) - resent <= 64);   // one go-back
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
    CHECK(ctr(p.a, Counter::probes) == 0);
    // Still answered alone next time: the peer keeps packets.
    REQUIRE(write_losing(p, {128 + 5}));
    CHECK(ctr(p.a, Counter::selective_resends) == 3);
  }
  SECTION("no room to keep them all: NAKed after the drain, then go-back-N from there") {
    // Near the end: nothing new to send would reveal the packets dropped.
    p.b.e->hold_max = 4;
    const uint64_t t0 = p.net.now(), resent = ctr(p.a, Counter::retransmits);
    const uint64_t naks = ctr(p.b, Counter::seq_naks_sent);
    REQUIRE(write_losing(p, {64 + 52}));   // 53-56 kept, 57-63 dropped
    CHECK(p.net.now() - t0 < 1'000'000);
    CHECK(ctr(p.b, Counter::seq_naks_sent) == naks + 2);
    CHECK(ctr(p.a, Counter::probes) == 0);
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
    CHECK(ctr(p.a, Counter::retransmits) - resent == 1 + 7);   // (not one per round trip)
  }
  SECTION("the resend lost too, or the NAK: the probe resends it alone") {
    const bool nak = GENERATE(false, true);
    const uint64_t t0 = p.net.now();
    REQUIRE(write_losing(p, {64 + 5, nak ? 0x800000u : 64 + 5}));
    CHECK(p.net.now() - t0 < 1'000'000);
    CHECK(ctr(p.a, Counter::probes) == 1);
    CHECK(ctr(p.a, Counter::retransmits) == (nak ? 2 : 3));
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
    CHECK(p.b.qp->resp.held == 0);
  }
}

// Between two usrc peers whose NICs checksum, a sequence NAK says how many
// PSNs are missing (wire::bth::hole): a segmented send lost whole is
// resent at once, not one packet a round trip and then the window.
TEST_CASE("a run of lost packets is resent at once, the NAK saying how long it is", "[sim]") {
  net::SimFaults f;
  f.udp_checksum = true;
  Pair p(36, f);
  p.a.qp->attr.timeout = 20;
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  std::vector<uint32_t> holes;   // of the sequence NAKs b sent
  p.net.tap = [&](const std::vector<uint8_t> &d) {
    if (d.size() >= 16 && d[0] == uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && d[12] == wire::aeth_nak(wire::NAK_PSN_SEQ))
      holes.push_back(wire::bth::hole(d.data()));
  };
  SECTION("one run") {
    REQUIRE(write_losing(p, {10, 11, 12, 13, 14, 15}));
    CHECK(holes == std::vector<uint32_t>{6});
    CHECK(ctr(p.a, Counter::retransmits) == 6);   // those, no more
    CHECK(ctr(p.a, Counter::selective_resends) == 1);
  }
  SECTION("two runs: the second NAKed once the first is taken, with its own length") {
    REQUIRE(write_losing(p, {10, 11, 12, 20, 21}));
    CHECK(holes == std::vector<uint32_t>{3, 2});
    CHECK(ctr(p.a, Counter::retransmits) == 5);
    CHECK(ctr(p.a, Counter::selective_resends) == 2);
  }
  SECTION("a run that ends the sending: no NAK, the probe, then the rest") {
    REQUIRE(write_losing(p, {60, 61, 62, 63}));
    CHECK(holes.empty());
    CHECK(ctr(p.a, Counter::retransmits) == 4);
  }
  CHECK(ctr(p.a, Counter::rto_resends) == 0);
  CHECK(p.b.qp->resp.held == 0);
}

// (A requester that goes back N may resend what such an ACK covered after
// the ACK reached it; rxe 6.1 then waits for the resend's own ACK, and
// hangs if the resend is lost. Engine::ack_again.)
TEST_CASE("after taking packets kept beyond a gap, the last ACK goes again while the requester is quiet", "[sim]") {
  Pair p(33);
  p.a.qp->attr.timeout = 20;
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  std::vector<uint64_t> at;   // when b's ACKs of PSN 63 left
  p.net.tap = [&](const std::vector<uint8_t> &d) {
    if (d.size() >= 12 && d[0] == uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && wire::bth::psn(d.data()) == 63)
      at.push_back(p.net.now());
  };
  REQUIRE(write_losing(p, {62}));   // 63 kept, then taken after 62's resend
  REQUIRE(ctr(p.b, Counter::held) == 1);
  CHECK(ctr(p.b, Counter::acks_again) == 0);
  SECTION("nothing more arrives: four times, 1, 4, 16 and 64 ms apart") {
    p.run([] { return false; }, p.net.now() + 500'000'000);
    CHECK(ctr(p.b, Counter::acks_again) == 4);
    REQUIRE(at.size() == 5);
    for (size_t i = 1; i < at.size(); i++) CHECK(at[i] - at[i - 1] >= (1'000'000ull << (2 * (i - 1))));
    CHECK(ctr(p.a, Counter::retransmits) == 1);   // (taken as duplicate ACKs)
    CHECK(drain(p.a.scq).empty());
  }
  SECTION("a new request ends it") {
    REQUIRE(write_losing(p, {}));
    p.run([] { return false; }, p.net.now() + 500'000'000);
    CHECK(ctr(p.b, Counter::acks_again) == 0);
  }
}

TEST_CASE("a responder that keeps nothing after a gap gets go-back-N", "[sim]") {
  Pair p(32);
  p.a.qp->attr.timeout = 20;
  p.b.e->hold_max = 0;   // USRC_RX_HOLD=0: drops what follows a gap, as IBA allows
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  SECTION("a NAK") {
    REQUIRE(write_losing(p, {10}));
    // The lost one was resent alone, and its ACK took it alone, though
    // more had been sent after it: everything from there was resent at once.
    CHECK(ctr(p.b, Counter::held) == 0);
    CHECK(ctr(p.b, Counter::seq_naks_sent) == 1);
    CHECK(ctr(p.a, Counter::selective_resends) == 1);
    CHECK(ctr(p.a, Counter::retransmits) > 8);
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
    // The next loss goes back N at once.
    const uint64_t naks = ctr(p.b, Counter::seq_naks_sent);
    REQUIRE(write_losing(p, {64 + 10}));
    CHECK(ctr(p.b, Counter::seq_naks_sent) == naks + 1);
    CHECK(ctr(p.a, Counter::selective_resends) == 1);
  }
  SECTION("a lost NAK: the probe, then go-back-N from there") {
    const uint64_t t0 = p.net.now();
    REQUIRE(write_losing(p, {52, 0x800000}));
    CHECK(p.net.now() - t0 < 1'000'000);
    CHECK(ctr(p.a, Counter::probes) == 1);   // (not one per packet)
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
    CHECK(ctr(p.a, Counter::retransmits) == 12);   // 52 alone, then 53-63
  }
}

TEST_CASE("packets kept beyond a gap: PSN rollover, an RNR on the way, an error", "[sim]") {
  auto ctr = [](Side &s, Counter c) { return s.e->counters[uint32_t(c)]; };
  SECTION("PSNs roll over inside the window") {
    Pair p(33, {}, 1024, 0xffffe0, 0);
    p.a.qp->attr.timeout = 20;
    REQUIRE(write_losing(p, {0xfffff0, 0x000005}));
    CHECK(ctr(p.b, Counter::held) > 16);
    CHECK(ctr(p.a, Counter::retransmits) == 2);
    CHECK(ctr(p.a, Counter::rto_resends) == 0);
  }
  SECTION("SENDs beyond a gap, with receives for only some of them") {
    Pair p(34);
    std::vector<uint8_t> tx(6 * 2000), rx(6 * 2048, 0);
    for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 5 + 1);
    for (uint64_t i = 0; i < 2; i++)
      REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 2048 * i, 2048, i)) == 0);
    bool lost = false;
    p.net.drop_if = [&lost](const std::vector<uint8_t> &d) {
      if (lost || d[0] == uint8_t(wire::Opcode::RC_ACKNOWLEDGE)) return false;
      return lost = true;   // the first request packet
    };
    for (uint64_t i = 0; i < 6; i++)   // two packets each
      REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data() + 2000 * i, 2000, i)) == 0);
    REQUIRE(p.run([&] { return ctr(p.b, Counter::rnr_naks_sent) > 0; }));
    p.net.drop_if = nullptr;
    CHECK(ctr(p.b, Counter::held) > 0);
    for (uint64_t i = 2; i < 6; i++)
      REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 2048 * i, 2048, i)) == 0);
    std::vector<Completion> sc, rcv;
    REQUIRE(p.collect(sc, 6, &rcv, 6));
    for (uint64_t i = 0; i < 6; i++) {
      CHECK(sc[i].status == WcStatus::success);
      CHECK(rcv[i].wr_id == i);   // in order, once
      CHECK(rcv[i].byte_len == 2000);
      CHECK(std::memcmp(rx.data() + 2048 * i, tx.data() + 2000 * i, 2000) == 0);
    }
    CHECK(p.b.qp->resp.held == 0);
  }
  SECTION("the responder's QP fails: what it kept goes") {
    Pair p(35);
    std::vector<uint8_t> target(65536, 0), src(65536, 7);
    p.b.mem.regions[6] = {target.data(), 0, target.size(), kAccessRemoteWrite};
    p.net.drop_if = [](const std::vector<uint8_t> &d) {   // every sending of PSN 3
      return d[0] != uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && wire::bth::psn(d.data()) == 3;
    };
    SendWr w;
    w.opcode = WrOpcode::rdma_write;
    w.rkey = 6;
    w.num_sge = 1;
    w.sge[0] = {src.data(), 16384};
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
    REQUIRE(p.run([&] { return p.b.qp->resp.held >= 12; }));
    p.b.e->set_state(*p.b.qp, QpState::err);
    CHECK(p.b.qp->resp.held == 0);
    p.net.drop_if = nullptr;
    p.b.e->destroy_qp(p.b.qp);
    p.run([] { return false; }, p.net.now() + 10'000'000);
    CHECK(target[2 * 1024] == 7);       // taken in order before the gap
    CHECK(target[4 * 1024] == 0);       // kept, never taken
    CHECK(target[15 * 1024] == 0);
  }
}

TEST_CASE("an RDMA WRITE outside the region or with a bad rkey is NAKed, nothing written", "[sim]") {
  for (int variant = 0; variant < 3; variant++) {
    DYNAMIC_SECTION("variant " << variant) {
      Pair p(10 + variant);
      std::vector<uint8_t> target(4096, 0), src(4096, 9);
      p.b.mem.regions[5] = {target.data(), 0x1000, target.size(),
                            variant == 2 ? 0u : kAccessRemoteWrite};
      SendWr w;
      w.wr_id = 1;
      w.opcode = WrOpcode::rdma_write;
      w.flags = kSignaled;
      w.remote_va = variant == 1 ? 0x1000 + 1 : 0x1000;   // 1: one byte past the end
      w.rkey = variant == 0 ? 6 : 5;                     // 0: wrong rkey
      w.num_sge = 1;
      w.sge[0] = {src.data(), 4096};
      REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
      std::vector<Completion> sc;
      REQUIRE(p.collect(sc, 1));
      CHECK(sc[0].status == WcStatus::rem_access_err);
      CHECK(std::all_of(target.begin(), target.end(), [](uint8_t x) { return x == 0; }));
    }
  }
}

TEST_CASE("RDMA READ: multi-packet, byte-exact, under loss (implied NAK)", "[sim]") {
  for (double drop : {0.0, 0.05, 0.2}) {
    DYNAMIC_SECTION("drop " << drop) {
      net::SimFaults f;
      f.drop = drop;
      f.reorder = drop > 0 ? 0.05 : 0;
      Pair p(21 + uint64_t(drop * 100), f);
      p.a.qp->attr.max_rd_atomic = 4;
      p.a.qp->req.window = 16;   // large READs go in window-sized pieces
      std::vector<uint8_t> remote(300000), local(300000, 0), tail(5000, 0), tx(5000, 9);
      for (size_t i = 0; i < remote.size(); i++) remote[i] = uint8_t(i * 13 + 1);
      p.b.mem.regions[9] = {remote.data(), 0x100000, remote.size(), kAccessRemoteRead};
      p.b.qp->attr.access = kAccessRemoteRead | kAccessRemoteWrite;
      RecvWr r;
      r.wr_id = 50;
      r.num_sge = 1;
      r.sge[0] = {tail.data(), 5000};
      REQUIRE(p.b.e->post_recv(*p.b.qp, r) == 0);
      // Six READs of various sizes, then a SEND that must not overtake them.
      uint32_t off = 0;
      std::vector<std::pair<uint32_t, uint32_t>> reads;
      for (uint32_t len : {1u, 1024u, 1025u, 50000u, 0u, 100000u}) {
        REQUIRE(p.a.e->post_send(*p.a.qp, rdma_wr(WrOpcode::rdma_read, local.data() + off, len, 0x100000 + off, 9,
                                                  reads.size())) == 0);
        reads.push_back({off, len});
        off += len + 7;
      }
      SendWr s;
      s.wr_id = 100;
      s.flags = kSignaled;
      s.num_sge = 1;
      s.sge[0] = {tx.data(), 5000};
      REQUIRE(p.a.e->post_send(*p.a.qp, s) == 0);
      std::vector<Completion> sc;
      REQUIRE(p.collect(sc, reads.size() + 1));
      for (size_t i = 0; i < reads.size(); i++) {
        CHECK(sc[i].status == WcStatus::success);
        CHECK(sc[i].wr_id == i);
        CHECK(sc[i].opcode == WcOpcode::rdma_read);
        CHECK(sc[i].byte_len == reads[i].second);
        CHECK(std::memcmp(local.data() + reads[i].first, remote.data() + reads[i].first,
                          reads[i].second) == 0);
      }
      CHECK(sc.back().wr_id == 100);
      CHECK(local[1] == 0);   // the 7-byte gaps stay untouched
      if (drop > 0) CHECK(p.a.e->counters[uint32_t(Counter::retransmits)] > 0);
    }
  }
}

TEST_CASE("ATOMICs execute exactly once under duplication and loss", "[sim]") {
  net::SimFaults f;
  f.drop = 0.1;
  f.duplicate = 0.2;
  f.reorder = 0.05;
  Pair p(31, f);
  p.a.qp->attr.max_rd_atomic = 16;
  alignas(8) uint64_t word = 1000;
  p.b.mem.regions[3] = {reinterpret_cast<uint8_t *>(&word), 0x2000, 8, kAccessRemoteAtomic};
  p.b.qp->attr.access = kAccessRemoteAtomic;
  const int n = 200;
  std::vector<uint64_t> orig(n + 1, 0);
  for (int i = 0; i < n; i++) {
    SendWr w = rdma_wr(WrOpcode::atomic_fetch_add, reinterpret_cast<uint8_t *>(&orig[i]), 8, 0x2000, 3, i);
    w.compare_add = 3;
    REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
  }
  // A compare-and-swap that succeeds, after all the adds.
  SendWr c;
  c.wr_id = n;
  c.opcode = WrOpcode::atomic_cmp_swp;
  c.flags = kSignaled;
  c.remote_va = 0x2000;
  c.rkey = 3;
  c.compare_add = 1000 + 3 * n;
  c.swap = 7;
  c.num_sge = 1;
  c.sge[0] = {reinterpret_cast<uint8_t *>(&orig[n]), 8};
  REQUIRE(p.a.e->post_send(*p.a.qp, c) == 0);
  std::vector<Completion> sc;
  REQUIRE(p.collect(sc, size_t(n + 1)));
  for (int i = 0; i < n; i++) {
    REQUIRE(sc[i].status == WcStatus::success);
    CHECK(orig[i] == 1000u + 3u * i);   // each add saw every earlier one, once
  }
  CHECK(sc[n].opcode == WcOpcode::comp_swap);
  CHECK(orig[n] == 1000u + 3u * n);
  CHECK(word == 7);
  CHECK(p.b.e->counters[uint32_t(Counter::duplicates)] > 0);
}

TEST_CASE("READ and ATOMIC access violations", "[sim]") {
  for (int variant = 0; variant < 3; variant++) {
    DYNAMIC_SECTION("variant " << variant) {
      Pair p(40 + variant);
      alignas(8) uint64_t words[4] = {5, 6, 7, 8};
      p.b.mem.regions[3] = {reinterpret_cast<uint8_t *>(words), 0x2000, sizeof words,
                            kAccessRemoteAtomic};
      p.b.qp->attr.access = kAccessRemoteAtomic | kAccessRemoteRead;
      uint64_t out = 0;
      SendWr w;
      w.wr_id = 1;
      w.flags = kSignaled;
      w.rkey = 3;
      w.num_sge = 1;
      w.sge[0] = {reinterpret_cast<uint8_t *>(&out), 8};
      WcStatus want = WcStatus::rem_access_err;
      if (variant == 0) {   // READ of a region without remote read
        w.opcode = WrOpcode::rdma_read;
        w.remote_va = 0x2000;
      } else if (variant == 1) {   // misaligned atomic
        w.opcode = WrOpcode::atomic_fetch_add;
        w.remote_va = 0x2004;
        want = WcStatus::rem_inv_req_err;
      } else {   // atomic past the end
        w.opcode = WrOpcode::atomic_fetch_add;
        w.remote_va = 0x2000 + sizeof words;
      }
      REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
      std::vector<Completion> sc;
      REQUIRE(p.collect(sc, 1));
      CHECK(sc[0].status == want);
      CHECK(words[0] == 5);
      CHECK(words[3] == 8);
      CHECK(out == 0);
    }
  }
}

// A SEND ONLY of 64 bytes to qpn with psn, from src to dst, as anyone could
// build it: with its ICRC, or 0 where a same-host sender leaves it out;
// b4, BTH byte 4's bits (F, B, resv6).
static void send_forged(net::SimNetwork &net, net::Endpoint src, net::Endpoint dst, uint32_t qpn,
                        uint32_t psn, bool icrc, uint8_t b4 = 0, size_t behind = 0) {
  std::vector<uint8_t> b(wire::kBthLen + 64 + wire::kIcrcLen, 0xee);
  const uint32_t w[3] = {htonl(uint32_t(wire::Opcode::RC_SEND_ONLY) << 24 | 0xffff), htonl(qpn),
                         htonl(0x80000000u | psn)};
  std::memcpy(b.data(), w, sizeof w);
  b[4] = b4;
  iovec v{b.data(), b.size() - wire::kIcrcLen};
  wire::store_icrc(b.data() + v.iov_len, icrc ? wire::icrc_ipv4({src.ip, dst.ip, src.port, dst.port}, &v, 1) : 0);
  b.resize(b.size() + behind, 0);   // (fill: wire::bth::fill)
  net::SimNic nic(net, src);
  iovec all{b.data(), b.size()};
  REQUIRE(nic.send({std::array{net::TxPacket{dst, &all, 1}}.data(), 1}) == 1);
}

// The ICRC on same-host paths (net::Nic::same_host), and between NICs that
// checksum their datagrams (net::Nic::udp_checksummed): left out; a missing
// one accepted only from this host, or with the peer's word over such a NIC.
TEST_CASE("packets to a peer on this host carry no ICRC, nor to one that takes a UDP checksum for it; elsewhere a missing or wrong one is dropped", "[sim]") {
  auto icrc_of = [](const std::vector<uint8_t> &d) {
    uint32_t v = 0;
    if (d.size() >= 4) std::memcpy(&v, d.data() + d.size() - 4, 4);
    return v;
  };
  SECTION("same host: none computed, none needed") {
    Pair p(21);
    p.same_host();
    uint64_t with_icrc = 0, total = 0;
    p.net.tap = [&](const std::vector<uint8_t> &d) { total++, with_icrc += icrc_of(d) != 0; };
    send_messages(p, 50, 5000, 4);
    CHECK(total > 50);
    CHECK(with_icrc == 0);
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 0);
  }
  SECTION("same host, an ICRC there (USRC_ICRC_LOCAL) is still verified") {
    net::SimFaults f;
    f.corrupt = 0.05;
    Pair p(22, f);
    p.net.loopback = true;
    uint64_t with_icrc = 0, total = 0;
    p.net.tap = [&](const std::vector<uint8_t> &d) { total++, with_icrc += icrc_of(d) != 0; };
    send_messages(p, 100, 3000, 5);   // byte-exact despite the corruption
    CHECK(with_icrc == total);
    CHECK(p.a.e->counters[uint32_t(Counter::malformed_drops)] +
              p.b.e->counters[uint32_t(Counter::malformed_drops)] > 0);
  }
  SECTION("from another host, a packet without an ICRC is dropped") {
    Pair p(23);
    p.a.qp->local.same_host = true;   // a sender wrongly taking b for local
    std::vector<uint8_t> buf(100, 1), rx(128);
    post_small_send(p, buf, rx, 0);
    CHECK_FALSE(p.run([&] { return !drain(p.b.rcq).empty(); }, 50'000'000));
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] > 0);
  }
  SECTION("another host, both NICs checksumming their datagrams: none once the peer has said it takes that") {
    net::SimFaults f;
    f.corrupt = 0.05;
    f.udp_checksum = true;
    Pair p(24, f);
    uint64_t marked = 0, without = 0, total = 0;
    bool first_has = false;
    p.net.tap = [&](const std::vector<uint8_t> &d) {
      if (total++ == 0) first_has = icrc_of(d) != 0;
      marked += d.size() > 4 && (d[4] & wire::bth::kIcrcOptional);
      without += icrc_of(d) == 0;
    };
    send_messages(p, 100, 3000, 6);   // byte-exact despite the corruption
    CHECK(first_has);                 // (before a word from its peer)
    CHECK(marked == total);
    CHECK(without > total / 2);
    CHECK(p.net.stats.corrupted > 0);   // (caught by the checksum, not the ICRC)
    CHECK(p.a.e->counters[uint32_t(Counter::malformed_drops)] + p.b.e->counters[uint32_t(Counter::malformed_drops)] == 0);
  }
  SECTION("a packet without an ICRC is dropped where the NIC checks no UDP checksum, whatever it says") {
    Pair p(25);
    std::vector<uint8_t> rx(128);
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 128)) == 0);
    const net::Endpoint ea = p.b.qp->attr.peer, eb = p.a.qp->attr.peer;
    send_forged(p.net, ea, eb, p.b.qp->qpn, p.b.qp->resp.epsn, false, wire::bth::kIcrcOptional);
    CHECK_FALSE(p.run([&] { return !drain(p.b.rcq).empty(); }, 50'000'000));
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 1);
    // With its ICRC it is taken: the bit is only a word to the peer.
    send_forged(p.net, ea, eb, p.b.qp->qpn, p.b.qp->resp.epsn, true, wire::bth::kIcrcOptional);
    CHECK(p.run([&] { return !drain(p.b.rcq).empty(); }, 50'000'000));
    CHECK_FALSE(p.b.qp->peer_icrc_optional);
  }
  SECTION("fill behind a packet is left out over a NIC that checksums, and more fill than packet is dropped") {
    net::SimFaults f;
    f.udp_checksum = true;
    Pair p(26, f);
    std::vector<uint8_t> rx(128);
    for (int i = 0; i < 2; i++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 128)) == 0);
    const net::Endpoint ea = p.b.qp->attr.peer, eb = p.a.qp->attr.peer;
    const uint8_t b4 = wire::bth::kIcrcOptional | 3;   // 12 bytes
    send_forged(p.net, ea, eb, p.b.qp->qpn, p.b.qp->resp.epsn, false, b4, 12);
    std::vector<Completion> rc;
    REQUIRE(p.run([&] { return !(rc = drain(p.b.rcq)).empty(); }, 50'000'000));
    CHECK(rc[0].byte_len == 64);
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 0);
    // 60 bytes of fill said on this 80-byte packet: what is left ends in
    // payload, not in its ICRC.
    send_forged(p.net, ea, eb, p.b.qp->qpn, p.b.qp->resp.epsn, false, wire::bth::kIcrcOptional | 0xf);
    CHECK_FALSE(p.run([&] { return !drain(p.b.rcq).empty(); }, 50'000'000));
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 1);
    // A header alone that says so: more fill than datagram.
    std::vector<uint8_t> bth(wire::kBthLen, 0);
    bth[0] = uint8_t(wire::Opcode::RC_SEND_ONLY);
    bth[4] = wire::bth::kIcrcOptional | 0xf;
    iovec v{bth.data(), bth.size()};
    net::SimNic nic(p.net, ea);
    REQUIRE(nic.send({std::array{net::TxPacket{eb, &v, 1}}.data(), 1}) == 1);
    CHECK_FALSE(p.run([&] { return !drain(p.b.rcq).empty(); }, 50'000'000));
    CHECK(p.b.e->counters[uint32_t(Counter::malformed_drops)] == 2);
  }
}

namespace {

// A send's iovecs as one buffer.
std::vector<uint8_t> flatten(const net::TxPacket &p) {
  std::vector<uint8_t> flat;
  for (size_t i = 0; i < p.iovcnt; i++) {
    auto *b = static_cast<const uint8_t *>(p.iov[i].iov_base);
    flat.insert(flat.end(), b, b + p.iov[i].iov_len);
  }
  return flat;
}

// A NIC with segmentation offload over the simulated network: it records
// the opcodes of the segments of each send the engine makes and delivers
// every segment as a datagram of its own.
struct GsoNic final : net::Nic, net::LocalPeers {
  net::SimNic inner;
  std::vector<std::vector<uint8_t>> sends;
  bool cheap = false;   // cheap_send(): like a shared-memory ring
  // Refuse the first segmented send and carry single datagrams from then
  // on, as the udp backend does on a route that cannot take GSO.
  bool refuse_gso = false;
  uint32_t segs = 64;
  GsoNic(net::SimNetwork &n, net::Endpoint e) : inner(n, e) {}
  net::Endpoint local() const override { return inner.local(); }
  int wait_fd() const override { return -1; }
  uint32_t gso_segments() const override { return segs; }
  bool udp_checksummed() const override { return inner.udp_checksummed(); }
  bool cheap_send(net::Endpoint) override { return cheap; }
  net::LocalPeers *local_peers() override { return this; }
  // Receive as UDP GRO does: one receive takes all that waits (up to 64
  // datagrams) and recv() hands it out a batch at a time, the rest held
  // where the NIC's fd does not show it.
  bool coalesce = false;
  std::vector<net::RxPacket> held;
  size_t held_i = 0;
  bool rx_pending() const override { return rx_held(); }
  bool rx_held() const override { return held_i < held.size(); }
  size_t recv(std::span<net::RxPacket> out) override {
    if (!coalesce) return inner.recv(out);
    if (held_i == held.size()) {
      held.resize(64);
      held.resize(inner.recv(held));
      held_i = 0;
    }
    const size_t n = std::min(out.size(), held.size() - held_i);
    std::copy_n(held.begin() + ptrdiff_t(held_i), n, out.begin());
    held_i += n;
    return n;
  }
  size_t send(std::span<const net::TxPacket> pkts) override {
    size_t n = 0;
    for (const auto &p : pkts) {
      if (refuse_gso && p.segs > 1) {
        segs = 1;   // dropped: the transport resends, one datagram each
        continue;
      }
      std::vector<uint8_t> flat = flatten(p), ops;
      const size_t seg = p.segs > 1 ? p.gso_size : flat.size();
      for (size_t off = 0; off < flat.size(); off += seg) {
        ops.push_back(flat[off]);
        iovec v{flat.data() + off, std::min(seg, flat.size() - off)};
        net::TxPacket one{p.dst, &v, 1, p.tos, p.ttl, p.src_port, 0, 1};
        n += inner.send({&one, 1});
      }
      sends.push_back(ops);
    }
    return n;
  }
};

// A peer of a build that says its UDP checksum stands for the ICRC
// (wire::bth::kIcrcOptional) but takes no fill (no kTakesFill).
struct NoFillNic final : net::NicDecorator {
  explicit NoFillNic(std::unique_ptr<net::Nic> inner) : NicDecorator(std::move(inner)) {}
  size_t send(std::span<const net::TxPacket> pkts) override {
    size_t n = 0;
    for (const auto &p : pkts) {
      std::vector<uint8_t> flat = flatten(p);
      if (flat.size() > 4) flat[4] &= uint8_t(~wire::bth::kTakesFill);
      iovec v{flat.data(), flat.size()};
      net::TxPacket one = p;
      one.iov = &v;
      one.iovcnt = 1;
      n += inner_->send({&one, 1});
    }
    return n;
  }
};

// Two connected engines over the simulated network, one of them (a or b)
// on a GsoNic whose sends the test reads.
struct GsoPair {
  net::SimNetwork net;
  Side a, b;
  GsoNic *gso;
  GsoPair(uint64_t seed, bool gso_on_a, uint32_t a_sq = 16, uint32_t b_rq = 16, net::SimFaults f = {},
          bool no_fill_peer = false)
      : net(seed, f) {
    const net::Endpoint ea{0x0a000001, Pair::kBase + 1}, eb{0x0a000002, Pair::kBase + 2};
    auto clock = [this] { return net.now(); };
    auto g = std::make_unique<GsoNic>(net, gso_on_a ? ea : eb);
    gso = g.get();
    std::unique_ptr<net::Nic> na = std::move(g), nb = std::make_unique<net::SimNic>(net, gso_on_a ? eb : ea);
    if (no_fill_peer) nb = std::make_unique<NoFillNic>(std::move(nb));
    if (!gso_on_a) std::swap(na, nb);
    a.e = std::make_unique<Engine>(std::move(na), 1, Pair::kBase, clock, &a.mem, nullptr);
    b.e = std::make_unique<Engine>(std::move(nb), 2, Pair::kBase, clock, &b.mem, nullptr);
    a.qp = a.e->create_qp(a_sq, 16);
    b.qp = b.e->create_qp(16, b_rq);
    Pair::connect(a, *a.qp, b.qp->qpn, eb, 1024, 0, 0);
    Pair::connect(b, *b.qp, a.qp->qpn, ea, 1024, 0, 0);
    gso->sends.clear();
  }
};

}  // namespace

TEST_CASE("a reply and the ACK it carries leave as one segmented send, whatever their sizes", "[sim]") {
  GsoPair p(31, false);
  auto &net = p.net;
  auto &a = p.a, &b = p.b;
  GsoNic *bn = p.gso;

  std::vector<uint8_t> ping(8, 1), pong(100, 2), rb(128), ra(128);
  auto recv = [](Side &s, std::vector<uint8_t> &buf) {
    REQUIRE(s.e->post_recv(*s.qp, recv_wr(buf.data(), uint32_t(buf.size()))) == 0);
  };
  auto send = [](Side &s, std::vector<uint8_t> &buf) {
    REQUIRE(s.e->post_send(*s.qp, send_wr(buf.data(), uint32_t(buf.size()))) == 0);
  };
  recv(b, rb);
  recv(a, ra);
  send(a, ping);
  net.advance(10'000);
  // b's application polls, finds the SEND, and answers at once: the ACK
  // waits for the answer and leaves behind it, in the same send.
  b.e->progress(Engine::Poller::app);
  REQUIRE(drain(b.rcq).size() == 1);
  CHECK(bn->sends.empty());
  send(b, pong);
  REQUIRE(bn->sends.size() == 1);
  const std::vector<uint8_t> reply_then_ack{uint8_t(usrc::wire::Opcode::RC_SEND_ONLY),
                                             uint8_t(usrc::wire::Opcode::RC_ACKNOWLEDGE)};
  CHECK(bn->sends[0] == reply_then_ack);
  // Both arrive and complete a's SEND and receive (ICRCs right per segment).
  std::vector<Completion> asc, arc;
  for (int i = 0; i < 1000 && (asc.empty() || arc.empty()); i++) {
    net.advance(10'000);
    a.e->progress();
    b.e->progress();
    for (auto &c : drain(a.scq)) asc.push_back(c);
    for (auto &c : drain(a.rcq)) arc.push_back(c);
  }
  REQUIRE(asc.size() == 1);
  REQUIRE(arc.size() == 1);
  CHECK(asc[0].status == WcStatus::success);
  CHECK(arc[0].byte_len == pong.size());
  CHECK(std::equal(pong.begin(), pong.end(), ra.begin()));
  CHECK(a.e->counters[uint32_t(Counter::malformed_drops)] == 0);
}

TEST_CASE("a burst of posts goes out as it is posted where sending is cheap, at the end of the burst elsewhere", "[sim]") {
  for (bool cheap : {false, true}) {
    GsoPair p(43, true, 64, 64);
    auto &net = p.net;
    auto &a = p.a, &b = p.b;
    GsoNic *an = p.gso;
    an->cheap = cheap;
    std::vector<uint8_t> msg(64, 5), rb(64 * 40);
    for (int i = 0; i < 40; i++)
      REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data() + 64 * i, 64)) == 0);
    // 40 posts, no progress call in between: the first goes alone (nothing
    // was in flight), then batches of 16 where sending is cheap; elsewhere
    // the rest waits for the engine's next pass.
    for (int i = 0; i < 40; i++) REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), 64, i)) == 0);
    std::vector<size_t> sizes;
    for (auto &s : an->sends) sizes.push_back(s.size());
    if (cheap) CHECK(sizes == std::vector<size_t>{1, 16, 16});
    else CHECK(sizes == std::vector<size_t>{1});
    a.e->progress();
    size_t sent = 0;
    for (auto &s : an->sends) sent += s.size();
    CHECK(sent == 40);
    // All of them arrive.
    std::vector<Completion> got;
    for (int i = 0; i < 1000 && got.size() < 40; i++) {
      net.advance(10'000);
      b.e->progress();
      a.e->progress();
      for (auto &c : drain(b.rcq)) got.push_back(c);
    }
    REQUIRE(got.size() == 40);
    for (auto &c : got) CHECK(c.status == WcStatus::success);
  }
}

// ib_write_lat: a peer's post sends its request and the ACK of our last
// one together, and our polling application may take them in two passes.
// The ACK of the request still waits for our reply, so that the peer,
// polling for it, takes the reply in the same pass instead of leaving it to
// its progress thread while it spins on its memory.
TEST_CASE("an ACK held for a reply stays held through the application's next passes, for kAckHoldNs", "[sim]") {
  GsoPair p(43, false);
  auto &net = p.net;
  auto &a = p.a, &b = p.b;
  GsoNic *bn = p.gso;
  std::vector<uint8_t> ping(8, 1), pong(8, 2), rb(64), ra(64);
  REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data(), 64)) == 0);
  REQUIRE(a.e->post_recv(*a.qp, recv_wr(ra.data(), 64)) == 0);
  REQUIRE(a.e->post_send(*a.qp, send_wr(ping.data(), 8)) == 0);
  net.advance(10'000);
  b.e->progress(Engine::Poller::app);
  REQUIRE(drain(b.rcq).size() == 1);
  // A pass that receives nothing more (or only the ACK that came behind
  // the request) keeps it.
  net.advance(Engine::kAckHoldNs / 2);
  b.e->progress(Engine::Poller::app);
  CHECK(bn->sends.empty());
  REQUIRE(b.e->post_send(*b.qp, send_wr(pong.data(), 8)) == 0);
  REQUIRE(bn->sends.size() == 1);
  CHECK(bn->sends[0] == std::vector<uint8_t>{uint8_t(usrc::wire::Opcode::RC_SEND_ONLY),
                                             uint8_t(usrc::wire::Opcode::RC_ACKNOWLEDGE)});
}

// A WRITE of 48 packets (more than one receive batch) from a to b's
// region 5, sent and on the wire.
struct BigWrite {
  static constexpr uint32_t kLen = 48 * 1024;
  std::vector<uint8_t> src = std::vector<uint8_t>(kLen), target = std::vector<uint8_t>(kLen, 0);
  BigWrite(GsoPair &p, uint8_t seed) {
    for (size_t i = 0; i < kLen; i++) src[i] = uint8_t(i * seed + 1);
    p.b.mem.regions[5] = {target.data(), 0, kLen, kAccessRemoteWrite};
    p.b.qp->attr.access = kAccessRemoteWrite;
    REQUIRE(p.a.e->post_send(*p.a.qp, rdma_wr(WrOpcode::rdma_write, src.data(), kLen, 0, 5)) == 0);
    p.a.e->progress();
    p.net.advance(10'000);
  }
  bool landed() const { return src == target; }
};

// ib_write_lat with large WRITEs: the progress thread's pass for packets a
// polling application left takes as many batches as its own passes do
// (one batch, then a kHandNs hand-off for the next, would add microseconds
// a WRITE), and holds the ACK for the application's reply as its poll would.
TEST_CASE("a handed pass takes several batches and holds their ACK for the application's reply", "[sim]") {
  GsoPair p(53, false);
  GsoNic *bn = p.gso;
  std::vector<uint8_t> pong(8, 2), ra(64);
  REQUIRE(p.a.e->post_recv(*p.a.qp, recv_wr(ra.data(), 64)) == 0);
  BigWrite w(p, 5);
  CHECK(p.b.e->progress(Engine::Poller::handed) == 48);
  CHECK(w.landed());
  CHECK(bn->sends.empty());
  REQUIRE(p.b.e->post_send(*p.b.qp, send_wr(pong.data(), 8)) == 0);
  REQUIRE(bn->sends.size() == 1);
  CHECK(bn->sends[0] == std::vector<uint8_t>{uint8_t(usrc::wire::Opcode::RC_SEND_ONLY),
                                             uint8_t(usrc::wire::Opcode::RC_ACKNOWLEDGE)});
}

// ib_write_lat with large WRITEs over UDP GRO: the application's poll
// pass that took the first packets of a WRITE takes the rest of that
// receive too. Left in the NIC, where its fd does not show them, they
// would wait while the application spins on its memory until the sender's
// timer resent them. A run of single-packet messages is taken a batch per
// poll, as from any NIC: the pass sends their ACKs (and the application
// its next requests) before it takes more.
TEST_CASE("an application's pass takes the rest of a message from a coalesced receive, and only that", "[sim]") {
  GsoPair p(59, false, 64, 64);
  p.gso->coalesce = true;
  SECTION("a WRITE of more than one batch") {
    BigWrite w(p, 3);
    CHECK(p.b.e->progress(Engine::Poller::app) == 48);
    CHECK_FALSE(p.gso->rx_held());
    CHECK(w.landed());
  }
  SECTION("48 single-packet SENDs") {
    std::vector<uint8_t> msg(8, 4), rb(48 * 64);
    for (int i = 0; i < 48; i++) {
      REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rb.data() + i * 64, 64)) == 0);
      REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(msg.data(), 8)) == 0);
    }
    p.a.e->progress();
    p.net.advance(10'000);
    CHECK(p.b.e->progress(Engine::Poller::app) == 32);
    CHECK(p.gso->rx_held());
    CHECK(p.b.e->progress(Engine::Poller::app) == 16);
    CHECK(drain(p.b.rcq).size() == 48);
  }
}

// ib_write_bw and ib_read_bw across hosts: a message's first packet
// carries a RETH (WRITE) or an AETH (READ response) that the packets after
// it do not. To a peer that takes the UDP checksum for the ICRC they are
// filled up to its size (wire::bth::fill) and go in the same segmented
// send; elsewhere (or to a peer whose build takes no fill) the send ends
// where the size changes.
TEST_CASE("to a peer that takes the UDP checksum for the ICRC, a message's packets go as one segment size", "[sim]") {
  for (int variant : {0, 1, 2}) {
    const bool checksummed = variant != 1, old_peer = variant == 2;
    INFO((variant == 0 ? "both NICs checksum their datagrams" : variant == 1 ? "no checksum" : "a peer that takes no fill"));
    net::SimFaults f;
    f.udp_checksum = checksummed;
    GsoPair p(61, true, 16, 16, f, old_peer);
    auto &a = p.a, &b = p.b;
    std::vector<size_t> sizes;   // of a's WRITE and READ response datagrams
    std::vector<uint8_t> fills;
    p.net.tap = [&](const std::vector<uint8_t> &d) {
      const auto op = wire::Opcode(d[0]);
      if (op < wire::Opcode::RC_WRITE_FIRST || op > wire::Opcode::RC_READ_RESPONSE_ONLY ||
          op == wire::Opcode::RC_READ_REQUEST)
        return;
      sizes.push_back(d.size());
      fills.push_back(d[4] & wire::bth::kFillMask);
    };
    auto settle = [&](Cq &cq) {   // until cq has a completion
      for (int i = 0; i < 1000; i++) {
        if (!drain(cq).empty()) return true;
        p.net.advance(10'000);
        a.e->progress();
        b.e->progress();
      }
      return false;
    };
    // a hears from b (an ACK) before it sends the WRITE.
    std::vector<uint8_t> msg(8, 1), rb(8);
    REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data(), 8)) == 0);
    REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), 8)) == 0);
    REQUIRE(settle(a.scq));
    CHECK(a.qp->peer_icrc_optional == checksummed);
    CHECK(a.qp->peer_takes_fill == (checksummed && !old_peer));

    constexpr uint32_t kLen = 4 * 1024;   // four packets of the path MTU
    std::vector<uint8_t> src(kLen), target(kLen, 0), back(kLen, 0);
    for (size_t i = 0; i < kLen; i++) src[i] = uint8_t(i * 13 + 5);
    b.mem.regions[5] = {target.data(), 0, kLen, kAccessRemoteWrite | kAccessRemoteRead};
    b.qp->attr.access = kAccessRemoteWrite;
    a.mem.regions[6] = {src.data(), 0, kLen, kAccessRemoteRead};
    a.qp->attr.access = kAccessRemoteRead;
    p.gso->sends.clear();
    REQUIRE(a.e->post_send(*a.qp, rdma_wr(WrOpcode::rdma_write, src.data(), kLen, 0, 5)) == 0);
    REQUIRE(settle(a.scq));
    CHECK(target == src);
    // b reads it back from a: a's responses.
    REQUIRE(b.e->post_send(*b.qp, rdma_wr(WrOpcode::rdma_read, back.data(), kLen, 0, 6)) == 0);
    REQUIRE(settle(b.scq));
    CHECK(back == src);

    using O = wire::Opcode;
    const auto ops = [](std::initializer_list<O> l) {
      std::vector<uint8_t> v;
      for (O o : l) v.push_back(uint8_t(o));
      return v;
    };
    const auto &sends = p.gso->sends;
    const size_t first = 12 + 16 + 1024 + 4, read_first = 12 + 4 + 1024 + 4;
    REQUIRE(sizes.size() == 8);
    if (checksummed && !old_peer) {
      CHECK(std::count(sends.begin(), sends.end(),
                       ops({O::RC_WRITE_FIRST, O::RC_WRITE_MIDDLE, O::RC_WRITE_MIDDLE,
                            O::RC_WRITE_LAST})) == 1);
      CHECK(std::count(sends.begin(), sends.end(),
                       ops({O::RC_READ_RESPONSE_FIRST, O::RC_READ_RESPONSE_MIDDLE,
                            O::RC_READ_RESPONSE_MIDDLE, O::RC_READ_RESPONSE_LAST})) == 1);
      CHECK(std::vector<size_t>(sizes.begin(), sizes.begin() + 4) == std::vector<size_t>(4, first));
      CHECK(std::vector<size_t>(sizes.begin() + 4, sizes.end()) == std::vector<size_t>(4, read_first));
      CHECK(fills == std::vector<uint8_t>{0, 4, 4, 4, 0, 1, 1, 0});
    } else {
      CHECK(std::count(sends.begin(), sends.end(), ops({O::RC_WRITE_FIRST, O::RC_WRITE_MIDDLE})) == 1);
      CHECK(std::count(sends.begin(), sends.end(),
                       ops({O::RC_WRITE_MIDDLE, O::RC_WRITE_LAST})) == 1);
      CHECK(sizes[1] == first - 16);
      CHECK(std::count(fills.begin(), fills.end(), 0) == 8);
    }
    CHECK(a.e->counters[uint32_t(Counter::malformed_drops)] + b.e->counters[uint32_t(Counter::malformed_drops)] == 0);
  }
}

TEST_CASE("a NIC that stops taking segmented sends gets single datagrams from then on", "[sim]") {
  GsoPair p(47, true);
  auto &net = p.net;
  auto &a = p.a, &b = p.b;
  GsoNic *an = p.gso;
  an->refuse_gso = true;
  std::vector<uint8_t> msg(8000), rb(8192);
  for (size_t i = 0; i < msg.size(); i++) msg[i] = uint8_t(i * 7);
  REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data(), uint32_t(rb.size()))) == 0);
  REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), uint32_t(msg.size()))) == 0);
  std::vector<Completion> sc, rc;
  for (int i = 0; i < 5000 && (sc.empty() || rc.empty()); i++) {
    net.advance(100'000);
    a.e->progress();
    b.e->progress();
    for (auto &c : drain(a.scq)) sc.push_back(c);
    for (auto &c : drain(b.rcq)) rc.push_back(c);
  }
  CHECK(an->segs == 1);
  REQUIRE(sc.size() == 1);
  CHECK(sc[0].status == WcStatus::success);
  REQUIRE(rc.size() == 1);
  CHECK(rc[0].byte_len == msg.size());
  CHECK(std::equal(msg.begin(), msg.end(), rb.begin()));
  for (auto &s : an->sends) CHECK(s.size() == 1);
}

TEST_CASE("a receiver that never replies sends its ACKs at once, not with a reply", "[sim]") {
  GsoPair p(37, false);
  auto &net = p.net;
  auto &a = p.a, &b = p.b;
  GsoNic *bn = p.gso;
  std::vector<uint8_t> msg(64, 3), rb(64 * 8);
  for (int i = 0; i < 8; i++)
    REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data() + 64 * i, 64)) == 0);
  // The first message: b may reply, so its ACK waits for the reply (as in
  // the test above); b's passes keep it for kAckHoldNs, then send it.
  REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), 64)) == 0);
  net.advance(10'000);
  b.e->progress(Engine::Poller::app);
  CHECK(bn->sends.empty());
  net.advance(Engine::kAckHoldNs - 1);
  b.e->progress(Engine::Poller::app);
  CHECK(bn->sends.empty());
  net.advance(1);
  b.e->progress(Engine::Poller::app);
  REQUIRE(bn->sends.size() == 1);
  // b posted nothing since: from now on each pass's ACK leaves in that pass.
  for (int i = 0; i < 3; i++) {
    bn->sends.clear();
    a.e->progress();
    REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), 64)) == 0);
    a.e->progress();
    net.advance(10'000);
    b.e->progress(Engine::Poller::app);
    REQUIRE(bn->sends.size() == 1);
    CHECK(bn->sends[0] == std::vector<uint8_t>{uint8_t(usrc::wire::Opcode::RC_ACKNOWLEDGE)});
  }
  CHECK(drain(b.rcq).size() == 4);
}

TEST_CASE("an ACK held for the application's reply leaves before its QP goes to the error state", "[sim]") {
  GsoPair p(41, false);
  auto &net = p.net;
  auto &a = p.a, &b = p.b;
  GsoNic *bn = p.gso;
  std::vector<uint8_t> msg(64, 5), rb(64);
  REQUIRE(b.e->post_recv(*b.qp, recv_wr(rb.data(), 64)) == 0);
  REQUIRE(a.e->post_send(*a.qp, send_wr(msg.data(), 64)) == 0);
  net.advance(10'000);
  // b's application polls and finds the message: its ACK waits for a reply.
  b.e->progress(Engine::Poller::app);
  REQUIRE(drain(b.rcq).size() == 1);
  CHECK(bn->sends.empty());
  // No reply: the application disconnects (Error, as rdma_disconnect does).
  b.e->set_state(*b.qp, QpState::err);
  REQUIRE(bn->sends.size() == 1);
  CHECK(bn->sends[0] == std::vector<uint8_t>{uint8_t(usrc::wire::Opcode::RC_ACKNOWLEDGE)});
  net.advance(10'000);
  a.e->progress();
  const auto sc = drain(a.scq);
  REQUIRE(sc.size() == 1);
  CHECK(sc[0].status == WcStatus::success);
}

TEST_CASE("SQD: a message already sent is resent from its start after a loss", "[sim]") {
  Pair p(41);
  std::vector<uint8_t> buf(3000, 7), rx(4096, 0);
  REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), uint32_t(rx.size()), 1)) == 0);
  net::SimFaults lose_all;
  lose_all.drop = 1.0;
  p.net.set_faults(lose_all);
  REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(buf.data(), uint32_t(buf.size()), 1)) == 0);
  // Every packet of the message is lost; the send queue is then drained.
  p.a.e->set_state(*p.a.qp, QpState::sqd);
  p.net.set_faults({});
  std::vector<Completion> sc, rc;
  REQUIRE(p.run([&] {
    for (auto &c : drain(p.a.scq)) sc.push_back(c);
    for (auto &c : drain(p.b.rcq)) rc.push_back(c);
    return !sc.empty() && !rc.empty();
  }, 2'000'000'000));
  CHECK(sc[0].status == WcStatus::success);
  CHECK(rc[0].byte_len == buf.size());
  CHECK(std::equal(buf.begin(), buf.end(), rx.begin()));
}

// Seeded faults of every kind against a mix of SENDs, WRITEs and READs of
// up to 9000 bytes, at two MTUs, across a PSN rollover, with a responder
// that keeps 64, 3 or no packets beyond a gap: everything completes, once,
// in order, byte-exact.
TEST_CASE("mixed SENDs, WRITEs and READs under seeded faults, keeping 64, 3 or no packets", "[sim]") {
  for (uint64_t seed = 1; seed <= 48; seed++) {
    DYNAMIC_SECTION("seed " << seed) {
      net::SimFaults f;
      f.drop = 0.01 * (seed % 12);
      f.duplicate = (seed % 3) * 0.02;
      f.reorder = (seed % 4) * 0.03;
      f.corrupt = (seed % 5 == 0) ? 0.01 : 0;
      Pair p(seed * 104729, f, seed % 2 ? 1024 : 4096, seed % 7 == 0 ? 0xffff80 : 0);
      if (seed % 6 == 0) p.b.e->hold_max = 3;
      if (seed % 8 == 0) p.b.e->hold_max = 0;
      p.a.qp->attr.max_rd_atomic = 4;
      p.b.qp->attr.access = kAccessRemoteRead | kAccessRemoteWrite;
      std::mt19937 rng(seed);
      // src: what WRITEs take, [0, 200000), then what the 40 SENDs take,
      // 9000 bytes each (the largest message).
      std::vector<uint8_t> remote(400000, 0), local(400000, 0), src(200000 + 40 * 9000), rx(40 * 9000, 0);
      for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(rng());
      std::vector<uint8_t> remote_init(400000);
      for (auto &x : remote_init) x = uint8_t(rng());
      remote = remote_init;
      p.b.mem.regions[9] = {remote.data(), 0x100000, remote.size(), kAccessRemoteRead | kAccessRemoteWrite};
      for (uint64_t i = 0; i < 40; i++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 9000 * i, 9000, i)) == 0);
      std::vector<std::tuple<int, uint32_t, uint32_t>> ops;   // kind, off, len
      std::vector<uint64_t> ids;                               // their wr_ids, as posted
      uint32_t woff = 0, roff = 200000, nsend = 0;
      for (int i = 0; i < 60; i++) {
        int kind = int(rng() % 3);
        uint32_t len = uint32_t(rng() % 9000);
        SendWr w;
        w.wr_id = i;
        w.flags = kSignaled;
        w.num_sge = 1;
        // A WRITE from src into [0, 200000), a READ from [200000, 400000)
        // into local.
        uint32_t &off = kind == 0 ? woff : roff;
        if (kind < 2 && off + len < (kind == 0 ? 200000u : 400000u)) {
          w.opcode = kind == 0 ? WrOpcode::rdma_write : WrOpcode::rdma_read;
          w.remote_va = 0x100000 + off;
          w.rkey = 9;
          w.sge[0] = {(kind == 0 ? src : local).data() + off, len};
          ops.push_back({kind, off, len});
          off += len;
        } else if (nsend < 40) {
          w.opcode = WrOpcode::send;
          w.sge[0] = {src.data() + 200000 + nsend * 9000, len};
          ops.push_back({2, nsend, len});
          nsend++;
        } else {
          continue;
        }
        REQUIRE(p.a.e->post_send(*p.a.qp, w) == 0);
        ids.push_back(w.wr_id);
      }
      std::vector<Completion> sc, rcv;
      INFO("sent " << p.net.stats.sent << " dropped " << p.net.stats.dropped);
      REQUIRE(p.collect(sc, ops.size(), &rcv, nsend));
      // Every send completion once, in the order posted (IBA 10.8.6).
      REQUIRE(sc.size() == ops.size());
      for (size_t i = 0; i < sc.size(); i++) {
        REQUIRE(sc[i].status == WcStatus::success);
        REQUIRE(sc[i].wr_id == ids[i]);
      }
      std::vector<uint32_t> sent_len;
      for (auto &[kind, off, len] : ops) {
        if (kind == 0) REQUIRE(std::memcmp(remote.data() + off, src.data() + off, len) == 0);
        if (kind == 1) REQUIRE(std::memcmp(local.data() + off, remote_init.data() + off, len) == 0);
        if (kind == 2) sent_len.push_back(len);
      }
      REQUIRE(rcv.size() == nsend);
      for (uint32_t i = 0; i < nsend; i++) {
        REQUIRE(rcv[i].wr_id == i);
        REQUIRE(rcv[i].status == WcStatus::success);
        REQUIRE(rcv[i].byte_len == sent_len[i]);
        REQUIRE(std::memcmp(rx.data() + 9000 * i, src.data() + 200000 + 9000 * i, sent_len[i]) == 0);
      }
    }
  }
}

TEST_CASE("a QP takes packets only from its peer's port, or the one its flow label gives", "[sim]") {
  for (const bool local : {false, true}) {
    for (const bool label : {false, true}) {
      INFO("same host " << local << ", flow label " << label);
      Pair p(31);
      if (local) p.same_host();   // (the receive path's short cuts)
      const net::Endpoint ea = p.b.qp->attr.peer, eb = p.a.qp->attr.peer;
      const uint16_t lport = 0xc000 | 0x123;   // flow label 0x123
      if (label) p.a.qp->attr.sport = p.b.qp->attr.sport = lport;
      std::vector<uint8_t> rx(128 * 8);
      for (uint64_t i = 0; i < 8; i++) REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data() + 128 * i, 128, i)) == 0);
      const uint32_t psn = p.b.qp->resp.epsn;
      auto &drops = p.b.e->counters[uint32_t(Counter::wrong_source_drops)];
      // The peer's address, another port: any other port at or above
      // 0xC000, the label's port where the path has no label, the peer's
      // slot's neighbour.
      for (const uint16_t port : {uint16_t(0xc000), uint16_t(0xfffe), uint16_t(lport + 1),
                                  label ? uint16_t(ea.port + 1) : lport, uint16_t(ea.port + 1)})
        send_forged(p.net, {ea.ip, port}, eb, p.b.qp->qpn, psn, !local);
      // ... and the peer's port at another address.
      send_forged(p.net, {ea.ip + 1, ea.port}, eb, p.b.qp->qpn, psn, !local);
      p.run([] { return false; }, p.net.now() + 10'000'000);
      CHECK(drain(p.b.rcq).empty());
      CHECK(drops == 6);
      CHECK(p.b.qp->resp.epsn == psn);
      // From the peer's own port, and with a label from the label's port.
      send_forged(p.net, ea, eb, p.b.qp->qpn, psn, !local);
      if (label) send_forged(p.net, {ea.ip, lport}, eb, p.b.qp->qpn, psn_add(psn, 1), !local);
      p.run([] { return false; }, p.net.now() + 10'000'000);
      CHECK(drain(p.b.rcq).size() == (label ? 2u : 1u));
      CHECK(drops == 6);
      CHECK(rx[0] == 0xee);
    }
  }
}

TEST_CASE("QPNs are unique in a context, and a destroyed QP's is not the next one handed out", "[sim]") {
  net::SimNetwork net(1);
  Mem mem;
  Engine e(std::make_unique<net::SimNic>(net, net::Endpoint{0x0a000001, Pair::kBase + 7}), 7, Pair::kBase,
           [&] { return net.now(); }, &mem, nullptr);
  Qp *first = e.create_qp(1, 1);
  const uint32_t gone = first->qpn;
  e.destroy_qp(first);   // (in RESET: reaped at once)
  std::set<uint32_t> seen;
  uint32_t next_ones = 0, prev = 0;
  for (uint32_t i = 0; i < kQpsPerSlot; i++) {
    Qp *q = e.create_qp(1, 1);
    REQUIRE(q);
    REQUIRE(slot_of_qpn(q->qpn) == 7);
    REQUIRE(seen.insert(q->qpn).second);
    if (i == 0) CHECK(q->qpn != gone);
    next_ones += i && q->qpn == prev + 1;
    prev = q->qpn;
  }
  CHECK(e.create_qp(1, 1) == nullptr);   // all 4096 taken
  CHECK(next_ones < kQpsPerSlot - 1);    // not handed out in order
}

// The progress thread's policy (ProgressPolicy) driving a real engine in
// virtual time: b's application polls its CQs (receiving in its own
// thread, as try_progress does) and then stops, or arms a CQ for an event;
// b's progress thread follows the policy as Context::progress_loop does
// (a NIC with a wait fd: any packet in flight may wake it when it sleeps
// on the NIC). a's engine is served all along. A SEND from a after b's
// application stopped polling completes at b, and its ACK at a, within
// the policy's hand-over time (a passive target is served at once, not
// when the quiet time runs out); after an arm, at once.
TEST_CASE("the progress thread's policy hands a stopped poller's engine over within its bound", "[sim]") {
  constexpr uint64_t kUs = 1000, kMs = 1000 * kUs, kStep = 1 * kUs;
  for (bool arm : {false, true}) {
    Pair p(21);
    ProgressPolicy::Config cfg;   // the defaults: USRC_APP_QUIET_US=1000, USRC_BUSY_POLL_US=50
    ProgressPolicy pol(cfg);
    std::vector<uint8_t> tx(100, 0x3c), rx(128, 0);
    REQUIRE(p.b.e->post_recv(*p.b.qp, recv_wr(rx.data(), 128, 1)) == 0);
    const uint64_t t0 = p.net.now(), stop = t0 + 200 * kMs;
    uint64_t app_polled = 0, wake = 0, takes_while_polling = 0, looks = 0;
    bool asleep = false, on_nic = false, sent = false, watching = false;
    uint64_t recv_done = 0, send_done = 0;
    for (uint64_t now = t0; now < stop + 100 * kMs && !(recv_done && send_done); now += kStep) {
      p.net.advance(now - p.net.now());
      p.a.e->progress();
      if (now <= stop) {   // b's application polls (its empty polls receive)
        app_polled = now;
        p.b.e->progress(Engine::Poller::app, now);
      } else if (arm && app_polled) {   // it arms a CQ instead: app_waits()
        app_polled = 0;
        asleep = false;   // (the eventfd, as the thread watches)
      }
      if (now == stop + kStep) {   // the SEND, as b's application stopped
        REQUIRE(p.a.e->post_send(*p.a.qp, send_wr(tx.data(), 100, 7)) == 0);
        sent = true;
      }
      // b's progress thread.
      bool nic_woke = false;
      if (asleep && (now >= wake || (on_nic && p.net.next_delivery() <= now))) {
        // (Woken by the NIC from a watch: nic_woke() decides.)
        nic_woke = watching && on_nic && now < wake;
        asleep = false;
      }
      while (!asleep) {
        ProgressPolicy::Decision d = nic_woke ? pol.nic_woke(now, app_polled)
                                              : pol.next(now, app_polled, p.net.next_delivery() <= now, app_polled);
        nic_woke = false;
        watching = d.what == ProgressPolicy::Do::sleep;
        if (d.what != ProgressPolicy::Do::sleep) {
          if (now <= stop) takes_while_polling++;
          d = pol.after_pass(now, p.b.e->progress() != 0, p.b.e->next_deadline(), p.b.e->nic().rx_pending());
        } else if (now <= stop) {
          looks++;
        }
        if (d.what == ProgressPolicy::Do::take_engine) continue;
        if (d.what == ProgressPolicy::Do::spin) {
          pol.yielded(now, now + kStep);   // (a yield that costs the step)
          break;
        }
        asleep = true, wake = d.until, on_nic = d.on_nic;
      }
      if (sent && !recv_done && !drain(p.b.rcq).empty()) recv_done = now;
      if (sent && !send_done && !drain(p.a.scq).empty()) send_done = now;
    }
    INFO((arm ? "armed" : "stopped") << ": received " << (recv_done - stop) / kUs << " us, ACKed "
                                     << (send_done - stop) / kUs << " us after the last poll; "
                                     << looks << " looks in 200 ms of polling");
    CHECK(takes_while_polling == 0);
    CHECK(looks <= 4 + 185 / 16 + 2);   // 1, 2, 4, 8, then every 16 ms
    REQUIRE(recv_done);
    REQUIRE(send_done);
    CHECK(rx[0] == 0x3c);
    if (arm) {
      CHECK(recv_done - stop <= 10 * kUs);   // the thread took over at the arm
      CHECK(send_done - stop <= 1 * kMs);
    } else {
      // The SEND woke the thread, asleep on the NIC; the application's last
      // poll was before it came: taken within ProgressPolicy::kHandNs.
      CHECK(recv_done - stop <= ProgressPolicy::kHandNs + 10 * kUs);
      CHECK(send_done - stop <= ProgressPolicy::kHandNs + 20 * kUs);
    }
  }
}

namespace {

// A request as a's QP would send it, built by the general header builder
// and sent from a's address to b's QP: payload len bytes of 0x5a, an ICRC
// unless the pair is on one host.
void forge(Pair &p, wire::Headers h, uint32_t len) {
  const net::Endpoint src = p.b.qp->attr.peer, dst = p.a.qp->attr.peer;
  h.bth.dest_qp = p.b.qp->qpn;
  std::vector<uint8_t> b(128 + len + 8, 0);
  const size_t hl = wire::build_headers(h, len, b.data());
  std::memset(b.data() + hl, 0x5a, len);
  const size_t body = hl + len + wire::pad_for(len);
  iovec v{b.data(), body};
  wire::store_icrc(b.data() + body,
                   p.net.loopback ? 0 : wire::icrc_ipv4({src.ip, dst.ip, src.port, dst.port}, &v, 1));
  b.resize(body + wire::kIcrcLen);
  net::SimNic nic(p.net, src);
  iovec all{b.data(), b.size()};
  REQUIRE(nic.send({std::array{net::TxPacket{dst, &all, 1}}.data(), 1}) == 1);
}

wire::Headers request(wire::Opcode op, uint32_t psn, bool ack_req = false) {
  wire::Headers h;
  h.bth.opcode = uint8_t(op);
  h.bth.psn = psn & kPsnMask;
  h.bth.ack_req = ack_req;
  return h;
}

// The ACKs and NAKs b sends to a (their AETH syndrome and PSN), from when
// it is made.
struct Responses {
  std::vector<std::pair<uint8_t, uint32_t>> seen;
  explicit Responses(Pair &p) {
    const uint32_t to = p.a.qp->qpn;
    p.net.tap = [this, to](const std::vector<uint8_t> &d) {
      wire::Parsed x;
      if (wire::parse(d.data(), d.size(), x) == wire::ParseError::ok &&
          x.h.bth.opcode == uint8_t(wire::Opcode::RC_ACKNOWLEDGE) && x.h.bth.dest_qp == to)
        seen.push_back({x.h.aeth.syndrome, x.h.bth.psn});
    };
  }
};

}  // namespace

TEST_CASE("the responder answers each error as its class says, NAKing in one place", "[sim]") {
  for (const bool local : {false, true}) {
    INFO("same host " << local);
    Pair p(41);
    if (local) p.same_host();
    std::vector<uint8_t> rx(4096);
    Qp &q = *p.b.qp;
    const uint32_t psn = q.resp.epsn;
    Responses r(p);
    auto settle = [&] { p.run([] { return false; }, p.net.now() + 1'000'000); };
    // The answers once all is sent, the responder's QP state and events.
    auto nak_of = [&](uint8_t code) { return std::pair{wire::aeth_nak(code), psn}; };
    // Class C: one NAK with code, the QP in ERR, the async event ev.
    auto fails = [&](uint8_t code, QpEvent ev) {
      settle();
      CHECK(r.seen == std::vector{nak_of(code)});
      CHECK(q.state == QpState::err);
      CHECK(p.b.events.seen == std::vector{ev});
    };

    SECTION("class B: packets beyond the expected PSN get one sequence NAK") {
      for (uint32_t i = 1; i <= 4; i++) forge(p, request(wire::Opcode::RC_SEND_ONLY, psn + i), 16);
      settle();
      CHECK(r.seen == std::vector{std::pair{wire::aeth_nak(wire::NAK_PSN_SEQ), psn}});
      CHECK(q.state == QpState::rts);
      CHECK(q.resp.nak_sent);
      CHECK(p.b.events.seen.empty());
    }
    SECTION("RNR: no receive posted") {
      forge(p, request(wire::Opcode::RC_SEND_ONLY, psn), 16);
      settle();
      REQUIRE(r.seen.size() == 1);
      CHECK(wire::aeth_type(r.seen[0].first) == wire::AckType::rnr_nak);
      CHECK(r.seen[0].second == psn);
      CHECK(q.state == QpState::rts);
      CHECK(p.b.events.seen.empty());
    }
    SECTION("class C, invalid request: a MIDDLE with no message begun") {
      REQUIRE(p.b.e->post_recv(q, recv_wr(rx.data(), 4096)) == 0);
      forge(p, request(wire::Opcode::RC_SEND_MIDDLE, psn), q.attr.pmtu);
      fails(wire::NAK_INVALID_REQUEST, QpEvent::req_err);
    }
    SECTION("class C, invalid request: a FIRST shorter than the PMTU") {
      REQUIRE(p.b.e->post_recv(q, recv_wr(rx.data(), 4096)) == 0);
      forge(p, request(wire::Opcode::RC_SEND_FIRST, psn), 64);
      fails(wire::NAK_INVALID_REQUEST, QpEvent::req_err);
    }
    SECTION("class C, invalid request: a READ to a QP without responder resources") {
      Engine::QpChange c{q.attr};
      c.attr.max_dest_rd_atomic = 0;
      c.state = QpState::rts;
      p.b.e->modify(q, c);
      wire::Headers h = request(wire::Opcode::RC_READ_REQUEST, psn);
      h.reth = {0x1000, 1, 8};
      forge(p, h, 0);
      fails(wire::NAK_INVALID_REQUEST, QpEvent::req_err);
    }
    SECTION("class C, invalid request: an ATOMIC on a word not 8-byte aligned") {
      wire::Headers h = request(wire::Opcode::RC_FETCH_ADD, psn);
      h.atomic = {0x1004, 1, 1, 0};
      forge(p, h, 0);
      fails(wire::NAK_INVALID_REQUEST, QpEvent::req_err);
    }
    SECTION("class C, remote access error: a WRITE through an unknown rkey") {
      wire::Headers h = request(wire::Opcode::RC_WRITE_ONLY, psn);
      h.reth = {0x1000, 77, 16};
      forge(p, h, 16);
      fails(wire::NAK_REMOTE_ACCESS, QpEvent::access_err);
    }
    SECTION("class C, remote operational error: the receive buffer unmapped") {
      void *m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      REQUIRE(m != MAP_FAILED);
      REQUIRE(p.b.e->post_recv(q, recv_wr(static_cast<uint8_t *>(m), 4096, 9)) == 0);
      munmap(m, 4096);
      forge(p, request(wire::Opcode::RC_SEND_ONLY, psn), 16);
      settle();
      CHECK(r.seen == std::vector{nak_of(wire::NAK_REMOTE_OP)});
      CHECK(q.state == QpState::err);
      CHECK(p.b.events.seen.empty());   // (the receive's completion says it)
      const auto c = drain(p.b.rcq);
      REQUIRE(!c.empty());
      CHECK(c[0].wr_id == 9);
      CHECK(c[0].status == WcStatus::loc_prot_err);
    }
  }
}

TEST_CASE("requests received in one pass get one ACK, for the last of them", "[sim]") {
  for (const bool local : {false, true}) {
    INFO("same host " << local);
    Pair p(43);
    if (local) p.same_host();
    Qp &q = *p.b.qp;
    std::vector<uint8_t> rx(64 * 8);
    for (uint64_t i = 0; i < 8; i++) REQUIRE(p.b.e->post_recv(q, recv_wr(rx.data() + 64 * i, 64, i)) == 0);
    // A first message on its own (its first request: COMM_EST, then the
    // short path may take the rest).
    const uint32_t psn = q.resp.epsn;
    forge(p, request(wire::Opcode::RC_SEND_ONLY, psn, true), 16);
    p.run([&] { return drain(p.b.rcq).size() == 1; });
    p.run([] { return false; }, p.net.now() + 1'000'000);
    Responses r(p);
    // Six more, each asking for an ACK, all there before b looks.
    for (uint32_t i = 1; i <= 6; i++) forge(p, request(wire::Opcode::RC_SEND_ONLY, psn + i, true), 16);
    p.net.advance(1'000'000);
    p.b.e->progress();
    // (Its credit count: one receive is left.)
    CHECK(r.seen == std::vector{std::pair{wire::aeth_ack(1), (psn + 6) & kPsnMask}});
    CHECK(drain(p.b.rcq).size() == 6);
    CHECK(!q.resp.ack_pending);
  }
}
