// The progress thread's policy (ProgressPolicy, progress_policy.h) in
// virtual time: a model of Context::progress_loop executes its decisions
// against a scripted application (polling its CQs, or arming one for an
// event), packets arriving at the NIC and an engine timer. These are the
// speed properties the functional suite cannot assert on a busy machine's
// wall clock: how often the thread wakes while the application polls, how
// soon it takes over once it stops, and that a packet with nobody polling
// is served as it arrives.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "usrc/progress_policy.h"

using namespace usrc;
using Do = ProgressPolicy::Do;

namespace {

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;
constexpr uint64_t kT0 = 1000 * kMs;   // the virtual clock at the start
constexpr uint64_t kNever = UINT64_MAX;

ProgressPolicy::Config defaults() {   // USRC_APP_QUIET_US=1000, USRC_BUSY_POLL_US=50
  ProgressPolicy::Config c;
  c.app_quiet_ns = 1 * kMs;
  c.spin_ns = 50 * kUs;
  return c;
}

// One progress thread and the world it sees, in virtual time.
struct Model {
  ProgressPolicy policy;
  uint64_t now = kT0;

  // The application polls its CQs without pause in [poll_from, poll_until]
  // (and in each of the extra stretches `polls`), receiving whatever
  // arrives meanwhile itself, and arms a CQ for an event (Context::app_waits)
  // at arm_at.
  uint64_t poll_from = kNever, poll_until = 0, arm_at = kNever;
  std::vector<std::pair<uint64_t, uint64_t>> polls;
  // Stretches the application spends inside a verbs call (holding the
  // engine: a post whose send takes the kernel tens of microseconds). What
  // arrives meanwhile it receives at its next poll.
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  // Packets for this NIC: arrival times, and when a pass (or the polling
  // application) received each.
  std::vector<uint64_t> arrivals, received_at;
  std::vector<bool> by_app;
  // The engine's one timer and when a pass ran it.
  uint64_t timer = kNever, timer_ran = kNever;
  bool rx_pending_once = false;   // the NIC holds packets its fd does not show, once
  uint64_t yield_ns = 1 * kUs;    // what a sched_yield costs (more: the core was taken)
  bool no_fd = false;             // the NIC has no wait fd (policy: no_wait_fd_poll_ns)

  // What the thread did.
  std::vector<uint64_t> takes, watch_sleeps, nic_sleeps;   // when
  std::vector<bool> handed;   // each take: for packets the polling application left
  std::vector<uint64_t> watch_lengths;                     // how long each watch lasted
  uint64_t spins = 0, netlink_looks = 0, last_until = 0, wakes = 0, nic_wakes = 0;
  // Arrivals the polling application took while the thread slept on the
  // NIC: each woke the thread in the kernel (its ppoll found the packet
  // gone and slept on), unseen by the policy unless told (app_took).
  uint64_t kernel_wakes = 0;
  uint32_t took = 0;   // ... since the thread last looked
  bool slept_forever = false;

  explicit Model(ProgressPolicy::Config c = defaults()) : policy(c) {}

