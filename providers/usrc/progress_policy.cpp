#include "usrc/progress_policy.h"

#include <algorithm>

namespace usrc {

ProgressPolicy::Decision ProgressPolicy::next(uint64_t now, uint64_t app_polled) {
  if (!app_active(now, app_polled)) {
    looks_active_ = 0;
    return {Do::take_engine};
  }
  // The application polls: it receives and runs the timers in its own
  // thread (two threads racing for the same packets cost a wake-up and a
  // core each). Taking the engine from it would cost it a futex wake-up (and
  // both threads a core): look again when it may have gone quiet.
  //
  // Every look wakes this thread, and on a machine whose cores all poll it
  // takes a core from one of them: a thousand looks a second cost a
  // small-message stream about a tenth of its rate on two cores. So each
  // look that finds the application still polling doubles the time to the
  // next (up to kMaxBackoff doublings). The price is the first look after
  // a long stretch of polling coming later (16 ms at the default
  // USRC_APP_QUIET_US): an application that then stops polling has its
  // packets taken, held ACKs sent and timers run that much later, once.
  // One that arms a CQ for an event wakes the thread at once
  // (Context::app_waits).
  //
  // Off the NIC's wait queue altogether meanwhile: a waiter there, even one
  // asking for no event, makes every sender's packet walk the queue under
  // its lock.
  const uint64_t busy_until = app_polled + cfg_.app_quiet_ns;
  const uint64_t until =
      std::max(busy_until, now + (cfg_.app_quiet_ns << std::min(looks_active_, kMaxBackoff)));
  looks_active_++;
  return {Do::sleep, until, false};   // (until > now: busy_until is)
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
