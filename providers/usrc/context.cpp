// A context: opening and closing it, its MR table and async events. (Its
// NIC: backend.cpp; its progress thread: progress.cpp; the netdev it
// watches: netdev_watch.cpp.)
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "usrc/cm/sa.h"
#include "usrc/boundary.h"
#include "usrc/common/log.h"
#include "usrc/common/random.h"
#include "usrc/usrc.h"

namespace usrc {

Context *Context::open(const DeviceConfig &cfg, std::string *err) {
  std::unique_ptr<Context> c(new Context);
  c->cfg_ = cfg;
  uint32_t slot = 0, window = 0;
  std::unique_ptr<net::Nic> dev = open_nic(cfg, &slot, &window, err);
  if (!dev) return nullptr;
  c->engine_ = std::make_unique<rc::Engine>(std::move(dev), slot, cfg.base_port, now_ns,
                                            c.get(), c.get());
  c->engine_->max_window = window;
  c->engine_->ud_grh_ipv4 = cfg.link_layer == LinkLayer::roce;
  c->engine_->roce_port = cfg.roce_port_in_use();
  if (cfg.link_layer == LinkLayer::ib && cfg.sa_ip) {
    // The SLIDs of UD completions: the SA's table of ports, asked once
    // (an SA that does not answer leaves it empty: SLID 0).
    auto lids = std::make_shared<std::unordered_map<uint32_t, uint16_t>>();
    sa::port_lids({cfg.sa_ip, cfg.sa_port}, cfg.ipv4, lids.get());
    c->engine_->sa_lids = std::move(lids);
  }

  c->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->wake_fd_ < 0) {
    *err = std::string("eventfd: ") + strerror(errno);
    return nullptr;
  }

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
  if (engine_) {   // (forwarded XRC packets still waiting: a last try)
    std::lock_guard g(engine_->mu);
    xrc_progress();
  }
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (xrc_fd_ >= 0) {   // (while the slot, hence the name, is still ours)
    unlink(xrc_path_.c_str());
    ::close(xrc_fd_);
  }
  engine_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  // (The read ends belong to libibverbs: verbs_uninit_context closes them.)
  for (const AsyncSink &s : async_) ::close(s.wfd);
}

int Context::add_async(ibv_context *to) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  std::lock_guard g(async_mu_);
  int e = 0;
  if (!no_throw([&] { async_.push_back({to, sv[1]}); }, &e)) {
    ::close(sv[0]);
    ::close(sv[1]);
    errno = e;
    return -1;
  }
  return sv[0];
}

void Context::remove_async(ibv_context *to) {
  std::lock_guard g(async_mu_);
  for (size_t i = 0; i < async_.size(); i++)
    if (async_[i].ctx == to) {
      ::close(async_[i].wfd);
      async_.erase(async_.begin() + long(i));
      return;
    }
}

void Context::async_event(ibv_context *to, void *element, ibv_event_type type) {
  // The record libibverbs reads from async_fd (struct ib_uverbs_async_event_desc).
  struct {
    uint64_t element;
    uint32_t event_type;
    uint32_t reserved;
  } ev{reinterpret_cast<uintptr_t>(element), static_cast<uint32_t>(type), 0};
  std::lock_guard g(async_mu_);
  for (const AsyncSink &s : async_)
    if ((!to || s.ctx == to) && send(s.wfd, &ev, sizeof ev, MSG_DONTWAIT) != sizeof ev)
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
    case rc::QpEvent::last_wqe: t = IBV_EVENT_QP_LAST_WQE_REACHED; break;
  }
  // (An XRC target's event goes to each of its handles, ibv_open_qp.)
  // (Each to its handle's context, which may be one of another Context.)
  const auto to = [t](Qp *h) { impl(h->vqp.qp.context).async_event(h->vqp.qp.context, &h->vqp.qp, t); };
  Qp *real = static_cast<Qp *>(qp.user);
  if (!real->closed) to(real);
  for (Qp *h : real->opened) to(h);
}

void Context::srq_event(rc::RecvQueue &q) {
  if (auto *s = static_cast<Srq *>(q.user)) async_event(s->vsrq.srq.context, &s->vsrq.srq, IBV_EVENT_SRQ_LIMIT_REACHED);
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
uint32_t Context::new_mw_key() {
  // A window's R_Key changes in its low 8 bits at every bind
  // (ibv_inc_rkey): it takes a block of 256 indices, none of which an MR
  // is given.
  if (!next_key_) next_key_ = random_u32();
  for (;;) {
    const uint32_t block = (next_key_ + 255) & ~255u;
    next_key_ = block + 256;
    if (const uint32_t index = block & 0xffffff) return (random_u32() & 0xff000000u) | index;
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

uint8_t *Context::resolve(const void *pd, uint32_t qpn, uint32_t rkey, uint64_t va, uint64_t len,
                          uint32_t access) {
  Mr *mr = find_mr(rkey);
  if (!mr || mr->pd != pd || (mr->access & access) != access || (mr->mw_qpn && mr->mw_qpn != qpn)) return nullptr;
  // (No system call to see that ODP memory is mapped: every access the
  // responder makes is guarded, and each WRITE packet resolves again.)
  return mr->range(va, len);
}

}  // namespace usrc
