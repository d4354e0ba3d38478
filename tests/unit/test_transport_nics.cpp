// Two engines over each real NIC backend that this machine can run, on
// loopback, with the wall clock: SENDs of random sizes arrive intact and in
// order. A backend that cannot open here is skipped with a message.
#include <catch2/catch.hpp>

#include <time.h>

#include <functional>
#include <random>

#include "usrc/net/ofi.h"
#include "usrc/net/udp.h"
#include "usrc/rc/engine.h"

using namespace usrc;
using namespace usrc::rc;

namespace {

uint64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

struct NoMem final : MemoryAccess {
  uint8_t *resolve(const void *, uint32_t, uint64_t, uint64_t, uint32_t) override { return nullptr; }
};

using Opener = std::function<std::unique_ptr<net::Nic>(net::Endpoint, std::string *)>;

void run_backend(const char *name, Opener open) {
  constexpr uint16_t kBase = 26000;
  net::Endpoint ea{0x7f000001, kBase + 1}, eb{0x7f000001, kBase + 2};
  std::string err;
  auto na = open(ea, &err), nb = na ? open(eb, &err) : nullptr;
  if (!na || !nb) {
    WARN("backend " << name << " skipped: " << err);
    return;
  }
  NoMem mem;
  Cq scq{4096, nullptr}, rcq{4096, nullptr}, unused{4096, nullptr};
  Engine a(std::move(na), 1, kBase, wall_ns, &mem, nullptr);
  Engine b(std::move(nb), 2, kBase, wall_ns, &mem, nullptr);
  a.max_window = b.max_window = 32;
  Qp *qa = a.create_qp(1024, 1024), *qb = b.create_qp(1024, 1024);
  auto connect = [](Engine &e, Qp &q, Cq &s, Cq &r, const Qp &peer, net::Endpoint pe) {
    q.send_cq = &s;
    q.recv_cq = &r;
    q.dest_qpn = peer.qpn;
    q.peer = pe;
    q.pmtu = 1024;
    q.timeout = 14;
    q.retry_cnt = 7;
    q.rnr_retry = 7;
    q.min_rnr_timer = 1;
    e.nic().add_peer(pe);
    e.set_state(q, QpState::init);
    e.set_rq_psn(q, 0);
    e.set_state(q, QpState::rtr);
    e.set_sq_psn(q, 0);
    e.set_state(q, QpState::rts);
  };
  connect(a, *qa, scq, unused, *qb, eb);
  connect(b, *qb, unused, rcq, *qa, ea);

  constexpr int n = 200;
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> tx(n), rx(n);
  for (int i = 0; i < n; i++) {
    tx[i].resize(std::uniform_int_distribution<uint32_t>(0, 8000)(rng));
    for (auto &x : tx[i]) x = static_cast<uint8_t>(rng());
    rx[i].assign(8192, 0);
    RecvWr r;
    r.wr_id = i;
    r.num_sge = 1;
    r.sge[0] = {rx[i].data(), 8192};
    REQUIRE(b.post_recv(*qb, r) == 0);
  }
  for (int i = 0; i < n; i++) {
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::send;
    w.flags = kSignaled;
    w.num_sge = 1;
    w.sge[0] = {tx[i].data(), static_cast<uint32_t>(tx[i].size())};
    REQUIRE(a.post_send(*qa, w) == 0);
  }
  std::vector<Completion> sc, rc;
  Completion c[64];
  for (uint64_t end = wall_ns() + 10'000'000'000ull; wall_ns() < end;) {
    a.progress();
    b.progress();
    while (size_t k = scq.poll(c, 64)) sc.insert(sc.end(), c, c + k);
    while (size_t k = rcq.poll(c, 64)) rc.insert(rc.end(), c, c + k);
    if (sc.size() == n && rc.size() == n) break;
  }
  INFO("backend " << name);
  REQUIRE(sc.size() == size_t(n));
  REQUIRE(rc.size() == size_t(n));
  for (int i = 0; i < n; i++) {
    REQUIRE(sc[i].status == WcStatus::success);
    REQUIRE(rc[i].status == WcStatus::success);
    REQUIRE(rc[i].wr_id == uint64_t(i));
    REQUIRE(rc[i].byte_len == tx[i].size());
    REQUIRE(std::equal(tx[i].begin(), tx[i].end(), rx[i].begin()));
  }
}

}  // namespace

TEST_CASE("transport over the udp backend", "[nic]") {
  run_backend("udp", [](net::Endpoint e, std::string *err) -> std::unique_ptr<net::Nic> {
    int en = 0;
    return net::UdpNic::open(e, 4 << 20, 32, 64, &en, err);
  });
}

TEST_CASE("transport over the ofi backend (libfabric udp provider)", "[nic]") {
#ifdef USRC_HAVE_OFI
  run_backend("ofi", [](net::Endpoint e, std::string *err) {
    int en = 0;
    size_t max = 0;
    return net::open_ofi_nic(e, "udp", 32, &max, &en, err);
  });
#else
  WARN("backend ofi skipped: built without libfabric");
#endif
}
