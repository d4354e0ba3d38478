// A context's engine, its progress thread, its MR table and async events.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "usrc/common/log.h"
#include "usrc/common/random.h"
#include "usrc/common/tunables.h"
#include "usrc/net/ofi.h"
#include "usrc/net/shm.h"
#include "usrc/net/trace.h"
#include "usrc/net/udp.h"
#include "usrc/net/xdp.h"
#include "usrc/progress_policy.h"
#include "usrc/usrc.h"

namespace usrc {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

Context *Context::open(const DeviceConfig &cfg, std::string *err) {
  std::unique_ptr<Context> c(new Context);
  c->cfg_ = cfg;
  const Tunables &t = Tunables::get();

  // Pick a free process slot: its UDP port is base_port + slot. Start at a
  // random slot: concurrent openers rarely collide, and a process restarted
  // with the same pid (a fresh pid namespace) does not get its
  // predecessor's slot, hence QPNs and port, back: its predecessor's
  // packets still on their way find no QP.
  std::unique_ptr<net::Nic> nic;
  uint32_t slot = 0, rcvbuf = 0;
  size_t max_payload = SIZE_MAX;
  uint32_t start = random_u32() % kMaxSlots;
  for (uint32_t i = 0; i < kMaxSlots && !nic; i++) {
    slot = 1 + (start + i) % kMaxSlots;
    if (uint32_t(cfg.base_port) + slot > 65535) continue;
    int e = 0;
    net::Endpoint local{cfg.ipv4, static_cast<uint16_t>(cfg.base_port + slot)};
    if (cfg.backend == Backend::udp) {
      auto u = net::UdpNic::open(local, t.sock_buf, t.rx_batch, t.gso, &e, err);
      if (u) rcvbuf = u->rcvbuf();
      nic = std::move(u);
    } else if (cfg.backend == Backend::ofi) {
#ifdef USRC_HAVE_OFI
      nic = net::open_ofi_nic(local, cfg.provider, t.rx_batch, &max_payload, &e, err);
#else
      *err = "backend ofi: this usrc was built without libfabric (libfabric-dev)";
      return nullptr;
#endif
    } else if (cfg.backend == Backend::xdp) {
#ifdef USRC_HAVE_XDP
      nic = net::open_xdp_nic(local, cfg.netdev, t.rx_batch, &e, err);
      max_payload = 4096 - 42;   // one UMEM frame less Ethernet/IPv4/UDP
#else
      *err = "backend xdp: this usrc was built without AF_XDP support (libxdp-dev, libbpf-dev, clang)";
      return nullptr;
#endif
    }
    if (!nic && e == EBUSY && err->empty()) return nullptr;   // nested libfabric probe
    if (!nic && e != EADDRINUSE) {
      *err = std::string("cannot open the ") + backend_name(cfg.backend) +
             " NIC on the device address (" + *err + "); is " + cfg.netdev +
             " up with that address in this network namespace?";
      return nullptr;
    }
  }
  if (!nic) {
    *err = "no free UDP port in the device's range";
    return nullptr;
  }
  // The largest packet: a full PMTU payload plus BTH, RETH/ImmDt and ICRC.
  if (max_payload < cfg.active_mtu + 64) {
    *err = "the NIC carries at most " + std::to_string(max_payload) + " bytes: MTU " +
           std::to_string(cfg.active_mtu) + " is too large";
    return nullptr;
  }
  // Size the send window to what the peer's socket buffer can hold (we
  // assume the peer is configured like us): loss from buffer overflow would
  // otherwise be the common case on loopback. Backends with their own
  // receive rings get a fixed window below their ring size.
  uint32_t per_pkt = cfg.active_mtu + 1024;
  uint32_t window = t.tx_window ? t.tx_window
                    : rcvbuf    ? std::clamp<uint32_t>(rcvbuf / (2 * per_pkt), 8, 256)
                                : 64;
  std::unique_ptr<net::Nic> dev = std::move(nic);
  if (cfg.backend == Backend::udp && t.shm) {
    // Peers on this host: through shared memory (net/shm.h).
    std::string serr;
    if (auto s = net::ShmNic::wrap(dev, &serr)) dev = std::move(s);
    else log().warn("{}: no shared-memory ring, peers on this host use the socket: {}", cfg.name, serr);
  }
  if (const char *trace = getenv("USRC_TRACE"); trace && *trace) {
    // Packet capture (usrc trace): every datagram to a pcap file.
    std::string path = net::trace_path(trace), terr;
    if (auto t = net::TraceNic::wrap(dev, path, &terr)) dev = std::move(t);
    else log().warn("{}: no trace: {}", cfg.name, terr);
  }
  c->engine_ = std::make_unique<rc::Engine>(std::move(dev), slot, cfg.base_port, now_ns,
                                            c.get(), c.get());
  c->engine_->max_window = window;

  c->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->wake_fd_ < 0 ||
      socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, c->async_fd_) != 0) {
    *err = std::string("eventfd/socketpair: ") + strerror(errno);
    return nullptr;
  }
  fcntl(c->async_fd_[1], F_SETFL, O_NONBLOCK);

  c->watch_netdev();

  // The engine counts straight into this context's own counters file
  // (include/usrc/device.h, CountersFile).
  if (std::string why; c->counters_.open(cfg.name, &why))
    c->engine_->counters = c->counters_.values();
  else
    log().warn("{}: no counters: {}", cfg.name, why);
  log().info("{}: slot {} port {} window {}", cfg.name, slot, cfg.base_port + slot, window);
  c->thread_ = std::thread([p = c.get()] { p->progress_loop(); });
  return c.release();
}

