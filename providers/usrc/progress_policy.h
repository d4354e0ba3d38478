// When the progress thread takes the engine, spins, or sleeps: the decisions
// of Context::progress_loop as a pure state machine. It reads no clock and
// makes no system call: the loop passes the time and what it saw, and
// executes the decision (tests/unit/test_progress_policy.cpp drives it in
// virtual time).
#pragma once

#include <cstdint>

namespace usrc {

class ProgressPolicy {
 public:
  struct Config {
    // USRC_APP_QUIET_US: an application that polled a CQ this recently
    // receives in its own thread; the progress thread stays out.
    uint64_t app_quiet_ns = 1'000'000;
    // USRC_BUSY_POLL_US (0 at real-time priority): how long after the
    // last received packet the thread spins instead of sleeping.
    uint64_t spin_ns = 50'000;
    // The NIC has no wait fd: look at it on this period, also while the
    // application polls (0: it has one).
    uint64_t no_wait_fd_poll_ns = 0;
  };

  enum class Do {
    take_engine,   // lock the engine and run a progress pass
    spin,          // yield the core once (sched_yield), then ask again
    sleep,         // wait for until, a wake-up (eventfd, netlink) or, on_nic, the NIC
    hold,          // keep the core, no system call, until until or the application calls in
  };
  struct Decision {
    Do what;
    // sleep: the wake time (UINT64_MAX: none). After a pass, whatever
    // what is: the engine's next deadline as adjusted here (the time a
    // kick() must beat to wake the thread; UINT64_MAX: no timer at all).
    uint64_t until = 0;
    bool on_nic = false;   // sleep on the NIC's fd as well
    // take_engine: for packets the polling application left (kHandNs): a
    // passive target's, whose reply, if it posts one soon, carries the ACKs.
    bool handed = false;
  };

  // Looks found the application still polling, in a row: each one doubles
  // the time to the next, up to this many doublings.
  static constexpr uint32_t kMaxBackoff = 4;
  // A yield that took longer than this gave the core away.
  static constexpr uint64_t kYieldedNs = 50'000;
  // Three such yields in a row stop the spinning for this long.
  static constexpr uint64_t kNoSpinNs = 20'000'000;
  // Port events while spinning: looked for this often.
  static constexpr uint64_t kNetlinkEveryNs = 1'000'000;
  // Packets arrived while the application polls: it is given this long to
  // take them, else the thread does. The thread holds its core meanwhile
  // (Do::hold): a polling application calls in far more often than this,
  // and one that spins on its memory is served without a second wake-up.
  static constexpr uint64_t kHandNs = 3'000;
  // More than this many arrivals in a row taken by the application (a
  // stream) keep the thread off the NIC for kOffNs, doubled each time up
  // to the quiet time: a receiving application is not taxed a wake-up per
  // packet.
  static constexpr uint32_t kStreamHands = 4;
  static constexpr uint64_t kOffNs = 10'000;
  // Datagrams the application takes off the NIC while the thread sleeps on
  // its fd wake the thread in the kernel all the same (its ppoll then finds
  // them gone and sleeps on, unseen here): the application counts its
  // passes that took some, and at this many wakes the thread to tell it
  // (app_took), once per stretch.
  static constexpr uint32_t kTookWake = kStreamHands + 1;

  explicit ProgressPolicy(const Config &c) : cfg_(c) {}

  // Whether an application whose last CQ poll was at app_polled (0: none,
  // or it armed a CQ and waits for its event) still counts as polling.
  bool app_active(uint64_t now, uint64_t app_polled) const {
    // (app_polled may be later than now: the application polls all along.)
    return app_polled + cfg_.app_quiet_ns > now;
  }

  // At the top of the loop: take the engine, or (the application polls)
  // sleep until it may have gone quiet, on the NIC as well (packets wake the
  // thread: nic_woke) unless a stream of them showed the application
  // receiving. nic_ready: packets wait on the NIC; read only when
  // nic_check() (a system call). app_calls: the application's verbs calls
  // so far (polls and posts), a count that only grows. in_call: the
  // application is inside one now, holding the engine (a post whose send
  // takes tens of microseconds of the kernel's time): it counts as a call.
  Decision next(uint64_t now, uint64_t app_polled, bool nic_ready = false, uint64_t app_calls = 0,
                bool in_call = false);
  bool nic_check() const { return woke_ != 0 || cfg_.no_wait_fd_poll_ns; }

  // A sleep from next() ended because packets arrived (the NIC's fd): the
  // application gets kHandNs to take them (Do::hold; the next next() looks).
  Decision nic_woke(uint64_t now, uint64_t app_calls);

  // n of the application's own passes took datagrams off the NIC while the
  // thread slept on its fd (counted as they took them; a wake-up at
  // kTookWake): hands as nic_woke's are, so that a stream keeps the thread
  // off the NIC.
  void app_took(uint64_t now, uint32_t n);

  // After a progress pass at now: received packets, the engine's next
  // timer, whether the NIC holds received packets its fd does not show.
  // take_engine: run again at once; spin; or sleep on the NIC.
  Decision after_pass(uint64_t now, bool received, uint64_t next_deadline, bool rx_pending);

  // A spin's sched_yield ran from t0 to t1. Returns whether to read the
  // port events (netlink) now.
  bool yielded(uint64_t t0, uint64_t t1);

  // How many looks in a row found the application polling (the backoff).
  uint32_t looks_active() const { return looks_active_; }

 private:
  Config cfg_;
  uint32_t looks_active_ = 0;
  uint64_t woke_ = 0;            // when packets woke the thread (0: they did not)
  uint64_t calls_at_wake_ = 0;   // the application's calls then
  uint64_t nic_off_until_ = 0;   // off the NIC until then
  uint32_t hands_ = 0;           // looks in a row that found the application taking them
  uint64_t last_hand_ = 0;       // ... the last of them
  uint64_t last_rx_ = 0, no_spin_until_ = 0, last_nl_ = 0;
  bool rx_seen_ = false;
  bool pending_seen_ = false;    // no wait fd: the last look found packets
  uint32_t contended_ = 0;
};

}  // namespace usrc