  bool polling_at(uint64_t t) const {
    if (t >= arm_at) return false;
    if (t >= poll_from && t <= poll_until) return true;
    for (auto [a, b] : polls)
      if (t >= a && t <= b) return true;
    return false;
  }
  uint64_t app_polled() const {
    if (now >= arm_at) return 0;   // armed: its polls no longer count
    uint64_t last = 0;
    if (now >= poll_from) last = std::min(now, poll_until);
    for (auto [a, b] : polls)
      if (now >= a) last = std::max(last, std::min(now, b));
    return last;
  }
  const std::pair<uint64_t, uint64_t> *call_at(uint64_t t) const {
    for (auto &c : calls)
      if (t >= c.first && t < c.second) return &c;
    return nullptr;
  }
  // The polling application receives what arrives while it polls, and
  // what arrived during a call at its first poll after (a post receives
  // nothing).
  void app_receives() {
    for (size_t i = 0; i < arrivals.size(); i++) {
      if (received_at[i] != kNever || arrivals[i] > now) continue;
      if (polling_at(arrivals[i])) {
        received_at[i] = arrivals[i], by_app[i] = true;
      } else if (call_at(arrivals[i])) {
        uint64_t next = kNever;
        for (auto [a, b] : polls)
          if (a >= arrivals[i]) next = std::min(next, a);
        if (next <= now) received_at[i] = next, by_app[i] = true;
      }
    }
  }
  uint64_t next_arrival() const {   // the first packet not yet received
    for (size_t i = 0; i < arrivals.size(); i++)
      if (received_at[i] == kNever) return arrivals[i];
    return kNever;
  }
  uint64_t arrival_after(uint64_t t) const {   // the first packet to arrive after t
    for (uint64_t a : arrivals)
      if (a > t) return a;
    return kNever;
  }
  bool pass() {
    bool got = false;
    for (size_t i = 0; i < arrivals.size(); i++)
      if (received_at[i] == kNever && arrivals[i] <= now) received_at[i] = now, got = true;
    if (timer <= now) timer_ran = now, timer = kNever;
    return got;
  }

  // Runs the loop of Context::progress_loop until end.
  void run(uint64_t end) {
    received_at.assign(arrivals.size(), kNever);
    by_app.assign(arrivals.size(), false);
    bool nic_woke = false, called = false;
    for (int guard = 0; now < end; guard++) {
      REQUIRE(guard < 10'000'000);
      app_receives();
      // (The application's calls: its last poll's time serves as the count,
      // which moves while it polls.)
      if (took) policy.app_took(now, took), took = 0;
      ProgressPolicy::Decision d = nic_woke ? policy.nic_woke(now, app_polled())
                                            : policy.next(now, app_polled(), next_arrival() <= now, app_polled(),
                                                          called || call_at(now));
      nic_woke = false;
      if (d.what == Do::hold) {   // (ended by a call the application is in, else by the time)
        called = call_at(now);
        if (!called) now = std::max(now, d.until);
        continue;
      }
      called = false;
      const bool watching = d.what == Do::sleep;
      if (watching) {
        if (!policy.app_active(now, app_polled())) continue;   // the re-check
      } else {
        takes.push_back(now);
        handed.push_back(d.handed);
        const bool got = pass();
        const bool pending = rx_pending_once;
        rx_pending_once = false;
        d = policy.after_pass(now, got, timer, pending);
      }
      last_until = d.until;
      if (d.what == Do::take_engine) continue;
      if (d.what == Do::spin) {
        const uint64_t t0 = now;
        now += yield_ns;
        spins++;
        if (policy.yielded(t0, now)) netlink_looks++;
        continue;
      }
      // Asleep until the decision's time, the NIC's fd if on it (readable
      // while a packet waits; woken by each that arrives), or the wake
      // eventfd (app_waits() writes it while the thread watches; so does
      // the application's kTookWake-th take while it watches on the NIC).
      // An arrival the polling application takes is gone before the
      // woken thread runs: a wake-up in the kernel only.
      uint64_t wake = d.until;
      uint64_t on_fd = kNever;
      if (d.on_nic && !no_fd) {
        on_fd = next_arrival() <= now ? now : kNever;
        for (uint64_t a : arrivals) {
          if (a <= now || a >= std::min(on_fd, d.until)) continue;
          if (!watching || !polling_at(a)) {
            on_fd = a;
            break;
          }
          kernel_wakes++;
          if (++took == ProgressPolicy::kTookWake) {
            wake = a;
            break;
          }
        }
      }
      wake = std::min(wake, on_fd);
      if (watching && arm_at > now) wake = std::min(wake, arm_at);
      (d.on_nic ? nic_sleeps : watch_sleeps).push_back(now);
      if (wake == kNever) {
        slept_forever = true;
        return;
      }
      if (watching) watch_lengths.push_back(wake - now);
      wakes++;
      if (watching && d.on_nic && wake == on_fd && on_fd < d.until) nic_woke = true, nic_wakes++;
      now = std::max(now, wake);
    }
    app_receives();
  }
  size_t takes_in(uint64_t from, uint64_t to) const {
    return size_t(std::count_if(takes.begin(), takes.end(), [&](uint64_t t) { return t >= from && t < to; }));
  }
};

}  // namespace