Context::~Context() {
  // Let destroyed QPs answer the peer's last retransmissions (bounded by
  // the linger time of each, at most a second).
  for (int i = 0; i < 1100 && engine_; i++) {
    {
      std::lock_guard g(engine_->mu);
      if (!engine_->lingering()) break;
    }
    usleep(1000);
  }
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  engine_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (nl_fd_ >= 0) ::close(nl_fd_);
  // async_fd_[0] belongs to libibverbs now (verbs_uninit_context closes it).
  if (async_fd_[1] >= 0) ::close(async_fd_[1]);
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
  }
  engine_->local_peers().owner_thread(true);
  const int nic_fd = engine_->nic().wait_fd();
  pollfd fds[3] = {{nic_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0},
                   {nl_fd_, POLLIN, 0}};
  // When to take the engine, spin or sleep: progress_policy.h. Never spin
  // at real-time priority: a spinning FIFO thread would keep the
  // application off its core.
  ProgressPolicy::Config pc;
  pc.app_quiet_ns = uint64_t(t.app_quiet_us) * 1000;
  pc.spin_ns = t.progress_rt ? 0 : uint64_t(t.busy_poll_us) * 1000;
  pc.no_wait_fd_poll_ns = nic_fd < 0 ? 200'000 : 0;
  ProgressPolicy policy(pc);
  while (!stop_) {
    uint64_t now = now_ns();
    ProgressPolicy::Decision d = policy.next(now, app_polled_.load(std::memory_order_relaxed));
    if (d.what == ProgressPolicy::Do::sleep) {
      // The application polls and runs the timers itself: until it stops,
      // kick() need not wake us for a timer.
      sleep_until_.store(0, std::memory_order_release);
      // (app_waits() wakes us: set before its look at app_polled_ below.)
      watching_.store(true, std::memory_order_seq_cst);
      if (!policy.app_active(now, app_polled_.load(std::memory_order_seq_cst))) {
        watching_.store(false, std::memory_order_relaxed);
        continue;
      }
    } else {
      watching_.store(false, std::memory_order_relaxed);
      std::lock_guard g(engine_->mu);
      const size_t received = engine_->progress();
      now = now_ns();
      d = policy.after_pass(now, received != 0, engine_->next_deadline(),
                            engine_->nic().rx_pending());
      // kick() wakes us only for a timer earlier than this.
      sleep_until_.store(d.until, std::memory_order_release);
    }
    if (d.what == ProgressPolicy::Do::take_engine) continue;
    if (d.what == ProgressPolicy::Do::spin) {
      const uint64_t t0 = now_ns();
      sched_yield();
      const uint64_t t1 = now_ns();
      if (policy.yielded(t0, t1) && nl_fd_ >= 0) netdev_events();
      continue;
    }
    timespec ts, *tsp = nullptr;
    if (d.until != UINT64_MAX) {
      uint64_t w = d.until - now;
      ts = {static_cast<time_t>(w / 1000000000ull), static_cast<long>(w % 1000000000ull)};
      tsp = &ts;
    }
    // On the socket: datagrams a backend holds elsewhere (a shared-memory
    // ring) say so now, or have a doorbell rung once we are asleep.
    fds[0].fd = d.on_nic ? nic_fd : -1;
    const bool on_nic = fds[0].fd >= 0;
    if (on_nic && !engine_->nic().prepare_wait()) continue;
    int r = ppoll(fds, 3, tsp, nullptr);
    if (on_nic) engine_->nic().end_wait();
    if (r > 0 && (fds[1].revents & POLLIN)) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    if (r > 0 && (fds[2].revents & POLLIN)) netdev_events();
  }
  engine_->local_peers().owner_thread(false);
}

