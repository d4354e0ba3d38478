// The context's progress thread, and the application's calls that hand
// the engine to it or take it (ProgressPolicy, progress_policy.h, decides
// when).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "usrc/common/log.h"
#include "usrc/common/tunables.h"
#include "usrc/progress_policy.h"
#include "usrc/usrc.h"

namespace usrc {

namespace {
// sched_setattr(2)'s argument, its first version (48 bytes; glibc 2.36 has
// no declaration and <linux/sched/types.h> clashes with <sched.h>).
struct SchedAttr {
  uint32_t size, sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
};
static_assert(sizeof(SchedAttr) == 48);
}  // namespace

// How soon the progress thread looks again while forwarded XRC packets
// wait to be sent (Context::xrc_send_waiting).
constexpr uint64_t kXrcRetryNs = 20'000;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

// The progress thread: guarantees ACKs, retransmissions, timeouts and the
// execution of one-sided requests when the application is not calling in.
// It sleeps in ppoll on the socket, a wake eventfd and the next timer.
void Context::progress_loop() {
  // The thread sleeps almost always; when a packet arrives it must run at
  // once even if the application spins on every core (a passive RDMA
  // target polling its memory). A real-time priority gives that where the
  // process may have it (root, CAP_SYS_NICE, RLIMIT_RTPRIO); elsewhere the
  // thread runs at normal priority. Off by default (USRC_PROGRESS_RT=1):
  // on few cores it slows programs that poll their CQs.
  const Tunables &t = Tunables::get();
  if (t.progress_rt) {
    sched_param sp{};
    sp.sched_priority = 1;
    pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
  } else if (t.progress_slice_us) {
    // On a machine whose cores are all busy (a CPU-bound process beside
    // the application) a woken thread otherwise waits for the running
    // one's slice (milliseconds under EEVDF) before it runs: a passive
    // target's every request, and every ACK the sender's window waits
    // for, would. A short slice (Linux 6.12's custom slices: any user, no
    // more CPU share) makes it preempt on wake-up; older kernels ignore
    // the field for SCHED_OTHER.
    SchedAttr sa{};
    sa.size = sizeof sa;
    sa.sched_policy = SCHED_OTHER;
    sa.sched_runtime = uint64_t(t.progress_slice_us) * 1000;
    if (syscall(SYS_sched_setattr, 0, &sa, 0) != 0)
      log().debug("progress thread: no custom time slice: {}", strerror(errno));
  }
  engine_->local_peers().owner_thread(true);
  const int nic_fd = engine_->nic().wait_fd();
  pollfd fds[4] = {{nic_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0},
                   {nl_fd_, POLLIN, 0}, {-1, POLLIN, 0}};
  // When to take the engine, spin or sleep: progress_policy.h. Never spin
  // at real-time priority: a spinning FIFO thread would keep the
  // application off its core.
  ProgressPolicy::Config pc;
  pc.app_quiet_ns = uint64_t(t.app_quiet_us) * 1000;
  pc.spin_ns = t.progress_rt ? 0 : uint64_t(t.busy_poll_us) * 1000;
  pc.no_wait_fd_poll_ns = nic_fd < 0 ? 200'000 : 0;
  ProgressPolicy policy(pc);
  // The policy's short sleeps (ProgressPolicy::kOffNs) are meant as
  // written, not rounded up by the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  bool nic_woke = false;   // datagrams ended a sleep while the application polled
  uint32_t took = 0;       // the application's passes that took some during that sleep
  uint64_t crowded_at = 0;   // when cores_crowded() was last looked at
  bool crowded = false;
  // Keeps the core, no system call, until `until` or the application's
  // next verbs call after `calls`, or one it is in (ProgressPolicy::Do::hold,
  // held ACKs). Returns whether the application called in.
  auto hold = [this](uint64_t until, uint64_t calls) {
    for (;;) {
      if (app_calls_.load(std::memory_order_relaxed) != calls || engine_->mu.held()) return true;
      if (now_ns() >= until) return false;
      cpu_relax();
    }
  };
  // The last hold ended on the application's call (which a post counts
  // only once it is done).
  bool called = false;
  while (!stop_) {
    uint64_t now = now_ns();
    const uint64_t app = app_polled_.load(std::memory_order_relaxed);
    const uint64_t calls = app_calls_.load(std::memory_order_relaxed);
    if (took) policy.app_took(now, took), took = 0;
    ProgressPolicy::Decision d = nic_woke ? policy.nic_woke(now, calls)
                                          : policy.next(now, app, policy.nic_check() && nic_ready(nic_fd), calls,
                                                        called || engine_->mu.held());
    nic_woke = false;
    if (d.what == ProgressPolicy::Do::hold) {
      // (A call ends it early: the application is there to take the packets.)
      called = hold(d.until, calls);
      continue;
    }
    called = false;
    const bool watch = d.what == ProgressPolicy::Do::sleep;
    if (watch) {
      // The application polls and runs the timers itself: until it stops,
      // kick() need not wake us for a timer.
      sleep_until_.store(0, std::memory_order_release);
      // (app_waits() wakes us: set before its look at app_polled_ below.)
      watch_.store(kWatch, std::memory_order_seq_cst);
      if (!policy.app_active(now, app_polled_.load(std::memory_order_seq_cst))) {
        watch_.store(kAwake, std::memory_order_relaxed);
        continue;
      }
    } else {
      watch_.store(kAwake, std::memory_order_relaxed);
      const bool handed = d.handed;
      bool held = false;
      {
        std::lock_guard g(engine_->mu);
        // (Packets the polling application left: its ACKs wait for its reply.)
        const size_t received = engine_->progress(handed ? rc::Engine::Poller::handed : rc::Engine::Poller::thread);
        held = engine_->acks_held();
        xrc_progress();
        now = now_ns();
        d = policy.after_pass(now, received != 0, engine_->next_deadline(),
                              engine_->nic().rx_pending());
        // kick() wakes us only for a timer earlier than this.
        sleep_until_.store(d.until, std::memory_order_release);
      }
      if (held) {
        // A passive target (spinning on its memory, ib_write_lat) that
        // answers what we placed: its reply carries the ACKs, and the peer,
        // polling for them, takes the reply in the same pass instead of its
        // own progress thread being woken for it (on a machine whose cores
        // are all busy, each such wake-up may hand a core to another
        // process for a time slice). kHandNs at most, then they go alone.
        hold(now + ProgressPolicy::kHandNs, calls);
        std::lock_guard g(engine_->mu);
        engine_->flush_acks();
      }
    }
    if (d.what == ProgressPolicy::Do::take_engine) continue;
    // Spin only while a core is free: with every core taken (applications
    // spinning on their memory, a CPU-bound process beside them) a spin
    // delays a runnable thread, and a yield into it loses the core for a
    // whole time slice (milliseconds) to a spinner, a stall for every
    // request that arrives meanwhile. Asleep, a packet wakes the thread
    // ahead of the spinners.
    // (Looked at every 20 us at most: the count moves on the scheduler's
    // ticks, and a look costs as much as the spin pass itself.)
    if (d.what == ProgressPolicy::Do::spin) {
      if (now - crowded_at >= 20000) {
        crowded = cores_crowded();
        crowded_at = now;
      }
      if (crowded) d = {ProgressPolicy::Do::sleep, d.until, true};
    }
    if (d.what == ProgressPolicy::Do::spin) {
      const uint64_t t0 = now_ns();
      sched_yield();
      const uint64_t t1 = now_ns();
      if (policy.yielded(t0, t1) && nl_fd_ >= 0) netdev_events();
      continue;
    }
    timespec ts, *tsp = nullptr;
    // (Forwarded XRC packets waiting for their owner: looked at again soon.)
    // (While the application polls, its own passes send them.)
    if (!watch && xrc_out_waiting_.load(std::memory_order_relaxed)) d.until = std::min(d.until, now + kXrcRetryNs);
    if (d.until != UINT64_MAX) {
      uint64_t w = d.until > now ? d.until - now : 0;
      ts = {static_cast<time_t>(w / 1000000000ull), static_cast<long>(w % 1000000000ull)};
      tsp = &ts;
    }
    // On the socket: datagrams a backend holds elsewhere (a shared-memory
    // ring) say so now, or have a doorbell rung once we are asleep.
    fds[0].fd = d.on_nic ? nic_fd : -1;
    const bool on_nic = fds[0].fd >= 0;
    // While the application polls, on the NIC's own fd only: its packets
    // from other hosts wake the thread (a passive target's), but peers on
    // this host are not made to ring a doorbell for every datagram they put
    // in our ring, a system call each (the application takes those itself).
    const bool doorbell = on_nic && !watch;
    if (on_nic && !engine_->nic().arm_wait()) {
      // Completions wait (a send's, which shows no datagram): taken now,
      // unless the application is in the engine and takes them itself.
      if (engine_->mu.try_lock()) {
        engine_->progress();
        engine_->mu.unlock();
      }
      continue;
    }
    if (doorbell && !engine_->nic().prepare_wait()) continue;
    // (And on the XRC socket, if there is one: packets other processes'
    // targets forward. While the application polls, it takes them.)
    fds[3].fd = watch ? -1 : xrc_fd_.load(std::memory_order_acquire);
    const bool nic_watch = watch && on_nic;
    if (nic_watch) watch_.store(kWatchNic, std::memory_order_relaxed);
    int r = ppoll(fds, 4, tsp, nullptr);
    if (doorbell) engine_->nic().end_wait();
    if (nic_watch) {
      watch_.store(kWatch, std::memory_order_relaxed);
      took = app_took_.exchange(0, std::memory_order_relaxed);
    }
    if (nic_watch && r > 0 && (fds[0].revents & POLLIN)) nic_woke = true;
    if (r > 0 && (fds[1].revents & POLLIN)) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    if (r > 0 && (fds[2].revents & POLLIN)) netdev_events();
  }
  engine_->local_peers().owner_thread(false);
}

// More threads are runnable on this machine than it has online cores
// (/proc/loadavg's running count, this thread included; about 1 us a look).
// Unknown: not crowded.
bool Context::cores_crowded() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  static const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char b[96];
  const ssize_t n = fd >= 0 ? pread(fd, b, sizeof b - 1, 0) : -1;
  if (n <= 0) return false;
  b[n] = 0;
  // "0.13 0.95 1.21 2/76 5691": the fourth field, before its slash.
  const char *p = b;
  for (int i = 0; i < 3 && p; i++)
    if ((p = strchr(p, ' '))) p++;
  return p && strtol(p, nullptr, 10) > cores;
}