TEST_CASE("while the application polls, the looks back off: doubling, capped at 16 quiet times", "[policy]") {
  Model m;
  m.poll_from = kT0;
  m.poll_until = kT0 + 700 * kMs;
  m.run(kT0 + 700 * kMs);
  CHECK(m.takes.empty());
  REQUIRE(m.watch_lengths.size() >= 6);
  // 1, 2, 4, 8, 16, then 16 ms from each look to the next.
  CHECK(std::vector<uint64_t>(m.watch_lengths.begin(), m.watch_lengths.begin() + 6) ==
        std::vector<uint64_t>{1 * kMs, 2 * kMs, 4 * kMs, 8 * kMs, 16 * kMs, 16 * kMs});
  CHECK(*std::max_element(m.watch_lengths.begin(), m.watch_lengths.end()) == 16 * kMs);
  // Wake-ups in 700 ms: 4 + 685 / 16, where a look every quiet time would
  // be 700 (the wall-clock test this replaces allowed 200).
  INFO(m.wakes << " looks in 700 ms of polling");
  CHECK(m.wakes <= 4 + 685 / 16 + 1);
  CHECK(m.policy.looks_active() == m.wakes);

  // A look that finds the application quiet takes the engine, and the
  // backoff starts over: the next stretch of polling is looked at after
  // one quiet time again.
  Model r;
  r.poll_from = kT0;
  r.poll_until = kT0 + 100 * kMs;
  r.run(kT0 + 200 * kMs);
  REQUIRE(!r.takes.empty());
  CHECK(r.policy.next(r.now, r.now).until == r.now + 1 * kMs);
}

TEST_CASE("packets for an application that polls are left to it, at a wake-up each, fewer in a stream", "[policy]") {
  // Now and then: each arrival wakes the thread in the kernel and the
  // application takes it; the thread hears of them kTookWake at a time.
  Model m;
  m.poll_from = kT0;
  m.poll_until = kT0 + 700 * kMs;
  for (uint64_t t = kT0 + 20 * kMs; t < kT0 + 700 * kMs; t += 3 * kMs) m.arrivals.push_back(t);
  m.run(kT0 + 700 * kMs);
  CHECK(m.takes.empty());
  CHECK(std::count(m.by_app.begin(), m.by_app.end(), true) == long(m.arrivals.size()));
  INFO(m.wakes << " wake-ups for " << m.arrivals.size() << " packets in 700 ms");
  CHECK(m.kernel_wakes == m.arrivals.size());
  // (Each telling wakes it, and so does the end of the short stretch off
  // the NIC that follows.)
  CHECK(m.wakes <= 2 * m.arrivals.size() / ProgressPolicy::kTookWake + 4 + 685 / 16 + 1);

  // A stream (a packet every 10 us for 100 ms, ib_read_lat's responses to
  // its poller): told of kTookWake arrivals at a time, the thread stays
  // off the NIC for 10 us, 320 us, then a quiet time: a few wake-ups a
  // millisecond, seen or not, not one a packet (on two cores each took
  // one from the application or its peer).
  Model s;
  s.poll_from = kT0;
  s.poll_until = kT0 + 200 * kMs;
  for (uint64_t t = kT0 + 1 * kMs; t < kT0 + 101 * kMs; t += 10 * kUs) s.arrivals.push_back(t);
  s.run(kT0 + 200 * kMs);
  CHECK(s.takes.empty());
  INFO(s.wakes << " wake-ups and " << s.kernel_wakes << " in the kernel for " << s.arrivals.size() << " packets");
  CHECK(s.wakes <= 2 * 100 + 40);
  CHECK(s.kernel_wakes <= ProgressPolicy::kTookWake * (100 + 10));
}

