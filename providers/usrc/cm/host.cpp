// The host-level GSI (docs/cm.md). CM MADs travel as UD datagrams to QP1,
// which maps to UDP port `base` of a device's address; no usrc context
// binds it. The first CM user of a device in this network namespace binds
// it (the GSI owner; every other retries now and then, so one takes over
// when the owner dies) and hands each MAD to the process it is for over an
// AF_UNIX datagram socket of that process: a REQ by its service ID (a
// listener registers the ID as a link to its socket), any other MAD by the
// comm ID it names, whose top bits are the owning process's slot.
//
// Registry: <root>/cm/<netns inode>/ (sticky, writable by all): p<slot> is
// a process's socket (slots taken under a lock file; a socket nobody reads
// is stale and reused), s<service id> a link to the listener's p<slot>.
#include "usrc/cm/host.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "usrc/cm/sa.h"
#include "usrc/common/guard.h"
#include "usrc/net/roce_port.h"
#include "usrc/net/trace.h"
#include "usrc/wire/hdr.h"
#include "usrc/wire/icrc.h"

namespace usrc::cm {

namespace {

constexpr uint32_t kFwdMagic = 0x55434d31;   // "UCM1"
// What the GSI owner puts before a datagram it hands on.
struct FwdHdr {
  uint32_t magic;
  uint32_t dev_ipv4;    // the device it arrived at
  uint32_t src_ip;      // its sender
  uint16_t base_port;
  uint16_t src_port;
};
constexpr uint64_t kElectNs = 250'000'000;   // how often a non-owner tries to take the GSI

uint64_t mono_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string read_line(const std::string &path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

sockaddr_un unix_addr(const std::string &path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  return a;
}

// Same host: the kernel routes it through loopback, and the ICRC is 0
// (as usrc's transport does, docs/design.md).
bool local_ip(uint32_t ip, uint32_t own) { return (ip >> 24) == 127 || ip == own; }

class HostNet final : public Net {
 public:
  int start() {
    const std::string top = root_dir() + "/cm";
    mkdir(top.c_str(), 0700);
    chmod(top.c_str(), 01777);
    dir_ = top + "/" + std::to_string(net_namespace());
    if (mkdir(dir_.c_str(), 0700) == 0) chmod(dir_.c_str(), 01777);
    struct stat st {};
    if (lstat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return errno ? errno : ENOTDIR;
    lock_fd_ = ::open((dir_ + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lock_fd_ < 0) return errno;
    fchmod(lock_fd_, 0666);
    sock_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock_ < 0) return errno;
    flock(lock_fd_, LOCK_EX);
    for (uint32_t n = 1; n < (1u << (32 - kCommSlotShift)) && !slot_; n++) {
      const std::string p = dir_ + "/p" + std::to_string(n);
      sockaddr_un a = unix_addr(p);
      if (::bind(sock_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        slot_ = n;
      } else if (errno == EADDRINUSE && !alive(p)) {
        unlink(p.c_str());
        if (::bind(sock_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) slot_ = n;
      }
    }
    flock(lock_fd_, LOCK_UN);
    if (!slot_) return EAGAIN;
    chmod((dir_ + "/p" + std::to_string(slot_)).c_str(), 0666);
    wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return wake_ < 0 ? errno : 0;
  }

  void set_cm(Cm *cm) { cm_ = cm; }

  std::vector<Device> devices() override {
    std::vector<Device> out;
    const uint64_t ns = net_namespace();
    DIR *d = opendir((sysfs_dir() + "/class/infiniband").c_str());
    if (!d) return out;
    while (dirent *e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      auto c = DeviceConfig::load(e->d_name);
      if (!c || !c->offered_in(ns)) continue;
      Device v;
      v.name = c->name;
      v.guid = c->node_guid;
      v.ipv4 = c->ipv4;
      v.base_port = c->base_port;
      v.roce_port = c->roce_port_in_use();
      v.lid = c->lid;
      v.sa_ip = c->sa_ip;
      v.sa_port = c->sa_port;
      v.link_layer = c->link_layer;
      uint8_t mtu = 1;
      while (mtu < 5 && (256u << mtu) <= c->active_mtu) mtu++;
      v.mtu = mtu;
      char want[40];
      const uint32_t ip = c->ipv4;
      std::snprintf(want, sizeof want, "0000:0000:0000:0000:0000:ffff:%04x:%04x", ip >> 16, ip & 0xffff);
      v.sgid_index = c->link_layer == LinkLayer::ib ? 1 : 0;
      for (uint32_t i = 0; i < c->gid_tbl_len; i++) {
        if (read_line(ibdev_dir(c->name) + "/ports/1/gids/" + std::to_string(i)) == want) {
          v.sgid_index = static_cast<uint8_t>(i);
          break;
        }
      }
      out.push_back(std::move(v));
    }
    closedir(d);
    return out;
  }

  uint32_t slot() override { return slot_; }

  uint32_t route(uint32_t dst_ip) override {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(dst_ip);
    a.sin_port = htons(9);
    socklen_t l = sizeof a;
    uint32_t r = 0;
    if (connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        getsockname(s, reinterpret_cast<sockaddr *>(&a), &l) == 0)
      r = ntohl(a.sin_addr.s_addr);
    ::close(s);
    return r;
  }

  // Called under the Cm's lock (every send is).
  void send(const Device &from, uint32_t dst_ip, const uint8_t mad[kMadLen]) override {
    Sender &s = senders_[from.ipv4];
    if (s.fd < 0) {
      s.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(from.ipv4);
      socklen_t l = sizeof a;
      if (s.fd < 0 || ::bind(s.fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
          getsockname(s.fd, reinterpret_cast<sockaddr *>(&a), &l) != 0) {
        if (s.fd >= 0) ::close(s.fd);
        s.fd = -1;
        return;
      }
      int df = IP_PMTUDISC_DO;   // DF and IP ID 0: what the ICRC assumes (icrc.h)
      setsockopt(s.fd, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df);
      s.port = ntohs(a.sin_port);
    }
    uint8_t pkt[kFrameLen];
    frame(mad, static_cast<uint32_t>(++psn_), pkt);
    uint32_t crc = 0;
    // To another host's QP1 at the RoCE v2 port, as a kernel CM (rxe) has
    // it, from an unconnected socket (IP ID 0, which the ICRC assumes).
    const bool local = local_ip(dst_ip, from.ipv4);
    const uint16_t dport = !local && from.roce_port ? from.roce_port : from.base_port;
    if (!local) {
      wire::Ipv4Pseudo ip{from.ipv4, dst_ip, s.port, dport};
      iovec v{pkt, kFrameLen - 4};
      crc = wire::icrc_ipv4(ip, &v, 1);
    }
    wire::store_icrc(pkt + kFrameLen - 4, crc);
    net::trace_datagram({from.ipv4, s.port}, {dst_ip, dport}, pkt, sizeof pkt);
    if (dst_ip == from.ipv4 && hand_local(from, s.port, pkt, sizeof pkt)) return;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(dst_ip);
    to.sin_port = htons(dport);
    (void)sendto(s.fd, pkt, sizeof pkt, 0, reinterpret_cast<sockaddr *>(&to), sizeof to);
  }

  int claim_service(uint64_t sid) override {
    const std::string link = service_path(sid), mine = "p" + std::to_string(slot_);
    flock(lock_fd_, LOCK_EX);
    int r = 0;
    for (int i = 0; i < 2; i++) {
      if (symlink(mine.c_str(), link.c_str()) == 0) break;
      char b[64];
      ssize_t n = readlink(link.c_str(), b, sizeof b - 1);
      if (n > 0 && std::string(b, n) != mine && alive(dir_ + "/" + std::string(b, n))) {
        r = EADDRINUSE;
        break;
      }
      unlink(link.c_str());   // stale: its process is gone (or it is ours)
    }
    flock(lock_fd_, LOCK_UN);
    return r;
  }

  void release_service(uint64_t sid) override {
    const std::string link = service_path(sid);
    char b[64];
    ssize_t n = readlink(link.c_str(), b, sizeof b - 1);
    if (n > 0 && std::string(b, n) == "p" + std::to_string(slot_)) unlink(link.c_str());
  }

  void count(const Device &d, Counter c) override {
    std::lock_guard g(counters_mu_);
    auto &oc = counters_[d.name];
    if (!oc) {
      oc = std::make_unique<OwnCounters>();
      std::string err;
      if (!oc->open(d.name, &err)) oc_failed_[d.name] = true;
    }
    if (oc_failed_.count(d.name)) return;
    __atomic_fetch_add(&oc->values()[static_cast<uint32_t>(c)], 1, __ATOMIC_RELAXED);
  }

  uint64_t now_ns() override { return mono_ns(); }

  int path(const Device &from, uint32_t dst_ip, uint16_t *dlid) override {
    sa::PathRecord r;
    const int e = sa::path_to({from.sa_ip, from.sa_port}, from.ipv4, from.lid, dst_ip, &r);
    if (!e) *dlid = r.dlid;
    return e;
  }

  void timers_changed() override {
    uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  [[noreturn]] void run() {
    uint64_t next_elect = 0;
    uint8_t buf[sizeof(FwdHdr) + 2048];
    for (;;) {
      const uint64_t now = mono_ns();
      if (now >= next_elect) {
        elect();
        next_elect = now + kElectNs;
      }
      std::vector<pollfd> fds{{sock_, POLLIN, 0}, {wake_, POLLIN, 0}};
      for (auto &g : gsis_) fds.push_back({g.fd, POLLIN, 0});
      uint64_t until = std::min(cm_->next_deadline(), next_elect);
      int ms = until <= now ? 0 : static_cast<int>(std::min<uint64_t>((until - now) / 1000000 + 1, 1000));
      if (poll(fds.data(), fds.size(), ms) > 0) {
        if (fds[1].revents) {
          uint64_t v;
          (void)!::read(wake_, &v, sizeof v);
        }
        if (fds[0].revents) {
          for (int i = 0; i < 64; i++) {
            ssize_t n = recv(sock_, buf, sizeof buf, 0);
            if (n < 0) break;
            FwdHdr h;
            if (static_cast<size_t>(n) < sizeof h) continue;
            std::memcpy(&h, buf, sizeof h);
            if (h.magic != kFwdMagic) continue;
            const Device *d = device(h.dev_ipv4, h.base_port);
            if (d) {
              net::trace_datagram({h.src_ip, h.src_port}, {d->ipv4, d->base_port}, buf + sizeof h,
                                  static_cast<size_t>(n) - sizeof h);
              deliver(*d, h.src_ip, buf + sizeof h, static_cast<size_t>(n) - sizeof h);
            }
          }
        }
        for (size_t k = 2; k < fds.size(); k++) {
          if (!fds[k].revents) continue;
          for (int i = 0; i < 64 && receive(gsis_[k - 2]); i++) {
          }
        }
      }
      cm_->tick();
    }
  }

  // At exit: the MADs already in this process's GSI sockets are handed on,
  // not lost with it. A MAD this process has just sent to a peer on this
  // host (a REJ, a DREP) is there when sendto() returns, if this process
  // owns the GSI; the peer would otherwise wait for a resend of its own.
  void drain() {
    std::vector<Gsi> g;
    {
      std::lock_guard l(gsi_mu_);
      g = gsis_;
    }
    for (const Gsi &x : g) {
      for (int i = 0; i < 256 && receive(x); i++) {
      }
    }
  }

 private:
  struct Sender {
    int fd = -1;
    uint16_t port = 0;
  };
  struct Gsi {
    Device dev;
    int fd;
    // The device's RoCE v2 port, where this socket is QP1's (slot 0's)
    // member of the group (net/roce_port.h); null: its port `base`.
    std::shared_ptr<net::RocePort> roce;
  };

  std::string service_path(uint64_t sid) const {
    char b[32];
    std::snprintf(b, sizeof b, "/s%016llx", static_cast<unsigned long long>(sid));
    return dir_ + b;
  }

  // A process reads the socket at path (a datagram to it is taken).
  bool alive(const std::string &path) {
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return true;
    sockaddr_un a = unix_addr(path);
    bool ok = connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    ::close(s);
    return ok;
  }

  const Device *device(uint32_t ipv4, uint16_t base) {
    std::lock_guard l(gsi_mu_);
    for (auto &g : gsis_) if (g.dev.ipv4 == ipv4 && g.dev.base_port == base) return &g.dev;
    for (auto &d : known_) if (d.ipv4 == ipv4 && d.base_port == base) return &d;
    return nullptr;
  }

  // Takes the GSI of each device of this namespace that no process has.
  void elect() {
    known_ = devices();
    for (const Device &d : known_) {
      bool have = false;
      for (auto &g : gsis_) have |= g.dev.ipv4 == d.ipv4 && g.dev.base_port == d.base_port;
      if (have) continue;
      int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(d.ipv4);
      a.sin_port = htons(d.base_port);
      if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        ::close(fd);
        continue;
      }
      std::lock_guard l(gsi_mu_);
      gsis_.push_back({d, fd, nullptr});
      // Peers on other hosts send to the RoCE v2 port: the group steers
      // QP1's slot to the owner (a context that gets it all the same, the
      // steering stale, hands it on to port base).
      if (d.roce_port) {
        std::string err;
        auto r = std::make_shared<net::RocePort>(d.ipv4, d.roce_port, 0, root_dir() + "/roce", 1u << 20, &err);
        if (r->fd() >= 0) gsis_.push_back({d, r->fd(), std::move(r)});
      }
    }
  }

  // One datagram from a GSI socket this process owns, handed on; false if
  // there was none. From another host it reaches the RoCE v2 port, where
  // the context that gets it hands it on to port base (rc/engine.cpp
  // roce_forward) behind the sender's endpoint: from our own address and
  // that port, which only the group's user can bind (net/roce_port.h).
  // (Without waiting: the RoCE port's socket blocks.)
  bool receive(const Gsi &g) {
    uint8_t buf[sizeof(FwdHdr) + 2048];
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(g.fd, buf + sizeof(FwdHdr), sizeof buf - sizeof(FwdHdr), MSG_DONTWAIT,
                         reinterpret_cast<sockaddr *>(&from), &fl);
    if (n < 0) return false;
    uint32_t src_ip = ntohl(from.sin_addr.s_addr);
    uint16_t src_port = ntohs(from.sin_port), dst_port = g.roce ? g.dev.roce_port : g.dev.base_port;
    uint8_t *b = buf;
    if (g.roce) {
      const uint8_t *pkt = buf + sizeof(FwdHdr);
      const uint32_t slot = static_cast<size_t>(n) >= wire::kBthLen ? slot_of_qpn(wire::bth::qpn(pkt)) : 0;
      if (slot) roce_forward(g, {src_ip, src_port}, pkt, static_cast<size_t>(n), slot);
      else demux(g.dev, src_ip, src_port, dst_port, b, static_cast<size_t>(n));
      return true;
    }
    if (g.dev.roce_port && src_ip == g.dev.ipv4 && src_port == g.dev.roce_port) {
      net::ForwardHdr h;
      if (!net::ForwardHdr::read(buf + sizeof(FwdHdr), static_cast<size_t>(n), h)) {
        count(g.dev, Counter::cm_rcvd);
        count(g.dev, Counter::cm_dropped);
        return true;
      }
      src_ip = h.src_ip;
      src_port = h.src_port;
      dst_port = h.dst_port;
      b += sizeof h;   // (demux writes its FwdHdr over ours)
      n -= sizeof h;
    }
    demux(g.dev, src_ip, src_port, dst_port, b, static_cast<size_t>(n));
    return true;
  }

  // A datagram for another slot at QP1's member of the RoCE v2 port's
  // group (its steering stale): to that slot's port, as a context hands it
  // on (rc/engine.cpp roce_forward).
  void roce_forward(const Gsi &g, net::Endpoint src, const uint8_t *pkt, size_t n, uint32_t slot) {
    if (g.dev.base_port + slot > 65535) return;
    net::ForwardHdr h{net::ForwardHdr::kMagic, src.ip, src.port, g.dev.roce_port};
    iovec v[2] = {{&h, sizeof h}, {const_cast<uint8_t *>(pkt), n}};
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(g.dev.ipv4);
    to.sin_port = htons(static_cast<uint16_t>(g.dev.base_port + slot));
    msghdr m{};
    m.msg_name = &to;
    m.msg_namelen = sizeof to;
    m.msg_iov = v;
    m.msg_iovlen = 2;
    (void)sendmsg(g.fd, &m, MSG_DONTWAIT);
  }

  // A datagram at a GSI this process owns (sent to dst_port): to its
  // process. buf has room for a FwdHdr before the datagram (at buf +
  // sizeof(FwdHdr)).
  void demux(const Device &dev, uint32_t src_ip, uint16_t src_port, uint16_t dst_port, uint8_t *buf,
             size_t n) {
    uint8_t *pkt = buf + sizeof(FwdHdr);
    const uint8_t *mad = unframe(pkt, n);
    if (!mad || !icrc_ok(dev, src_ip, src_port, dst_port, pkt, n)) {
      count(dev, Counter::cm_rcvd);
      count(dev, Counter::cm_dropped);
      return;
    }
    const uint16_t attr = wire::be::get16(mad + 16);
    const bool req = attr == static_cast<uint16_t>(Attr::req) || attr == static_cast<uint16_t>(Attr::sidr_req);
    const uint32_t slot = slot_for(mad);
    if (slot && slot != slot_) {
      FwdHdr h{kFwdMagic, dev.ipv4, src_ip, dev.base_port, src_port};
      std::memcpy(buf, &h, sizeof h);
      sockaddr_un a = unix_addr(dir_ + "/p" + std::to_string(slot));
      if (sendto(sock_, buf, sizeof h + n, 0, reinterpret_cast<sockaddr *>(&a), sizeof a) >= 0) {
        count(dev, Counter::cm_forwarded);
        return;
      }
      // Its process is gone: a REQ is refused here (no listener), the rest dropped.
      if (!req) {
        count(dev, Counter::cm_rcvd);
        count(dev, Counter::cm_dropped);
        return;
      }
    }
    net::trace_datagram({src_ip, src_port}, {dev.ipv4, dst_port}, pkt, n);
    cm_->on_mad(dev, src_ip, mad, kMadLen);
  }

  // The process a MAD is for: a REQ's or SIDR REQ's by its service ID
  // (both carry it at the same place), a SIDR REP's by the request ID it
  // answers, any other's by the comm ID it names. 0: none.
  uint32_t slot_for(const uint8_t *mad) {
    const uint16_t attr = wire::be::get16(mad + 16);
    if (attr == static_cast<uint16_t>(Attr::req) || attr == static_cast<uint16_t>(Attr::sidr_req)) {
      char b[64];
      ssize_t l = readlink(service_path(wire::be::get64(mad + kMadHdrLen + 8)).c_str(), b, sizeof b - 1);
      if (l > 1 && b[0] == 'p') return static_cast<uint32_t>(std::strtoul(std::string(b + 1, l - 1).c_str(), nullptr, 10));
      return 0;
    }
    if (attr == static_cast<uint16_t>(Attr::sidr_rep)) return slot_of_comm(wire::be::get32(mad + kMadHdrLen));
    return slot_of_comm(wire::be::get32(mad + kMadHdrLen + 4));
  }

  // A MAD to the device it leaves from (both ends on one device: lo) goes
  // straight to its process's socket, as the GSI owner would hand it on:
  // it does not depend on the owner being alive when it arrives (a process
  // that sends a REJ and exits may be the owner). false: not handed.
  bool hand_local(const Device &from, uint16_t src_port, const uint8_t *pkt, size_t n) {
    const uint32_t slot = slot_for(pkt + 20);
    if (!slot) return false;
    FwdHdr h{kFwdMagic, from.ipv4, from.ipv4, from.base_port, src_port};
    iovec v[2] = {{&h, sizeof h}, {const_cast<uint8_t *>(pkt), n}};
    sockaddr_un a = unix_addr(dir_ + "/p" + std::to_string(slot));
    msghdr m{};
    m.msg_name = &a;
    m.msg_namelen = sizeof a;
    m.msg_iov = v;
    m.msg_iovlen = 2;
    return sendmsg(sock_, &m, MSG_DONTWAIT) >= 0;
  }

  // From the owner, already checked.
  void deliver(const Device &dev, uint32_t src_ip, const uint8_t *pkt, size_t n) {
    const uint8_t *mad = unframe(pkt, n);
    if (!mad) {
      count(dev, Counter::cm_rcvd);
      count(dev, Counter::cm_dropped);
      return;
    }
    cm_->on_mad(dev, src_ip, mad, kMadLen);
  }

  // (A kernel CM's datagrams have IP IDs of a counter, which the ICRC
  // covers and a UDP socket does not show: wire::solve_ip_id finds one.)
  bool icrc_ok(const Device &dev, uint32_t src_ip, uint16_t src_port, uint16_t dst_port,
               const uint8_t *pkt, size_t n) {
    const uint32_t icrc = wire::icrc::get(pkt + n - 4);
    if (icrc == 0) return local_ip(src_ip, dev.ipv4);
    wire::Ipv4Pseudo ip{src_ip, dev.ipv4, src_port, dst_port};
    iovec v{const_cast<uint8_t *>(pkt), n - 4};
    const uint32_t icrc0 = wire::icrc_ipv4(ip, &v, 1);
    uint16_t id;
    return icrc0 == icrc || wire::solve_ip_id(icrc0, icrc, n, &id);
  }

  std::string dir_;
  int lock_fd_ = -1, sock_ = -1, wake_ = -1;
  uint32_t slot_ = 0;
  uint64_t psn_ = 0;
  Cm *cm_ = nullptr;
  std::map<uint32_t, Sender> senders_;
  std::vector<Gsi> gsis_;    // changed by the CM thread only, under gsi_mu_
  std::mutex gsi_mu_;
  std::vector<Device> known_;
  std::mutex counters_mu_;   // the thread counts outside the Cm's lock
  std::map<std::string, std::unique_ptr<OwnCounters>> counters_;
  std::map<std::string, bool> oc_failed_;
};

}  // namespace

Cm *process_cm(int *err) {
  static std::mutex mu;
  static Cm *cm = nullptr;
  std::lock_guard g(mu);
  if (cm) return cm;
  guard::install();
  auto *net = new HostNet();
  if (int e = net->start()) {
    delete net;
    *err = e;
    return nullptr;
  }
  cm = new Cm(*net);   // both live as long as the process
  net->set_cm(cm);
  std::thread([net] { net->run(); }).detach();
  static HostNet *exiting = net;
  std::atexit([] { exiting->drain(); });
  return cm;
}

}  // namespace usrc::cm