// Datagrams wait on the NIC (its fd is readable, or it holds some the fd
// does not show).
// (The engine busy: the application is receiving, as good as taken.)
bool Context::nic_ready(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (fd >= 0 && poll(&p, 1, 0) > 0) return true;
  if (!engine_->mu.try_lock()) return false;
  const bool pending = engine_->nic().rx_pending();
  engine_->mu.unlock();
  return pending;
}

void Context::kick() {
  note_call();   // (after every post)
  // Every caller armed its timers under the engine lock and has released
  // it since: the progress thread either read them under that lock too or
  // stored its sleep_until_ before we took the lock. (While the application
  // polls, sleep_until_ is 0: it runs its timers itself.)
  if (engine_->next_deadline() < sleep_until_.load(std::memory_order_acquire)) {
    sleep_until_.store(0, std::memory_order_release);
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
}

void Context::found_completions() {
  if (engine_->completed_at_post.load(std::memory_order_relaxed)) {
    try_progress();
    return;
  }
  note_call();
  app_polled_.store(now_ns(), std::memory_order_relaxed);
}

void Context::app_waits() {
  // (Against progress_loop's store of watch_ and look at app_polled_:
  // one of the two sees the other.)
  app_polled_.store(0, std::memory_order_seq_cst);
  if (watch_.load(std::memory_order_seq_cst) != kAwake) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
}

uint32_t Context::try_progress(const rc::Engine::DirectWc *direct, bool polling) {
  const uint64_t now = now_ns();
  // (A load and a store, not an exchange: several threads polling may
  // lose one another's time, which only needs to be recent.)
  const uint64_t prev = polling ? app_polled_.load(std::memory_order_relaxed) : 0;
  if (polling) app_polled_.store(now, std::memory_order_relaxed), note_call();
  if (!engine_->mu.try_lock()) return 0;
  // ACKs may wait for the application's next call only while it polls in a
  // loop: the progress thread then looks in within USRC_APP_QUIET_US and
  // sends them should the application stop. After a quiet spell that
  // thread may be asleep on the socket with no timeout: send at once.
  const uint64_t quiet = uint64_t(Tunables::get().app_quiet_us) * 1000;
  const bool looping = prev + quiet > now;   // prev may be later (another thread)
  rc::Engine::DirectWc wc = direct ? *direct : rc::Engine::DirectWc{};
  engine_->progress(looping ? rc::Engine::Poller::app : rc::Engine::Poller::thread, now, direct ? &wc : nullptr);
  const size_t off_nic = engine_->wire_received();
  xrc_progress();
  const uint32_t n = wc.n;
  // (Looked at only if needed: the ring's head is another core's line.)
  const bool pending = !looping && engine_->nic().rx_pending();
  engine_->mu.unlock();
  // Datagrams taken off the NIC here while the progress thread sleeps on
  // its fd woke it in the kernel (a same-host peer's ring does not): a
  // stream of such passes has it told, once, to get off.
  const bool stream = off_nic && watch_.load(std::memory_order_relaxed) == kWatchNic &&
                      app_took_.fetch_add(1, std::memory_order_relaxed) + 1 == ProgressPolicy::kTookWake;
  if (pending || stream) {
    // (pending: packets left in the NIC and an application that may not
    // call again: the progress thread, maybe asleep on the socket, takes
    // them.)
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  kick();
  return n;
}

}  // namespace usrc