TEST_CASE("a stream's sender, inside its posts when its ACKs arrive: they are left to it", "[policy]") {
  // ib_write_bw's sender: each post's send takes 60 us of the kernel's
  // time, with the engine held; a poll of 1 us between; the ACK of an
  // earlier batch arrives in the middle of each send. The application is
  // there (in a call): the thread takes no pass (it would only wait for
  // the engine and take turns with the application for the core), and the
  // stream keeps it off the NIC.
  Model m;
  uint64_t t = kT0 + 1 * kMs;
  for (; t < kT0 + 51 * kMs; t += 61 * kUs) {
    m.polls.push_back({t, t + 1 * kUs});
    m.calls.push_back({t + 1 * kUs, t + 61 * kUs});
    m.arrivals.push_back(t + 30 * kUs);
  }
  m.polls.push_back({t, t + 1 * kMs});   // (then it polls for the last ACKs)
  m.run(t + 1 * kMs);
  CHECK(m.takes_in(kT0 + 1 * kMs, kNever) == 0);   // (one at the start, before the first poll)
  CHECK(std::count(m.by_app.begin(), m.by_app.end(), true) == long(m.arrivals.size()));
  INFO(m.nic_wakes << " wake-ups by the NIC for " << m.arrivals.size() << " ACKs");
  CHECK(m.nic_wakes <= m.arrivals.size() / 4);
}

TEST_CASE("a polling application that stops: a packet after its last poll is taken within kHandNs", "[policy]") {
  // The application polls for 700 ms, the looks backed off to 16 ms, then
  // it stops without arming a CQ; a packet arrives just after, or 1 ms
  // after: the thread, asleep on the NIC, takes it at once.
  for (uint64_t gap : {1 * kUs, 1 * kMs}) {
    Model m;
    m.poll_from = kT0;
    m.poll_until = kT0 + 700 * kMs;
    m.arrivals = {m.poll_until + gap};
    m.run(m.poll_until + 100 * kMs);
    REQUIRE(m.received_at[0] != kNever);
    CHECK_FALSE(m.by_app[0]);
    const uint64_t late = m.received_at[0] - m.arrivals[0];
    INFO("arrived " << gap / kUs << " us after the last poll, taken " << late << " ns later");
    CHECK(late <= ProgressPolicy::kHandNs);
    // Once the application has gone quiet, no reply of its will carry the
    // ACKs: the pass is the thread's own, which sends them at once.
    if (gap >= 1 * kMs) {
      REQUIRE(m.handed.size() == m.takes.size());
      CHECK(std::none_of(m.handed.begin(), m.handed.end(), [](bool h) { return h; }));
    }
  }
  // The same right after a stream that kept the thread off the NIC: within
  // a quiet time and kHandNs.
  Model s;
  s.poll_from = kT0;
  s.poll_until = kT0 + 100 * kMs;
  for (uint64_t t = kT0 + 1 * kMs; t < s.poll_until; t += 10 * kUs) s.arrivals.push_back(t);
  s.arrivals.push_back(s.poll_until + 1 * kUs);
  s.run(s.poll_until + 100 * kMs);
  REQUIRE(s.received_at.back() != kNever);
  CHECK_FALSE(s.by_app.back());
  CHECK(s.received_at.back() - s.arrivals.back() <= 1 * kMs + ProgressPolicy::kHandNs);
}

// ib_write_lat's pattern: the application polls its send CQ until the ACK
// of its WRITE comes (and takes it), then spins on its memory until the
// peer's WRITE lands gap later, which only a progress pass places; a round
// every gap + 22 us, for 50 ms. Returns the latest a WRITE was taken after
// it came (each must be taken by the thread).
static uint64_t passive_target(Model &m, uint64_t gap) {
  std::vector<size_t> writes;
  for (uint64_t t = kT0 + 1 * kMs; t < kT0 + 51 * kMs; t += gap + 22 * kUs) {
    m.polls.push_back({t - 2 * kUs, t});   // polling; the ACK arrives as it ends
    m.arrivals.push_back(t);
    writes.push_back(m.arrivals.size());
    m.arrivals.push_back(t + gap);         // the peer's WRITE
  }
  m.run(kT0 + 60 * kMs);
  uint64_t worst = 0;
  for (size_t i : writes) {
    REQUIRE(m.received_at[i] != kNever);
    REQUIRE_FALSE(m.by_app[i]);
    worst = std::max(worst, m.received_at[i] - m.arrivals[i]);
    // ... in a pass marked as the application's (its ACK waits for the
    // reply the application posts, which carries it: the peer, polling for
    // that ACK, then takes the reply itself).
    const auto t = std::find(m.takes.begin(), m.takes.end(), m.received_at[i]);
    REQUIRE(t != m.takes.end());
    CHECK(m.handed[size_t(t - m.takes.begin())]);
  }
  return worst;
}