void Context::kick() {
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
  if (engine_->placed_since_pass.load(std::memory_order_relaxed)) {
    try_progress();
    return;
  }
  app_polled_.store(now_ns(), std::memory_order_relaxed);
}

void Context::app_waits() {
  // (Against progress_loop's store of watching_ and look at app_polled_:
  // one of the two sees the other.)
  app_polled_.store(0, std::memory_order_seq_cst);
  if (watching_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
}

uint32_t Context::try_progress(const rc::Engine::DirectWc *direct, bool polling) {
  const uint64_t now = now_ns();
  // (A load and a store, not an exchange: several threads polling may
  // lose one another's time, which only needs to be recent.)
  const uint64_t prev = polling ? app_polled_.load(std::memory_order_relaxed) : 0;
  if (polling) app_polled_.store(now, std::memory_order_relaxed);
  if (!engine_->mu.try_lock()) return 0;
  // ACKs may wait for the application's next call only while it polls in a
  // loop: the progress thread then looks in within USRC_APP_QUIET_US and
  // sends them should the application stop. After a quiet spell that
  // thread may be asleep on the socket with no timeout: send at once.
  const uint64_t quiet = uint64_t(Tunables::get().app_quiet_us) * 1000;
  const bool looping = prev + quiet > now;   // prev may be later (another thread)
  if (direct) engine_->direct = *direct;
  engine_->progress(looping, now);
  const uint32_t n = engine_->direct.n;
  engine_->direct = {};
  // (Looked at only if needed: the ring's head is another core's line.)
  const bool pending = !looping && engine_->nic().rx_pending();
  engine_->mu.unlock();
  if (pending) {
    // Packets left in the NIC and an application that may not call again:
    // the progress thread, maybe asleep on the socket, takes them.
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  kick();
  return n;
}

void Context::async_event(void *element, ibv_event_type type) {
  // The record libibverbs reads from async_fd (struct ib_uverbs_async_event_desc).
  struct {
    uint64_t element;
    uint32_t event_type;
    uint32_t reserved;
  } ev{reinterpret_cast<uintptr_t>(element), static_cast<uint32_t>(type), 0};
  if (send(async_fd_[1], &ev, sizeof ev, MSG_DONTWAIT) != sizeof ev)
    log().warn("async event {} lost: {}", static_cast<int>(type), strerror(errno));
}

void Context::qp_event(rc::Qp &qp, rc::QpEvent ev) {
  if (!qp.user) return;   // destroyed
  ibv_event_type t = IBV_EVENT_QP_FATAL;
  switch (ev) {
    case rc::QpEvent::comm_est: t = IBV_EVENT_COMM_EST; break;
    case rc::QpEvent::fatal: t = IBV_EVENT_QP_FATAL; break;
    case rc::QpEvent::req_err: t = IBV_EVENT_QP_REQ_ERR; break;
    case rc::QpEvent::access_err: t = IBV_EVENT_QP_ACCESS_ERR; break;
    case rc::QpEvent::sq_drained: t = IBV_EVENT_SQ_DRAINED; break;
  }
  async_event(&static_cast<Qp *>(qp.user)->vqp.qp, t);
}

uint32_t Context::add_mr(Mr *mr) {
  // A key is an index in the low 24 bits, counted from a random start, and
  // 8 random bits above it (as rxe's index and random byte): a peer must
  // have been given the key, another process cannot guess it. Indices are
  // not reused within a context (until they wrap, past 16 million
  // registrations), so a stale rkey does not reach a newer registration;
  // a key is unique among the live MRs.
  if (!next_key_) next_key_ = random_u32();
  for (;;) {
    const uint32_t index = next_key_++ & 0xffffff;
    const uint32_t key = (random_u32() & 0xff000000u) | index;
    if (!index || mrs_.contains(key)) continue;
    mrs_[key] = mr;
    return key;
  }
}
void Context::remove_mr(uint32_t key) {
  mrs_.erase(key);
  if (key == last_key_) last_key_ = 0, last_mr_ = nullptr;
}
Mr *Context::lookup_mr(uint32_t key) {
  auto it = mrs_.find(key);
  if (it == mrs_.end()) return nullptr;
  last_key_ = key;
  return last_mr_ = it->second;
}

uint8_t *Context::resolve(const void *pd, uint32_t rkey, uint64_t va, uint64_t len,
                          uint32_t access) {
  Mr *mr = find_mr(rkey);
  if (!mr || mr->pd != pd || (mr->access & access) != access) return nullptr;
  // (No system call to see that ODP memory is mapped: every access the
  // responder makes is guarded, and each WRITE packet resolves again.)
  return mr->range(va, len);
}

}  // namespace usrc
