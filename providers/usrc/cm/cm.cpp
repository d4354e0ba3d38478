// The ucma commands and the CM protocol state machine (see cm.h, docs/cm.md).
// The kernel's rdma_cm over ib_cm is the reference for what each command
// and MAD does; IBA vol. 1 ch. 12 for the messages and their timers.
#include "usrc/cm/cm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>

#include "usrc/common/guard.h"

namespace usrc::cm {

namespace {

// rdma_cm event numbers (librdmacm's enum rdma_cm_event_type; the ABI).
enum : uint32_t {
  kAddrResolved = 0, kAddrError, kRouteResolved, kRouteError, kConnectRequest,
  kConnectResponse, kConnectError, kUnreachable, kRejected, kEstablished,
  kDisconnected, kDeviceRemoval, kMulticastJoin, kMulticastError, kAddrChange,
  kTimewaitExit,
};
constexpr uint16_t kPsTcp = 0x0106;   // RDMA_PS_TCP
constexpr uint16_t kPsUdp = 0x0111;   // RDMA_PS_UDP
constexpr uint32_t kUdpQkey = 0x01234567;   // RDMA_UDP_QKEY: the Q_Key of RDMA_PS_UDP
// Our REQ's CM timers: 4.096 us << 18 (about 1 s) per try, 3 retries
// (IBA 12.6.5: Remote/Local CM Response Timeout, Max CM Retries).
constexpr uint8_t kCmTimeout = 18, kCmRetries = 3;
constexpr uint8_t kLocalAckTimeout = 14;   // the QP's (RTS): 4.096 us << 14, 67 ms
// The RNR NAK timer the responder asks for: code 0, 655.36 ms (IBA table 45),
// as the kernel's cm_init_qp_rtr_attr gives; a peer with few RNR retries
// then waits seconds for a receive, not milliseconds.
constexpr uint8_t kMinRnrTimer = 0;
// How long a disconnected connection stays in timewait (IBA 12.9.7.4):
// 4.096 us << 17, about half a second, of the order of the kernel's (which
// waits a time derived from its path's packet lifetime); then TIMEWAIT_EXIT.
constexpr uint8_t kTimewait = 17;
constexpr uint8_t kMaxPrivate = 56;        // a REQ's 92 bytes less the IP CM header
constexpr uint8_t kMaxSidrPrivate = 180;   // a SIDR REQ's 216 bytes less the IP CM header

uint64_t timeout_ns(uint8_t code) { return 4096ull << std::min<uint8_t>(code, 31); }

void mapped_gid(uint32_t ip, uint8_t g[16]) {
  std::memset(g, 0, 16);
  g[10] = g[11] = 0xff;
  uint32_t be = htonl(ip);
  std::memcpy(g + 12, &be, 4);
}

sockaddr_in sin_of(uint32_t ip, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_addr.s_addr = htonl(ip);
  s.sin_port = htons(port);
  return s;
}

// Queues an event and makes the fd readable (the eventfd counts to 1 while
// anything is queued).
void push(File *f, const rdma_ucm_event_resp &e) {
  if (!f->readable && f->fd >= 0) {
    uint64_t one = 1;
    (void)!syscall(SYS_write, f->fd, &one, sizeof one);   // not our interposed write()
    f->readable = true;
  }
  f->events.push_back(e);
  f->cv.notify_all();
}

void drained(File *f) {
  if (f->events.empty() && f->readable) {
    uint64_t v;
    (void)!::read(f->fd, &v, sizeof v);   // 1: never blocks
    f->readable = false;
  }
}

}  // namespace

enum class St {
  idle, bound, addr_resolved, route_resolved, listen,
  req_sent, rep_rcvd,            // active: REQ out; REP in, CONNECT_RESPONSE given
  req_rcvd, rep_sent,            // passive: CONNECT_REQUEST given; REP out
  established, dreq_sent, dreq_rcvd,
  timewait,                      // disconnected; TIMEWAIT_EXIT when it ends
  closed,
};

struct Id {
  uint32_t handle = 0;
  uint64_t uid = 0;
  File *file = nullptr;
  St st = St::idle;
  uint16_t ps = kPsTcp;
  bool ud = false;                  // RDMA_PS_UDP: SIDR, no connection (IBA 12.11)
  bool child = false;               // made by a REQ: it shares its listener's port
  uint32_t qkey = 0;                // UD: the Q_Key in use
  uint32_t events_reported = 0;
  uint32_t src_ip = 0, dst_ip = 0;
  uint16_t src_port = 0, dst_port = 0;
  const Device *dev = nullptr;
  uint16_t dlid = 0;                // InfiniBand: the peer's LID from the SA or its REQ; 0: lid_for
  uint32_t listener = UINT32_MAX;   // a passive id: its listener's handle until accepted
  // The connection (IBA 12.6).
  uint32_t local_comm = 0, remote_comm = 0;
  uint32_t local_qpn = 0, remote_qpn = 0;
  uint32_t sq_psn = 0, rq_psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7, mtu = 3;
  uint8_t ack_timeout = kLocalAckTimeout;
  bool srq = false;
  uint64_t tid = 0;
  // The MAD resent on its timer (REQ, REP, DREQ) and the timer.
  uint8_t last[kMadLen] = {};
  bool has_last = false;
  uint8_t retries_left = 0, timeout_code = kCmTimeout;
  uint64_t deadline = UINT64_MAX;
};

Cm::Cm(Net &net) : net_(net) {}
Cm::~Cm() = default;

std::unique_ptr<File> Cm::open(int fd) {
  auto f = std::make_unique<File>();
  f->fd = fd;
  return f;
}

void Cm::close(File *f) {
  std::lock_guard g(mu_);
  std::vector<Id *> mine;
  for (auto &[h, id] : ids_) if (id->file == f) mine.push_back(id.get());
  for (Id *id : mine) destroy(id, true);
  f->events.clear();
}

Id *Cm::find(uint32_t handle, File *f) {
  auto it = ids_.find(handle);
  if (it == ids_.end() || it->second->file != f) return nullptr;
  return it->second.get();
}

Id *Cm::new_id(File *f, uint64_t uid) {
  // librdmacm keeps handles in an index map of 16 bits.
  for (uint32_t n = 0; n < 65536; n++) {
    uint32_t h = (next_handle_ + n) & 0xffff;
    if (ids_.count(h)) continue;
    next_handle_ = h + 1;
    auto id = std::make_unique<Id>();
    id->handle = h;
    id->uid = uid;
    id->file = f;
    Id *p = id.get();
    ids_.emplace(h, std::move(id));
    return p;
  }
  return nullptr;
}

// Ends an id: says goodbye to a peer as the kernel does when an id goes
// (a DREQ for a connection, a REJ for a request not yet answered, a DREP
// for a DREQ not yet answered), drops its queued events and forgets it.
void Cm::destroy(Id *id, bool goodbye) {
  if (goodbye && id->dev && id->ud) {
    // A SIDR REQ not answered yet is refused (the kernel's ib_destroy_cm_id).
    if (id->st == St::req_rcvd) {
      Msg m = base_msg(id, Attr::sidr_rep);
      m.sidr_status = kSidrRejected;
      send(id, m, false);
    }
  } else if (goodbye && id->dev) {
    switch (id->st) {
      case St::established: case St::rep_sent: case St::rep_rcvd:
        send(id, base_msg(id, Attr::dreq), false);
        break;
      case St::req_rcvd: case St::req_sent: {
        Msg m = base_msg(id, Attr::rej);
        m.reason = id->st == St::req_sent ? kRejTimeout : kRejConsumer;
        m.rejected = id->st == St::req_sent ? 2 : 0;
        send(id, m, false);
        break;
      }
      case St::dreq_rcvd:
        send(id, base_msg(id, Attr::drep), false);
        break;
      default:
        break;
    }
  }
  if (id->st == St::listen) {
    listeners_.erase(service_id(id->ps, id->src_port));
    net_.release_service(service_id(id->ps, id->src_port));
    // Requests it never reported die with it (and are refused); those
    // reported are the application's.
    std::vector<uint32_t> orphans;
    for (auto &ev : id->file->events)
      if (ev.event == kConnectRequest && ev.uid == id->uid) orphans.push_back(ev.id);
    for (auto &[h, c] : ids_) if (c->listener == id->handle) c->listener = UINT32_MAX;
    for (uint32_t h : orphans) {
      if (auto it = ids_.find(h); it != ids_.end()) destroy(it->second.get(), true);
    }
  }
  auto &q = id->file->events;
  q.erase(std::remove_if(q.begin(), q.end(),
                         [&](const rdma_ucm_event_resp &e) { return e.id == id->handle; }),
          q.end());
  drained(id->file);
  if (id->local_comm) by_comm_.erase(id->local_comm);
  if (id->remote_comm) {
    auto it = by_remote_.find({id->dst_ip, id->remote_comm});
    if (it != by_remote_.end() && it->second == id) by_remote_.erase(it);
  }
  ids_.erase(id->handle);
}

void Cm::fill_conn(Id *id, rdma_ucm_conn_param &p, const uint8_t *priv, size_t priv_len) {
  p.qp_num = id->remote_qpn;
  priv_len = std::min<size_t>(priv_len, sizeof p.private_data);
  if (priv_len) std::memcpy(p.private_data, priv, priv_len);
  p.private_data_len = static_cast<uint8_t>(priv_len);
  p.srq = id->srq;
  p.responder_resources = id->responder_resources;
  p.initiator_depth = id->initiator_depth;
  p.retry_count = id->retry_count;
  p.rnr_retry_count = id->rnr_retry_count;
  p.valid = 1;
}

void Cm::queue(Id *id, uint32_t event, int32_t status, const uint8_t *priv, size_t priv_len,
               uint64_t uid, uint32_t handle) {
  rdma_ucm_event_resp e{};
  e.uid = uid ? uid : id->uid;
  e.id = handle == UINT32_MAX ? id->handle : handle;
  e.event = event;
  e.status = static_cast<uint32_t>(status);
  if (id->ud) {
    priv_len = std::min<size_t>(priv_len, sizeof e.param.ud.private_data);
    if (priv_len) std::memcpy(e.param.ud.private_data, priv, priv_len);
    e.param.ud.private_data_len = static_cast<uint8_t>(priv_len);
  } else {
    fill_conn(id, e.param.conn, priv, priv_len);
  }
  push(id->file, e);
}

// The address vector usrc needs to reach the peer: a GRH with its
// The peer's LID: the SA's or its REQ's, else the low bits of its address.
static uint16_t peer_lid(const Id *id) { return id->dlid ? id->dlid : lid_for(id->dst_ip); }

// IPv4-mapped GID on either link layer, and its LID on InfiniBand.
void Cm::peer_ah(Id *id, ib_uverbs_ah_attr &ah) {
  ah = {};
  mapped_gid(id->dst_ip, ah.grh.dgid);
  ah.grh.sgid_index = id->dev->sgid_index;
  ah.grh.hop_limit = 64;
  ah.is_global = 1;
  ah.port_num = 1;
  if (id->dev->link_layer == LinkLayer::ib) ah.dlid = peer_lid(id);
}

// The devices are kept for the Cm's life (ids point at them); a device
// made since the last look is added when an address names it.
const Device *Cm::device_for_ip(uint32_t ip) {
  for (int pass = 0; pass < 2; pass++) {
    for (const auto &d : devs_) if (d->ipv4 == ip) return d.get();
    if (pass == 1) break;
    for (Device &n : net_.devices()) {
      bool known = false;
      for (const auto &d : devs_) known |= d->name == n.name && d->ipv4 == n.ipv4;
      if (!known) devs_.push_back(std::make_unique<Device>(std::move(n)));
    }
  }
  return nullptr;
}

// ip 0: any address (no device yet); port 0: one of the ephemeral range.
int Cm::bind(Id *id, uint32_t ip, uint16_t port) {
  const Device *d = nullptr;
  if (ip != 0) {
    d = device_for_ip(ip);
    // A loopback address no device has binds to no device yet, as a
    // wildcard does (the kernel binds it to its first device instead).
    // libfabric's verbs provider binds "localhost" to find its devices.
    if (!d && (ip >> 24) != 127) return EADDRNOTAVAIL;
  }
  auto used = [&](uint16_t p) {
    for (auto &[h, o] : ids_) {
      if (o.get() != id && o->src_port == p && o->st != St::idle && !o->child && o->ps == id->ps &&
          (o->src_ip == 0 || ip == 0 || o->src_ip == ip))
        return true;
    }
    return false;
  };
  if (port == 0) {
    static thread_local std::minstd_rand rng(std::random_device{}());
    for (int i = 0; i < 1000 && port == 0; i++) {
      uint16_t p = static_cast<uint16_t>(32768 + rng() % 28000);
      if (!used(p)) port = p;
    }
    if (port == 0) return EADDRINUSE;
  } else if (used(port)) {
    return EADDRINUSE;
  }
  id->src_ip = ip;
  id->src_port = port;
  id->dev = d;
  id->st = St::bound;
  return 0;
}

Msg Cm::base_msg(Id *id, Attr a) {
  Msg m;
  m.attr = a;
  m.tid = id->tid;
  m.local_comm = id->local_comm;
  m.remote_comm = id->remote_comm;
  if (a == Attr::dreq) m.qpn = id->remote_qpn;
  return m;
}

void Cm::send_to(const Device &d, uint32_t dst_ip, const Msg &m) {
  uint8_t mad[kMadLen];
  encode(m, mad);
  net_.send(d, dst_ip, mad);
  net_.count(d, Counter::cm_sent);
}

void Cm::send(Id *id, const Msg &m, bool remember) {
  if (!id->dev) return;
  uint8_t mad[kMadLen];
  encode(m, mad);
  if (remember) {
    std::memcpy(id->last, mad, kMadLen);
    id->has_last = true;
  }
  net_.send(*id->dev, id->dst_ip, mad);
  net_.count(*id->dev, Counter::cm_sent);
}

void Cm::arm(Id *id, uint8_t timeout_code) {
  id->timeout_code = timeout_code;
  id->deadline = net_.now_ns() + timeout_ns(timeout_code);
  net_.timers_changed();
}

void Cm::drop(const Device &d) { net_.count(d, Counter::cm_dropped); }

// ---- commands ----

ssize_t Cm::write(File *f, const void *buf, size_t len, const std::function<File *(int)> &by_fd) {
  rdma_ucm_cmd_hdr h;
  if (len < sizeof h) return -EINVAL;
  if (!guard::copy(&h, buf, sizeof h)) return -EFAULT;
  if (h.cmd > RDMA_USER_CM_CMD_JOIN_MCAST) return -EINVAL;   // the kernel's answers
  if (h.in + sizeof h > len) return -EINVAL;
  uint8_t in[sizeof(rdma_ucm_resolve_addr) + 64] = {};
  const size_t in_len = std::min<size_t>(h.in, sizeof in);
  if (!guard::copy(in, static_cast<const uint8_t *>(buf) + sizeof h, in_len)) return -EFAULT;
  std::unique_lock lk(mu_);
  ssize_t r = dispatch(f, h, in, in_len, by_fd, lk);
  return r < 0 ? r : static_cast<ssize_t>(len);
}

namespace {
template <class T>
bool put_resp(uint64_t ptr, const T &v, size_t out) {
  return guard::copy(reinterpret_cast<void *>(static_cast<uintptr_t>(ptr)), &v, std::min(out, sizeof v));
}
}  // namespace

ssize_t Cm::dispatch(File *f, const rdma_ucm_cmd_hdr &h, const uint8_t *in, size_t,
                     const std::function<File *(int)> &by_fd, std::unique_lock<std::mutex> &lk) {
  switch (h.cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID: {
      rdma_ucm_create_id c;
      std::memcpy(&c, in, sizeof c);
      if (h.out < sizeof(rdma_ucm_create_id_resp)) return -ENOSPC;
      // RC over RDMA_PS_TCP, UD over RDMA_PS_UDP. RDMA_PS_IPOIB (its Q_Key
      // comes from the SA) and AF_IB's RDMA_PS_IB: refused, not faked.
      const bool ud = c.ps == kPsUdp && c.qp_type == IBV_QPT_UD;
      if (!ud && (c.ps != kPsTcp || c.qp_type != IBV_QPT_RC)) return -EOPNOTSUPP;
      Id *id = new_id(f, c.uid);
      if (!id) return -ENOMEM;
      id->ps = c.ps;
      id->ud = ud;
      rdma_ucm_create_id_resp r{id->handle};
      if (!put_resp(c.response, r, h.out)) {
        ids_.erase(id->handle);
        return -EFAULT;
      }
      return 0;
    }
    case RDMA_USER_CM_CMD_DESTROY_ID: {
      rdma_ucm_destroy_id c;
      std::memcpy(&c, in, sizeof c);
      if (h.out < sizeof(rdma_ucm_destroy_id_resp)) return -ENOSPC;
      Id *id = find(c.id, f);
      if (!id) return -ENOENT;
      rdma_ucm_destroy_id_resp r{id->events_reported};
      destroy(id, true);
      return put_resp(c.response, r, h.out) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_BIND_IP:
    case RDMA_USER_CM_CMD_BIND: {
      uint32_t handle;
      const sockaddr *sa;
      if (h.cmd == RDMA_USER_CM_CMD_BIND) {
        auto *c = reinterpret_cast<const rdma_ucm_bind *>(in);
        handle = c->id;
        sa = reinterpret_cast<const sockaddr *>(&c->addr);
      } else {
        auto *c = reinterpret_cast<const rdma_ucm_bind_ip *>(in);
        handle = c->id;
        sa = reinterpret_cast<const sockaddr *>(&c->addr);
      }
      Id *id = find(handle, f);
      if (!id) return -ENOENT;
      if (sa->sa_family != AF_INET) return -EAFNOSUPPORT;   // IPv6, AF_IB: later phases
      if (id->st != St::idle) return -EINVAL;
      sockaddr_in s;
      std::memcpy(&s, sa, sizeof s);
      return -bind(id, ntohl(s.sin_addr.s_addr), ntohs(s.sin_port));
    }
    case RDMA_USER_CM_CMD_RESOLVE_IP:
    case RDMA_USER_CM_CMD_RESOLVE_ADDR: {
      uint32_t handle;
      const sockaddr *src, *dst;
      if (h.cmd == RDMA_USER_CM_CMD_RESOLVE_ADDR) {
        auto *c = reinterpret_cast<const rdma_ucm_resolve_addr *>(in);
        handle = c->id;
        src = reinterpret_cast<const sockaddr *>(&c->src_addr);
        dst = reinterpret_cast<const sockaddr *>(&c->dst_addr);
      } else {
        auto *c = reinterpret_cast<const rdma_ucm_resolve_ip *>(in);
        handle = c->id;
        src = reinterpret_cast<const sockaddr *>(&c->src_addr);
        dst = reinterpret_cast<const sockaddr *>(&c->dst_addr);
      }
      Id *id = find(handle, f);
      if (!id) return -ENOENT;
      if (dst->sa_family != AF_INET || (src->sa_family != AF_INET && src->sa_family != AF_UNSPEC))
        return -EAFNOSUPPORT;
      if (id->st != St::idle && id->st != St::bound && id->st != St::addr_resolved) return -EINVAL;
      sockaddr_in d, s{};
      std::memcpy(&d, dst, sizeof d);
      if (src->sa_family == AF_INET) std::memcpy(&s, src, sizeof s);
      const uint32_t dip = ntohl(d.sin_addr.s_addr);
      if (id->st == St::idle) {
        uint32_t sip = ntohl(s.sin_addr.s_addr);
        if (sip == 0) sip = net_.route(dip);
        if (int e = bind(id, 0, ntohs(s.sin_port))) return -e;
        id->src_ip = sip;
        id->dev = sip ? device_for_ip(sip) : nullptr;
      } else if (!id->dev) {
        id->src_ip = net_.route(dip);
        id->dev = id->src_ip ? device_for_ip(id->src_ip) : nullptr;
      }
      id->dst_ip = dip;
      id->dst_port = ntohs(d.sin_port);
      if (!id->dev) {
        queue(id, kAddrError, -EADDRNOTAVAIL);   // no usrc device reaches it
        return 0;
      }
      id->st = St::addr_resolved;
      queue(id, kAddrResolved, 0);
      return 0;
    }
    case RDMA_USER_CM_CMD_RESOLVE_ROUTE: {
      auto *c = reinterpret_cast<const rdma_ucm_resolve_route *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (id->st != St::addr_resolved && id->st != St::route_resolved) return -EINVAL;
      // On InfiniBand with a subnet administrator, the path is the SA's
      // (its DLID); asked without the lock (an SA that does not answer
      // takes its retries), so the id is looked up again.
      if (id->dev && id->dev->link_layer == LinkLayer::ib && id->dev->sa_ip) {
        const Device dev = *id->dev;
        const uint32_t dst = id->dst_ip, handle = c->id;
        uint16_t dlid = 0;
        lk.unlock();
        const int e = net_.path(dev, dst, &dlid);
        lk.lock();
        if (!(id = find(handle, f))) return -ENOENT;
        if (e) {
          queue(id, kRouteError, -e);
          return 0;
        }
        id->dlid = dlid;
      }
      id->st = St::route_resolved;
      queue(id, kRouteResolved, 0);
      return 0;
    }
    case RDMA_USER_CM_CMD_QUERY_ROUTE:
    case RDMA_USER_CM_CMD_QUERY: {
      auto *c = reinterpret_cast<const rdma_ucm_query *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      const uint32_t option = h.cmd == RDMA_USER_CM_CMD_QUERY_ROUTE ? UINT32_MAX : c->option;
      const sockaddr_in src = sin_of(id->src_ip, id->src_port), dst = sin_of(id->dst_ip, id->dst_port);
      uint8_t sgid[16] = {}, dgid[16] = {};
      if (id->dev) mapped_gid(id->dev->ipv4, sgid);
      if (id->dst_ip) mapped_gid(id->dst_ip, dgid);
      if (option == UINT32_MAX) {
        if (h.out < sizeof(rdma_ucm_query_route_resp)) return -ENOSPC;
        rdma_ucm_query_route_resp r{};
        if (id->dev) {
          r.node_guid = htobe64(id->dev->guid);
          r.port_num = 1;
          std::memcpy(r.ib_route[0].sgid, sgid, 16);
          std::memcpy(r.ib_route[0].dgid, dgid, 16);
          r.ib_route[0].pkey = htons(0xffff);
          if (id->st != St::bound && id->st != St::addr_resolved && id->st != St::listen &&
              id->dst_ip) {
            r.num_paths = 1;
            r.ib_route[0].mtu = id->mtu;
            r.ib_route[0].hop_limit = 64;
            r.ib_route[0].numb_path = 1;
            r.ib_route[0].mtu_selector = 2;
            r.ib_route[0].rate_selector = 2;
            r.ib_route[0].packet_life_time_selector = 2;
            if (id->dev->link_layer == LinkLayer::ib) {
              r.ib_route[0].slid = htons(id->dev->lid);
              r.ib_route[0].dlid = htons(peer_lid(id));
            }
          }
        }
        r.ibdev_index = UINT32_MAX;   // match by GUID alone
        std::memcpy(&r.src_addr, &src, sizeof src);
        std::memcpy(&r.dst_addr, &dst, sizeof dst);
        return put_resp(c->response, r, h.out) ? 0 : -EFAULT;
      }
      if (option == RDMA_USER_CM_QUERY_ADDR || option == RDMA_USER_CM_QUERY_GID) {
        if (h.out < sizeof(rdma_ucm_query_addr_resp)) return -ENOSPC;
        rdma_ucm_query_addr_resp r{};
        if (id->dev) {
          r.node_guid = htobe64(id->dev->guid);
          r.port_num = 1;
        }
        r.pkey = htons(0xffff);
        r.ibdev_index = UINT32_MAX;
        if (option == RDMA_USER_CM_QUERY_ADDR) {
          r.src_size = sizeof src;
          r.dst_size = sizeof dst;
          std::memcpy(&r.src_addr, &src, sizeof src);
          std::memcpy(&r.dst_addr, &dst, sizeof dst);
        } else {
          // struct sockaddr_ib: family, pkey, flowinfo, then the 16-byte GID.
          constexpr size_t kGidOff = 8;
          r.src_size = r.dst_size = 48;
          reinterpret_cast<sockaddr *>(&r.src_addr)->sa_family = AF_IB;
          reinterpret_cast<sockaddr *>(&r.dst_addr)->sa_family = AF_IB;
          std::memcpy(reinterpret_cast<uint8_t *>(&r.src_addr) + kGidOff, sgid, 16);
          std::memcpy(reinterpret_cast<uint8_t *>(&r.dst_addr) + kGidOff, dgid, 16);
        }
        return put_resp(c->response, r, h.out) ? 0 : -EFAULT;
      }
      if (option == RDMA_USER_CM_QUERY_PATH) {
        rdma_ucm_query_path_resp r{};   // no SA: no path records (AF_IB is a later phase)
        return put_resp(c->response, r, h.out) ? 0 : -EFAULT;
      }
      return -ENOSYS;
    }
    case RDMA_USER_CM_CMD_CONNECT: {
      rdma_ucm_connect c{};
      std::memcpy(&c, in, std::min<size_t>(h.in, sizeof c));
      Id *id = find(c.id, f);
      if (!id) return -ENOENT;
      if (id->st != St::route_resolved || !id->dev) return -EINVAL;
      if (c.conn_param.private_data_len > (id->ud ? kMaxSidrPrivate : kMaxPrivate)) return -EINVAL;
      static thread_local std::minstd_rand rng(std::random_device{}());
      id->local_comm = new_comm();
      by_comm_[id->local_comm] = id;
      if (id->ud) {   // IBA 12.11: a SIDR REQ asks the service for its QPN and Q_Key
        id->tid = ++next_tid_ << 32 | id->local_comm;
        Msg m = base_msg(id, Attr::sidr_req);
        m.service_id = service_id(id->ps, id->dst_port);
        put_ip_hdr({id->dev->ipv4, id->dst_ip, id->src_port}, m.priv);
        std::memcpy(m.priv + kIpHdrLen, c.conn_param.private_data, c.conn_param.private_data_len);
        m.priv_len = static_cast<uint8_t>(kIpHdrLen + c.conn_param.private_data_len);
        id->st = St::req_sent;
        id->retries_left = kCmRetries;
        send(id, m, true);
        arm(id, kCmTimeout);
        return 0;
      }
      id->local_qpn = c.conn_param.qp_num & 0xffffff;
      // A REQ's or REP's starting PSN is the one its sender's receive queue
      // expects, the other side's send PSN (IBA ch. 12's REQ and REP; the
      // kernel's ib_cm: rq_psn from what it sends, sq_psn from what it
      // receives).
      id->rq_psn = rng() & 0xffffff;
      id->responder_resources = c.conn_param.responder_resources;
      id->initiator_depth = c.conn_param.initiator_depth;
      id->retry_count = std::min<uint8_t>(c.conn_param.retry_count, 7);
      id->rnr_retry_count = std::min<uint8_t>(c.conn_param.rnr_retry_count, 7);
      id->srq = c.conn_param.srq;
      id->mtu = id->dev->mtu;
      id->tid = ++next_tid_ << 32 | id->local_comm;
      Msg m = base_msg(id, Attr::req);
      m.service_id = kServiceIdTcp | id->dst_port;
      m.ca_guid = id->dev->guid;
      m.qpn = id->local_qpn;
      m.psn = id->rq_psn;
      m.responder_resources = id->responder_resources;
      m.initiator_depth = id->initiator_depth;
      m.remote_cm_timeout = m.local_cm_timeout = kCmTimeout;
      m.max_cm_retries = kCmRetries;
      m.retry_count = id->retry_count;
      m.rnr_retry_count = id->rnr_retry_count;
      m.srq = id->srq;
      m.flow_control = c.conn_param.flow_control;
      m.mtu = id->mtu;
      if (id->dev->link_layer == LinkLayer::ib) {
        m.local_lid = id->dev->lid;
        m.remote_lid = peer_lid(id);
      }
      mapped_gid(id->dev->ipv4, m.local_gid);
      mapped_gid(id->dst_ip, m.remote_gid);
      m.hop_limit = 64;
      m.local_ack_timeout = id->ack_timeout;
      put_ip_hdr({id->dev->ipv4, id->dst_ip, id->src_port}, m.priv);
      std::memcpy(m.priv + kIpHdrLen, c.conn_param.private_data, c.conn_param.private_data_len);
      m.priv_len = static_cast<uint8_t>(kIpHdrLen + c.conn_param.private_data_len);
      id->st = St::req_sent;
      id->retries_left = kCmRetries;
      send(id, m, true);
      arm(id, kCmTimeout);
      return 0;
    }
    case RDMA_USER_CM_CMD_LISTEN: {
      auto *c = reinterpret_cast<const rdma_ucm_listen *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (id->st == St::listen) return 0;
      if (id->st == St::idle) {
        if (int e = bind(id, 0, 0)) return -e;
      }
      if (id->st != St::bound) return -EINVAL;
      const uint64_t sid = service_id(id->ps, id->src_port);
      if (listeners_.count(sid)) return -EADDRINUSE;
      if (int e = net_.claim_service(sid)) return -e;
      listeners_[sid] = id;
      id->st = St::listen;
      return 0;
    }
    case RDMA_USER_CM_CMD_ACCEPT: {
      rdma_ucm_accept c{};
      std::memcpy(&c, in, std::min<size_t>(h.in, sizeof c));
      Id *id = find(c.id, f);
      if (!id) return -ENOENT;
      if (id->st == St::rep_rcvd) {   // the active side, its QP at RTS: the RTU
        Msg m = base_msg(id, Attr::rtu);
        send(id, m, false);
        id->st = St::established;
        id->deadline = UINT64_MAX;
        return 0;
      }
      if (id->st != St::req_rcvd) return -EINVAL;
      if (!c.conn_param.valid) return -EINVAL;
      if (id->ud) {   // the SIDR REP: our QPN and Q_Key
        if (c.conn_param.private_data_len > kSidrRepPrivate) return -EINVAL;
        id->uid = c.uid;
        id->listener = UINT32_MAX;
        id->local_qpn = c.conn_param.qp_num & 0xffffff;
        id->qkey = kUdpQkey;
        Msg m = base_msg(id, Attr::sidr_rep);
        m.sidr_status = kSidrValid;
        m.qpn = id->local_qpn;
        m.qkey = id->qkey;
        m.service_id = service_id(id->ps, id->src_port);
        std::memcpy(m.priv, c.conn_param.private_data, c.conn_param.private_data_len);
        m.priv_len = c.conn_param.private_data_len;
        id->st = St::established;
        send(id, m, true);   // kept: a repeated SIDR REQ gets it again
        return 0;
      }
      if (c.conn_param.private_data_len > kRepPrivate) return -EINVAL;
      id->uid = c.uid;
      id->listener = UINT32_MAX;
      id->local_qpn = c.conn_param.qp_num & 0xffffff;
      id->responder_resources = c.conn_param.responder_resources;
      id->initiator_depth = c.conn_param.initiator_depth;
      id->rnr_retry_count = std::min<uint8_t>(c.conn_param.rnr_retry_count, 7);
      id->srq = c.conn_param.srq;
      Msg m = base_msg(id, Attr::rep);
      m.qpn = id->local_qpn;
      m.psn = id->rq_psn;
      m.responder_resources = id->responder_resources;
      m.initiator_depth = id->initiator_depth;
      m.rnr_retry_count = id->rnr_retry_count;
      m.srq = id->srq;
      m.flow_control = c.conn_param.flow_control;
      m.ca_guid = id->dev->guid;
      std::memcpy(m.priv, c.conn_param.private_data, c.conn_param.private_data_len);
      m.priv_len = c.conn_param.private_data_len;
      id->st = St::rep_sent;
      id->retries_left = kCmRetries;
      send(id, m, true);
      arm(id, id->timeout_code);
      return 0;
    }
    case RDMA_USER_CM_CMD_REJECT: {
      auto *c = reinterpret_cast<const rdma_ucm_reject *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (id->st != St::req_rcvd && id->st != St::rep_rcvd) return -EINVAL;
      if (c->private_data_len > (id->ud ? kSidrRepPrivate : kRejPrivate)) return -EINVAL;
      if (id->ud) {
        if (id->st != St::req_rcvd) return -EINVAL;
        Msg m = base_msg(id, Attr::sidr_rep);
        m.sidr_status = kSidrRejected;
        m.service_id = service_id(id->ps, id->src_port);
        std::memcpy(m.priv, c->private_data, c->private_data_len);
        m.priv_len = c->private_data_len;
        id->st = St::closed;
        send(id, m, true);
        return 0;
      }
      Msg m = base_msg(id, Attr::rej);
      m.rejected = id->st == St::req_rcvd ? 0 : 1;
      m.reason = c->reason ? uint16_t{c->reason} : uint16_t{kRejConsumer};
      std::memcpy(m.priv, c->private_data, c->private_data_len);
      m.priv_len = c->private_data_len;
      send(id, m, false);
      id->st = St::closed;
      id->deadline = UINT64_MAX;
      return 0;
    }
    case RDMA_USER_CM_CMD_DISCONNECT: {
      auto *c = reinterpret_cast<const rdma_ucm_disconnect *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (id->ud) return 0;   // no connection to end (the kernel's DREQ fails quietly)
      switch (id->st) {
        case St::established: case St::rep_sent: case St::rep_rcvd: {
          id->st = St::dreq_sent;
          id->retries_left = kCmRetries;
          send(id, base_msg(id, Attr::dreq), true);
          arm(id, kCmTimeout);
          return 0;
        }
        case St::dreq_rcvd:
          send(id, base_msg(id, Attr::drep), false);
          timewait(id);
          return 0;
        case St::dreq_sent: case St::timewait: case St::closed:
          return 0;
        default:
          return -EINVAL;
      }
    }
    case RDMA_USER_CM_CMD_INIT_QP_ATTR: {
      auto *c = reinterpret_cast<const rdma_ucm_init_qp_attr *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (h.out < sizeof(ib_uverbs_qp_attr)) return -ENOSPC;
      ib_uverbs_qp_attr r{};
      if (int e = init_qp_attr(id, c->qp_state, &r, sizeof r)) return -e;
      return put_resp(c->response, r, h.out) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_GET_EVENT: {
      auto *c = reinterpret_cast<const rdma_ucm_get_event *>(in);
      if (h.out < sizeof(rdma_ucm_event_resp)) return -ENOSPC;
      while (f->events.empty()) {
        if (f->nonblocking) return -EAGAIN;
        f->cv.wait(lk);
      }
      rdma_ucm_event_resp e = f->events.front();
      if (!put_resp(c->response, e, h.out)) return -EFAULT;
      f->events.pop_front();
      drained(f);
      // A connection request is the listener's event (its uid, the new id's
      // handle): the kernel counts it there, and librdmacm acks it there.
      auto it = ids_.find(e.id);
      if (it != ids_.end() && e.event == kConnectRequest) it = ids_.find(it->second->listener);
      if (it != ids_.end()) it->second->events_reported++;
      return 0;
    }
    case RDMA_USER_CM_CMD_SET_OPTION: {
      auto *c = reinterpret_cast<const rdma_ucm_set_option *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      if (c->level == RDMA_OPTION_ID) {
        switch (c->optname) {
          case RDMA_OPTION_ID_TOS:
          case RDMA_OPTION_ID_REUSEADDR:
          case RDMA_OPTION_ID_AFONLY:
            return 0;
          case RDMA_OPTION_ID_ACK_TIMEOUT: {
            uint8_t v;
            if (c->optlen != 1) return -EINVAL;
            if (!guard::copy(&v, reinterpret_cast<const void *>(static_cast<uintptr_t>(c->optval)), 1))
              return -EFAULT;
            id->ack_timeout = std::min<uint8_t>(v, 31);
            return 0;
          }
        }
      }
      return -ENOSYS;   // RDMA_OPTION_IB_PATH needs the SA: a later phase
    }
    case RDMA_USER_CM_CMD_NOTIFY: {
      auto *c = reinterpret_cast<const rdma_ucm_notify *>(in);
      Id *id = find(c->id, f);
      if (!id) return -ENOENT;
      // IBV_EVENT_COMM_EST: data arrived before the RTU (IBA 12.9.7.3).
      if (c->event == IBV_EVENT_COMM_EST && id->st == St::rep_sent) {
        id->st = St::established;
        id->deadline = UINT64_MAX;
        queue(id, kEstablished, 0);
      }
      return 0;
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
      auto *c = reinterpret_cast<const rdma_ucm_migrate_id *>(in);
      if (h.out < sizeof(rdma_ucm_migrate_resp)) return -ENOSPC;
      File *old = by_fd ? by_fd(static_cast<int>(c->fd)) : nullptr;
      if (!old) return -ENOENT;
      Id *id = find(c->id, old);
      if (!id) return -ENOENT;
      if (old != f) {
        // Its events move along, in order.
        auto &q = old->events;
        for (auto it = q.begin(); it != q.end();) {
          if (it->id == id->handle) {
            push(f, *it);
            it = q.erase(it);
          } else {
            ++it;
          }
        }
        drained(old);
        id->file = f;
      }
      rdma_ucm_migrate_resp r{id->events_reported};
      return put_resp(c->response, r, h.out) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST:
    case RDMA_USER_CM_CMD_LEAVE_MCAST:
      return -ENOSYS;   // multicast: a later phase
    default:
      return -ENOSYS;   // GET_OPTION: no handler in the kernel either
  }
}

// IBA 12.9.7 / the kernel's cm_init_qp_*_attr: the attributes the CM
// knows for each transition; before any connection, INIT only.
int Cm::init_qp_attr(Id *id, uint32_t state, void *out, size_t) {
  auto &r = *static_cast<ib_uverbs_qp_attr *>(out);
  r = {};
  r.qp_state = state;
  const bool connected = id->st == St::req_sent || id->st == St::rep_rcvd || id->st == St::req_rcvd ||
                         id->st == St::rep_sent || id->st == St::established;
  if (id->ud) {
    // The kernel's cma_ib_init_qp_attr: INIT gets the port, P_Key index and
    // the port space's Q_Key; RTR and RTS nothing beyond the state.
    if (!id->dev) return EINVAL;
    switch (state) {
      case IBV_QPS_INIT:
        r.qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        r.port_num = 1;
        r.qkey = id->qkey ? id->qkey : kUdpQkey;
        return 0;
      case IBV_QPS_RTR:
        r.qp_attr_mask = IBV_QP_STATE;
        return 0;
      case IBV_QPS_RTS:
        r.qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        return 0;
      default:
        return EINVAL;
    }
  }
  switch (state) {
    case IBV_QPS_INIT:
      r.qp_attr_mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      r.pkey_index = 0;
      r.port_num = 1;
      if (connected) {
        r.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        if (id->responder_resources)
          r.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      }
      return 0;
    case IBV_QPS_RTR: {
      if (!connected || id->st == St::req_sent || !id->dev) return EINVAL;
      r.qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      r.path_mtu = id->mtu;
      r.dest_qp_num = id->remote_qpn;
      r.rq_psn = id->rq_psn;
      r.max_dest_rd_atomic = id->responder_resources;
      r.min_rnr_timer = kMinRnrTimer;
      peer_ah(id, r.ah_attr);
      return 0;
    }
    case IBV_QPS_RTS:
      if (!connected || id->st == St::req_sent) return EINVAL;
      r.qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      r.sq_psn = id->sq_psn;
      r.timeout = id->ack_timeout;
      r.retry_cnt = id->retry_count;
      r.rnr_retry = id->rnr_retry_count;
      r.max_rd_atomic = id->initiator_depth;
      return 0;
    default:
      return EINVAL;
  }
}

// ---- MADs ----

void Cm::on_mad(const Device &dev, uint32_t src_ip, const uint8_t *mad, size_t len) {
  std::lock_guard g(mu_);
  net_.count(dev, Counter::cm_rcvd);
  Msg m;
  if (decode(mad, len, m) != MadError::ok) return drop(dev);
  if (m.attr == Attr::req) return on_req(dev, src_ip, m);
  if (m.attr == Attr::sidr_req) return on_sidr_req(dev, src_ip, m);
  auto it = by_comm_.find(m.remote_comm);
  Id *id = it == by_comm_.end() ? nullptr : it->second;
  if (id && id->dst_ip != src_ip) id = nullptr;   // not from its peer
  if (id && m.attr != Attr::rep && m.attr != Attr::rej && m.attr != Attr::sidr_rep &&
      id->remote_comm != m.local_comm)
    id = nullptr;
  if (id && id->ud != (m.attr == Attr::sidr_rep)) id = nullptr;
  if (!id) {
    // IBA 12.9.8.4: a DREQ for no connection is still answered.
    if (m.attr == Attr::dreq) {
      Msg r;
      r.attr = Attr::drep;
      r.tid = m.tid;
      r.local_comm = m.remote_comm;
      r.remote_comm = m.local_comm;
      send_to(dev, src_ip, r);
    }
    return drop(dev);
  }
  switch (m.attr) {
    case Attr::sidr_rep: return on_sidr_rep(id, m);
    case Attr::rep: return on_rep(id, m);
    case Attr::rej: return on_rej(id, m);
    case Attr::mra:
      // The peer needs longer (IBA 12.6.6): wait its service timeout, afresh.
      if (id->st != St::req_sent && id->st != St::rep_sent) return drop(dev);
      id->retries_left = kCmRetries;
      arm(id, std::max<uint8_t>(m.service_timeout, id->timeout_code));
      return;
    case Attr::rtu:
      if (id->st != St::rep_sent) return;   // a duplicate
      id->st = St::established;
      id->deadline = UINT64_MAX;
      queue(id, kEstablished, 0, m.priv, m.priv_len);
      return;
    case Attr::dreq:
      switch (id->st) {
        case St::established: case St::rep_sent: case St::rep_rcvd:
          id->st = St::dreq_rcvd;
          id->deadline = UINT64_MAX;
          queue(id, kDisconnected, 0, m.priv, m.priv_len);
          return;
        case St::dreq_sent:   // both ends at once: answer, and it is over
          send(id, base_msg(id, Attr::drep), false);
          timewait(id);
          queue(id, kDisconnected, 0, m.priv, m.priv_len);
          return;
        case St::timewait: case St::closed:   // our DREP was lost
          send(id, base_msg(id, Attr::drep), false);
          return;
        default:
          return drop(dev);
      }
    case Attr::drep:
      if (id->st != St::dreq_sent) return;   // a duplicate
      timewait(id);
      queue(id, kDisconnected, 0, m.priv, m.priv_len);
      return;
    default:
      return drop(dev);
  }
}

// The passive side of a REQ or SIDR REQ (m) from src_ip:src_port: a new
// id of the service's listener, its addresses and the request's IDs filled
// in (and the listener's uid, which its event carries), or nullptr, the
// request refused (refuse called with why) or left for later (a first
// request for a service nobody listens on, not answered yet: first_unheard).
Id *Cm::child(const Device &dev, uint32_t src_ip, const Msg &m, uint16_t src_port,
              uint64_t *listener_uid, const std::function<void(Refusal)> &refuse) {
  auto lit = listeners_.find(m.service_id);
  if (lit == listeners_.end() || (lit->second->src_ip && lit->second->src_ip != dev.ipv4)) {
    if (!first_unheard(src_ip, m.local_comm)) refuse(Refusal::no_service);
    return nullptr;
  }
  Id *l = lit->second;
  const Device *d = device_for_ip(dev.ipv4);
  Id *id = d ? new_id(l->file, 0) : nullptr;
  if (!id) {
    refuse(d ? Refusal::no_qp : Refusal::no_service);
    return nullptr;
  }
  id->ps = l->ps;
  id->child = true;
  id->dev = d;
  id->listener = l->handle;
  id->src_ip = dev.ipv4;
  id->src_port = l->src_port;
  id->dst_ip = src_ip;
  id->dst_port = src_port;
  id->remote_comm = m.local_comm;
  id->tid = m.tid;
  id->st = St::req_rcvd;
  by_remote_[{src_ip, m.local_comm}] = id;
  *listener_uid = l->uid;
  return id;
}

void Cm::on_req(const Device &dev, uint32_t src_ip, const Msg &m) {
  // A duplicate: the REQ was resent before our answer arrived.
  if (auto it = by_remote_.find({src_ip, m.local_comm}); it != by_remote_.end()) {
    Id *id = it->second;
    if (id->st == St::req_rcvd) {
      Msg r = base_msg(id, Attr::mra);
      r.rejected = 0;
      r.service_timeout = 20;   // about 4 s more
      send(id, r, false);
    } else if (id->st == St::rep_sent && id->has_last) {
      net_.send(dev, src_ip, id->last);
      net_.count(dev, Counter::cm_sent);
    }
    return;
  }
  auto reject = [&](uint16_t reason) {
    Msg r;
    r.attr = Attr::rej;
    r.tid = m.tid;
    r.remote_comm = m.local_comm;
    r.rejected = 0;
    r.reason = reason;
    send_to(dev, src_ip, r);
  };
  IpHdr ip;
  if ((m.service_id & ~0xffffull) != kServiceIdTcp || !get_ip_hdr(m.priv, ip)) {
    drop(dev);
    return reject(kRejInvalidServiceId);
  }
  uint64_t uid;
  Id *id = child(dev, src_ip, m, ip.src_port, &uid, [&](Refusal why) {
    reject(why == Refusal::no_qp ? kRejNoQp : kRejInvalidServiceId);
  });
  if (!id) return;
  if (id->dev->link_layer == LinkLayer::ib) id->dlid = m.local_lid;   // (the sender's, as its SA or scheme gave it)
  id->local_comm = new_comm();
  id->remote_qpn = m.qpn;
  id->sq_psn = m.psn;   // (the REQ's: what its sender's receive queue expects)
  // Chosen now: librdmacm moves the QP to RTR and RTS (INIT_QP_ATTR) before ACCEPT.
  static thread_local std::minstd_rand rng(std::random_device{}());
  id->rq_psn = rng() & 0xffffff;
  // The request's view turned to ours (the kernel's cm_format_req_event).
  id->responder_resources = m.initiator_depth;
  id->initiator_depth = m.responder_resources;
  id->retry_count = m.retry_count;
  id->rnr_retry_count = m.rnr_retry_count;
  id->srq = m.srq;
  id->mtu = std::min(m.mtu ? m.mtu : uint8_t{1}, id->dev->mtu);
  id->timeout_code = m.local_cm_timeout ? m.local_cm_timeout : kCmTimeout;
  by_comm_[id->local_comm] = id;
  queue(id, kConnectRequest, 0, m.priv + kIpHdrLen, kReqPrivate - kIpHdrLen, uid);
}

// A request for a service nobody listens on is refused when it comes again
// (its first resend, about a second later), not at once: a server that
// makes a new listener right after telling its client to connect (perftest
// -R does, between two handshakes) is then not refused by the race.
bool Cm::first_unheard(uint32_t src_ip, uint32_t comm) {
  const uint64_t now = net_.now_ns();
  constexpr uint64_t kForget = 30'000'000'000ull;
  for (auto it = unheard_.begin(); it != unheard_.end();)
    it = now - it->second > kForget ? unheard_.erase(it) : std::next(it);
  if (unheard_.size() > 4096) unheard_.clear();   // a flood: refuse at once
  return unheard_.emplace(std::make_pair(src_ip, comm), now).second;
}

// A connection's end (DREP sent or received, or the DREQ unanswered):
// stray MADs of it are still answered until the timewait is over.
void Cm::timewait(Id *id) {
  id->st = St::timewait;
  id->retries_left = 0;
  id->deadline = net_.now_ns() + timeout_ns(kTimewait);
  net_.timers_changed();
}

uint32_t Cm::new_comm() {
  const uint32_t mask = (1u << kCommSlotShift) - 1;
  uint32_t n = ++next_comm_ & mask;
  if (n == 0) n = ++next_comm_ & mask;   // 0 names no connection
  return net_.slot() << kCommSlotShift | n;
}

// IBA 12.11.1: a SIDR REQ for a UD service. The listener learns of it as
// a connection request (no QPN, no address vector: the kernel gives
// none); rdma_accept answers with a SIDR REP.
void Cm::on_sidr_req(const Device &dev, uint32_t src_ip, const Msg &m) {
  if (auto it = by_remote_.find({src_ip, m.local_comm}); it != by_remote_.end()) {
    Id *id = it->second;   // a repeat: answer again once answered
    if (id->ud && id->has_last && id->st != St::req_rcvd) {
      net_.send(dev, src_ip, id->last);
      net_.count(dev, Counter::cm_sent);
    }
    return;
  }
  auto answer = [&](uint8_t status) {
    Msg r;
    r.attr = Attr::sidr_rep;
    r.tid = m.tid;
    r.remote_comm = m.local_comm;
    r.sidr_status = status;
    r.service_id = m.service_id;
    send_to(dev, src_ip, r);
  };
  IpHdr ip;
  if ((m.service_id & ~0xffffull) != service_id(kPsUdp, 0) || !get_ip_hdr(m.priv, ip)) {
    drop(dev);
    return answer(kSidrNoService);
  }
  uint64_t uid;
  Id *id = child(dev, src_ip, m, ip.src_port, &uid, [&](Refusal why) {
    answer(why == Refusal::no_qp ? kSidrNoQp : kSidrNoService);
  });
  if (!id) return;
  id->ud = true;
  id->mtu = id->dev->mtu;
  queue(id, kConnectRequest, 0, m.priv + kIpHdrLen, kSidrReqPrivate - kIpHdrLen, uid);
}

// IBA 12.11.2: the answer. Valid: ESTABLISHED with the service's QPN, Q_Key
// and an address vector to it; otherwise UNREACHABLE with the status (the
// kernel's cma_sidr_rep_handler).
void Cm::on_sidr_rep(Id *id, const Msg &m) {
  if (id->st != St::req_sent) return;   // a repeat
  id->deadline = UINT64_MAX;
  if (m.sidr_status != kSidrValid) {
    id->st = St::closed;
    queue(id, kUnreachable, m.sidr_status, m.priv, kSidrRepPrivate);
    return;
  }
  id->st = St::established;
  id->remote_qpn = m.qpn;
  id->qkey = m.qkey;
  rdma_ucm_event_resp e{};
  e.uid = id->uid;
  e.id = id->handle;
  e.event = kEstablished;
  auto &u = e.param.ud;
  u.qp_num = m.qpn;
  u.qkey = m.qkey;
  peer_ah(id, u.ah_attr);
  const size_t n = std::min<size_t>(kSidrRepPrivate, sizeof u.private_data);
  std::memcpy(u.private_data, m.priv, n);
  u.private_data_len = static_cast<uint8_t>(n);
  push(id->file, e);
}

void Cm::on_rep(Id *id, const Msg &m) {
  if (id->st == St::established && id->remote_comm == m.local_comm) {
    send(id, base_msg(id, Attr::rtu), false);   // our RTU was lost
    return;
  }
  if (id->st != St::req_sent) return;   // a duplicate
  id->remote_comm = m.local_comm;
  id->remote_qpn = m.qpn;
  id->sq_psn = m.psn;   // (the REP's: what its sender's receive queue expects)
  id->rnr_retry_count = m.rnr_retry_count;
  // What the passive side gives us bounds what we use (IBA 12.7.26, .30).
  id->initiator_depth = std::min(id->initiator_depth, m.responder_resources);
  id->responder_resources = std::min(id->responder_resources, m.initiator_depth);
  id->st = St::rep_rcvd;
  id->deadline = UINT64_MAX;
  by_remote_[{id->dst_ip, id->remote_comm}] = id;
  queue(id, kConnectResponse, 0, m.priv, m.priv_len);
}

void Cm::on_rej(Id *id, const Msg &m) {
  if (id->st != St::req_sent && id->st != St::rep_sent && id->st != St::rep_rcvd) return;
  // A REQ refused at once for want of a listener (a kernel CM does; usrc
  // waits for the REQ's resend, child()) is resent once first, as its
  // timer has it: perftest -R's server makes its listener just after its
  // first connection's exchange tells the client to connect again.
  if (id->st == St::req_sent && m.reason == kRejInvalidServiceId && id->retries_left == kCmRetries) return;
  id->st = St::closed;
  id->deadline = UINT64_MAX;
  queue(id, kRejected, m.reason, m.priv, m.priv_len);
}

void Cm::tick() {
  std::lock_guard g(mu_);
  const uint64_t now = net_.now_ns();
  for (auto &[h, p] : ids_) {
    Id *id = p.get();
    if (id->deadline > now) continue;
    if (id->retries_left > 0 && id->has_last) {
      id->retries_left--;
      net_.send(*id->dev, id->dst_ip, id->last);
      net_.count(*id->dev, Counter::cm_sent);
      id->deadline = now + timeout_ns(id->timeout_code);
      continue;
    }
    id->deadline = UINT64_MAX;
    switch (id->st) {
      case St::req_sent:
      case St::rep_sent:
        // IBA 12.9.8.1: the peer never answered. The kernel reports it
        // as UNREACHABLE, -ETIMEDOUT.
        id->st = St::closed;
        queue(id, kUnreachable, -ETIMEDOUT);
        break;
      case St::dreq_sent:
        timewait(id);
        queue(id, kDisconnected, 0);
        break;
      case St::timewait:   // the kernel reports its end (RDMA_CM_EVENT_TIMEWAIT_EXIT)
        id->st = St::closed;
        queue(id, kTimewaitExit, 0);
        break;
      default:
        break;
    }
  }
}

uint64_t Cm::next_deadline() {
  std::lock_guard g(mu_);
  uint64_t d = UINT64_MAX;
  for (auto &[h, p] : ids_) d = std::min(d, p->deadline);
  return d;
}

}  // namespace usrc::cm