TEST_CASE("a passive target that polls its send CQ in between: each request taken within kHandNs", "[policy]") {
  for (uint64_t gap : {3 * kUs, 30 * kUs}) {
    Model m;
    const uint64_t worst = passive_target(m, gap);
    INFO("gap " << gap / kUs << " us: the WRITEs taken at worst " << worst << " ns after they came");
    CHECK(worst <= ProgressPolicy::kHandNs);
  }
}

TEST_CASE("a passive target on a NIC without a wait fd: each request taken within two look periods", "[policy]") {
  // The thread cannot sleep on such a NIC (an ofi provider without
  // FI_WAIT_FD): it looks every 200 us while the application polls.
  ProgressPolicy::Config c = defaults();
  c.no_wait_fd_poll_ns = 200 * kUs;
  Model m(c);
  m.no_fd = true;
  const uint64_t worst = passive_target(m, 30 * kUs);
  INFO("the WRITEs taken at worst " << worst << " ns after they came");
  CHECK(worst <= 2 * 200 * kUs);
}

TEST_CASE("arming a CQ for an event hands the engine to the progress thread at once", "[policy]") {
  Model m;
  m.poll_from = kT0;
  m.poll_until = kT0 + 700 * kMs;   // it would have polled on: the arm stops it
  m.arm_at = kT0 + 650 * kMs + 123 * kUs;
  // The SEND's ACK arrives 30 us after the arm; the completion event
  // needs the thread to receive it.
  m.arrivals = {m.arm_at + 30 * kUs};
  m.run(kT0 + 800 * kMs);
  CHECK(m.takes_in(kT0, m.arm_at) == 0);
  REQUIRE(m.takes_in(m.arm_at, m.arm_at + 1) == 1);   // woken by app_waits, at once
  CHECK(m.received_at[0] == m.arrivals[0]);            // asleep on the NIC, taken as it comes

  // The arm lands between the policy's look at app_polled and the thread
  // announcing that it watches: the re-check sees it (no lost wake-up).
  ProgressPolicy p(defaults());
  const uint64_t now = kT0;
  REQUIRE(p.next(now, now - 10 * kUs).what == Do::sleep);
  CHECK_FALSE(p.app_active(now, 0));   // app_waits stored 0
  CHECK(p.next(now, 0).what == Do::take_engine);
}

TEST_CASE("a passive target with nobody polling is served as each packet arrives", "[policy]") {
  // Nobody polls (a passive RDMA target spins on its memory, or waits
  // elsewhere): every packet is received when it arrives, sleeping or
  // spinning.
  Model m;
  for (uint64_t t = kT0 + 1 * kMs; t < kT0 + 50 * kMs; t += 1 * kMs + 7 * kUs) m.arrivals.push_back(t);
  // A stream: packets 10 us apart, taken while spinning (within a yield).
  for (uint64_t t = kT0 + 60 * kMs; t < kT0 + 61 * kMs; t += 10 * kUs) m.arrivals.push_back(t);
  m.run(kT0 + 100 * kMs);
  uint64_t worst = 0;
  for (size_t i = 0; i < m.arrivals.size(); i++) {
    REQUIRE(m.received_at[i] != kNever);
    worst = std::max(worst, m.received_at[i] - m.arrivals[i]);
  }
  CHECK(worst <= m.yield_ns);
  CHECK(m.spins > 0);
  CHECK(m.watch_sleeps.empty());
  CHECK(m.slept_forever);   // idle at the end: no timer, asleep on the NIC only

  // The same with an application spinning on the thread's core: each
  // yield gives the core away (100 us). After three such yields in a row
  // the thread stops spinning for 20 ms and sleeps on the NIC instead, and
  // is still woken by each packet.
  Model c;
  c.yield_ns = 100 * kUs;
  for (uint64_t t = kT0 + 1 * kMs; t < kT0 + 40 * kMs; t += 30 * kUs) c.arrivals.push_back(t);
  c.run(kT0 + 50 * kMs);
  worst = 0;
  for (size_t i = 0; i < c.arrivals.size(); i++) {
    REQUIRE(c.received_at[i] != kNever);
    worst = std::max(worst, c.received_at[i] - c.arrivals[i]);
  }
  CHECK(worst <= c.yield_ns);
  // 39 ms of packets every 30 us: spins only in the first burst and after
  // the 20 ms pause, three each.
  CHECK(c.spins == 6);
  CHECK(c.nic_sleeps.size() > 1000);
}

