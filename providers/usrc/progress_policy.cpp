#include "usrc/progress_policy.h"

#include <algorithm>

namespace usrc {

ProgressPolicy::Decision ProgressPolicy::next(uint64_t now, uint64_t app_polled, bool nic_ready,
                                              uint64_t app_calls, bool in_call) {
  if (!app_active(now, app_polled)) {
    looks_active_ = 0, hands_ = 0, woke_ = 0, nic_off_until_ = 0;
    return {Do::take_engine};
  }
  if (cfg_.no_wait_fd_poll_ns && !woke_) {
    // A NIC without a wait fd, looked at on its period (below): packets
    // there at two looks in a row, the application polling all along, are
    // not being received by it (a passive target spinning on its memory):
    // the thread takes them. (Its calls cannot tell: it polls its send CQ
    // between the looks whether or not it receives.)
    if (nic_ready && pending_seen_ && !in_call) {
      pending_seen_ = false, looks_active_ = 0, hands_ = 0;
      return {Do::take_engine, 0, false, true};
    }
    pending_seen_ = nic_ready;
  }
  if (woke_) {
    // Packets arrived kHandNs ago while the application was polling. Still
    // there and the application has made no call since: it is not
    // receiving them (a passive RDMA target spinning on its memory between
    // polls of its send CQ, waiting for a WRITE that only a progress pass
    // places): the thread takes them now, not when the quiet time runs
    // out. (Still there but it called in, or is in a call: a stream it
    // keeps receiving, or posts that keep it from its next poll a while; a
    // stream's sender spends most of its time inside its posts' sends,
    // and the thread, waiting for the engine, would only take turns with
    // it for the core.)
    if (nic_ready && app_calls == calls_at_wake_ && !in_call) {
      woke_ = 0, looks_active_ = 0, hands_ = 0;
      return {Do::take_engine, 0, false, true};
    }
    // Taken: the application receives in its own thread (two threads
    // racing for the same packets cost a wake-up and a core each).
    woke_ = 0;
    app_took(now, 1);
  }
  // The application polls: it receives and runs the timers in its own
  // thread. Look again when it may have gone quiet. Every look wakes this
  // thread, and on a machine whose cores all poll it takes a core from one
  // of them, so each look that finds the application still polling doubles
  // the time to the next (up to kMaxBackoff doublings); one that arms a CQ
  // for an event wakes it at once (Context::app_waits).
  const uint64_t busy_until = app_polled + cfg_.app_quiet_ns;
  const uint64_t until =
      std::max(busy_until, now + (cfg_.app_quiet_ns << std::min(looks_active_, kMaxBackoff)));
  looks_active_++;
  if (now < nic_off_until_) return {Do::sleep, std::min(until, nic_off_until_), false};
  // A NIC with no fd to wake the thread is looked at on its period
  // instead (above).
  if (cfg_.no_wait_fd_poll_ns) return {Do::sleep, std::min(until, now + cfg_.no_wait_fd_poll_ns), true};
  return {Do::sleep, until, true};   // (until > now: busy_until is)
}

void ProgressPolicy::app_took(uint64_t now, uint32_t n) {
  // (A quiet spell since the last, off the NIC or not: not a stream.)
  if (now > std::max(last_hand_, nic_off_until_) + cfg_.app_quiet_ns) hands_ = 0;
  last_hand_ = now;
  hands_ += n;
  if (hands_ > kStreamHands)
    nic_off_until_ = now + std::min(kOffNs << std::min(hands_ - kStreamHands - 1, 16u), cfg_.app_quiet_ns);
}

ProgressPolicy::Decision ProgressPolicy::nic_woke(uint64_t now, uint64_t app_calls) {
  woke_ = now;
  calls_at_wake_ = app_calls;
  return {Do::hold, now + kHandNs};
}

ProgressPolicy::Decision ProgressPolicy::after_pass(uint64_t now, bool received,
                                                    uint64_t next_deadline, bool rx_pending) {
  if (received) {
    last_rx_ = now;
    rx_seen_ = true;
  }
  uint64_t until = next_deadline;
  // Received packets held by the NIC (the rest of a coalesced receive),
  // which do not show on its fd, or a stream on: run again at once.
  if (rx_pending) until = 0;
  // A NIC without a wait fd is looked at on a short period instead.
  if (cfg_.no_wait_fd_poll_ns) until = std::min(until, now + cfg_.no_wait_fd_poll_ns);
  if (until <= now) return {Do::take_engine, until};
  // Busy polling: while packets keep coming, look again instead of going
  // to sleep, for up to spin_ns after the last one, yielding the core to
  // any other runnable thread. The next request or packet of a stream is
  // then taken without a wake-up: waking a thread on an idle virtual CPU
  // costs tens of microseconds (ib_read_lat's passive side: about 38 us a
  // READ sleeping, 8 us spinning), and the sender's send must do the
  // waking. Not for a while after yields that gave the core away (see
  // yielded()).
  if (rx_seen_ && now - last_rx_ < cfg_.spin_ns && now >= no_spin_until_)
    return {Do::spin, until};
  return {Do::sleep, until, true};
}

bool ProgressPolicy::yielded(uint64_t t0, uint64_t t1) {
  // Spin on an otherwise idle core only: any runnable thread goes first,
  // and a yield that gave the core away (an application spinning on its
  // memory, as a passive RDMA target does) stops the spinning for a while:
  // a thread that never sleeps is never woken ahead of the spinner by the
  // scheduler either.
  contended_ = t1 - t0 > kYieldedNs ? contended_ + 1 : 0;
  if (contended_ >= 3) {   // (once may be the hypervisor's doing)
    no_spin_until_ = t1 + kNoSpinNs;
    contended_ = 0;
  }
  // Port events while a stream lasts, looked for every millisecond (a
  // system call per spin would cost the spinner a tenth of its time).
  if (t1 - last_nl_ >= kNetlinkEveryNs) {
    last_nl_ = t1;
    return true;
  }
  return false;
}

}  // namespace usrc
