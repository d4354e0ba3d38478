// The queues of the datapath: a QP's work queue ring (slots found without
// a division) and the completion queue (one producer, many pollers).
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "usrc/rc/cq.h"
#include "usrc/rc/qp.h"

using namespace usrc::rc;

TEST_CASE("a work queue ring finds the slot of any position, as pos % capacity would", "[queue]") {
  for (uint32_t cap : {1u, 2u, 3u, 7u, 128u, 136u, 1000u, 16383u, 16384u + 8u}) {
    Ring<int> r;
    r.init(cap);
    const uint64_t starts[] = {0, cap - 1ull, 1ull << 32, (1ull << 63) - 5, UINT64_MAX - 3 * cap};
    for (uint64_t s : starts)
      for (uint64_t pos = s; pos < s + 3ull * cap && pos >= s; pos++) {
        const size_t idx = static_cast<size_t>(&r.at(pos) - r.slots.data());
        REQUIRE(idx == pos % cap);
      }
  }
}

TEST_CASE("a work queue ring's head and tail slots follow pop and push around the wrap", "[queue]") {
  for (uint32_t cap : {1u, 3u, 136u}) {
    Ring<int> r;
    r.init(cap);
    for (uint32_t step = 0; step < 5 * cap + 7; step++) {
      if (!r.full()) {
        r.back() = static_cast<int>(r.tail);
        r.push();
      }
      REQUIRE(&r.back() == &r.at(r.tail));
      if (step % 3 != 0 && !r.empty()) {
        REQUIRE(r.front() == static_cast<int>(r.head));   // FIFO: what was pushed at that position
        r.pop();
      }
      REQUIRE(&r.front() == &r.at(r.head));
    }
    r.clear();
    CHECK(r.empty());
    CHECK(&r.front() == &r.slots[0]);
  }
}

Completion wc(uint64_t id) { return {id, WcStatus::success, WcOpcode::recv, false, false, 0, 0, 1, 2, 0, 0}; }

TEST_CASE("a full completion queue refuses and reports overflow once", "[queue]") {
  struct H : Cq::Hooks {
    int overflows = 0, notifies = 0;
    void notify(Cq &) override { notifies++; }
    void overflow(Cq &) override { overflows++; }
  } h;
  Cq cq(4, &h);
  for (uint64_t i = 0; i < 4; i++) REQUIRE(cq.push(wc(i)));
  CHECK_FALSE(cq.push(wc(4)));
  CHECK_FALSE(cq.push(wc(5)));
  CHECK(h.overflows == 1);
  Completion out[8];
  REQUIRE(cq.poll(out, 8) == 4);
  for (uint64_t i = 0; i < 4; i++) CHECK(out[i].wr_id == i);
  CHECK(cq.empty());
  // Armed for the next one: it fires once.
  cq.arm(false);
  REQUIRE(cq.push(wc(6)));
  REQUIRE(cq.push(wc(7)));
  CHECK(h.notifies == 1);
  // Resized with entries in it, they stay in order.
  cq.resize(16);
  CHECK(cq.depth() == 16);
  REQUIRE(cq.poll(out, 8) == 2);
  CHECK(out[0].wr_id == 6);
  CHECK(out[1].wr_id == 7);
}

TEST_CASE("completions pushed by one thread reach concurrent pollers each exactly once, in order", "[queue]") {
  Cq cq(64, nullptr);
  constexpr uint64_t kN = 400000;
  std::atomic<bool> done{false};
  std::vector<uint64_t> got[2];
  auto poller = [&](int k) {
    Completion out[16];
    for (;;) {
      const bool last = done.load(std::memory_order_acquire);
      size_t n = cq.poll(out, 1 + k * 15);
      for (size_t i = 0; i < n; i++) got[k].push_back(out[i].wr_id);
      if (!n && last) return;
    }
  };
  std::thread a(poller, 0), b(poller, 1);
  for (uint64_t i = 0; i < kN;)
    if (cq.push(wc(i))) i++;
    else std::this_thread::yield();   // full: the pollers catch up (refused, not lost)
  done.store(true, std::memory_order_release);
  a.join();
  b.join();
  std::vector<char> seen(kN, 0);
  for (auto &g : got) {
    for (size_t i = 1; i < g.size(); i++) REQUIRE(g[i - 1] < g[i]);   // each poller sees them in order
    for (uint64_t id : g) {
      REQUIRE(id < kN);
      REQUIRE(!seen[id]);
      seen[id] = 1;
    }
  }
  CHECK(got[0].size() + got[1].size() == kN);
}