TEST_CASE("idle: the thread sleeps on the NIC until the engine's next timer, or for ever", "[policy]") {
  Model m;
  m.timer = kT0 + 37 * kMs;
  m.run(kT0 + 100 * kMs);
  CHECK(m.timer_ran == kT0 + 37 * kMs);   // woken by its timeout, not before
  CHECK(m.takes == std::vector<uint64_t>{kT0, kT0 + 37 * kMs});
  CHECK(m.nic_sleeps.size() == 2);
  CHECK(m.slept_forever);
  CHECK(m.last_until == kNever);   // (progress_loop flushes the counters then)

  ProgressPolicy p(defaults());
  // A timer already due, or packets the NIC holds beyond its fd: at once.
  CHECK(p.after_pass(kT0, false, kT0, false).what == Do::take_engine);
  CHECK(p.after_pass(kT0, false, kT0 + kMs, true).what == Do::take_engine);
  auto d = p.after_pass(kT0, false, kT0 + 5 * kMs, false);
  CHECK(d.what == Do::sleep);
  CHECK(d.on_nic);
  CHECK(d.until == kT0 + 5 * kMs);

  // A NIC without a wait fd is looked at every 200 us.
  ProgressPolicy::Config c = defaults();
  c.no_wait_fd_poll_ns = 200 * kUs;
  ProgressPolicy q(c);
  d = q.after_pass(kT0, false, kNever, false);
  CHECK(d.what == Do::sleep);
  CHECK(d.until == kT0 + 200 * kUs);
}

TEST_CASE("after a packet the thread spins for USRC_BUSY_POLL_US, looking at port events each ms", "[policy]") {
  ProgressPolicy p(defaults());
  auto d = p.after_pass(kT0, true, kNever, false);
  CHECK(d.what == Do::spin);
  CHECK(d.until == kNever);
  CHECK(p.after_pass(kT0 + 49 * kUs, false, kNever, false).what == Do::spin);
  CHECK(p.after_pass(kT0 + 50 * kUs, false, kNever, false).what == Do::sleep);

  // Port events: on the first spin, then once a millisecond.
  ProgressPolicy n(defaults());
  int looks = 0;
  for (uint64_t t = kT0; t < kT0 + 10 * kMs; t += 10 * kUs) {
    REQUIRE(n.after_pass(t, true, kNever, false).what == Do::spin);
    looks += n.yielded(t, t + 1 * kUs);
  }
  CHECK(looks == 10);

  // No spinning at all with USRC_BUSY_POLL_US=0 (or at real-time priority).
  ProgressPolicy::Config c = defaults();
  c.spin_ns = 0;
  ProgressPolicy z(c);
  CHECK(z.after_pass(kT0, true, kNever, false).what == Do::sleep);

  // One slow yield may be the hypervisor's: the spinning goes on.
  ProgressPolicy h(defaults());
  REQUIRE(h.after_pass(kT0, true, kNever, false).what == Do::spin);
  h.yielded(kT0, kT0 + 200 * kUs);
  h.yielded(kT0 + 200 * kUs, kT0 + 201 * kUs);
  CHECK(h.after_pass(kT0 + 202 * kUs, true, kNever, false).what == Do::spin);
}
