#include "usrc/net/xdp.h"

#include "usrc/common/guard.h"
#include "usrc/common/log.h"
#include "usrc/net/ipv4.h"
#include "usrc/net/neigh.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <unordered_map>
#include <vector>

// The XDP program (xdp_steer.bpf.c), compiled at build time: usrc_xdp_steer[].
#include "xdp_steer.bpf.h"

namespace usrc::net {

namespace {

// The UMEM's frames: kRxFrames for receiving (the fill ring), kTxFrames for
// sending. In copy mode the fill ring holds no more frames than the traffic
// needs (from kFillStart, doubled whenever a receive finds half of them
// used): the kernel takes its frames in order, so each frame there is used
// once per cycle, and the first use of a frame is slow (on a guest, tens of
// microseconds: with 2048 frames in the ring, ib_send_lat over a veth
// reported 21-31 us for its first 1000 round trips, 4.3 later). Frames
// given back are used again first (rx_frames_ is a stack). In zero-copy
// mode the driver fills its own receive ring from the fill ring (and polls
// on while it cannot): it gets them all.
constexpr uint32_t kFrame = XSK_UMEM__DEFAULT_FRAME_SIZE, kRxFrames = 2048, kTxFrames = 2048,
                   kFrames = kRxFrames + kTxFrames, kRing = 2048, kFillStart = 64;
constexpr size_t kHdr = 14 + 20 + 8;                                // Ethernet, IPv4, UDP
static_assert(kXdpMaxPayload == kFrame - XDP_PACKET_HEADROOM - kHdr);

bool parse_mac(const std::string &s, uint8_t mac[6]) {
  unsigned m[6];
  if (sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
    return false;
  for (int i = 0; i < 6; i++) mac[i] = static_cast<uint8_t>(m[i]);
  return true;
}

// libbpf's and libxdp's messages go to our log (warnings at debug level:
// a mode that does not work here is tried and left quietly).
int library_message(const char *fmt, va_list ap) {
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && line[n - 1] == '\n') line[--n] = 0;
  log().debug("{}", line);   // (each message names its library)
  return 0;
}
void route_library_messages() {
  static std::once_flag once;
  std::call_once(once, [] {
    libbpf_set_print([](libbpf_print_level, const char *f, va_list ap) { return library_message(f, ap); });
    libxdp_set_print([](libxdp_print_level, const char *f, va_list ap) { return library_message(f, ap); });
  });
}

// Our program, opened from the bytes built into the provider, for one
// port, and attached through a BPF link: the kernel detaches it when the
// link's last fd closes, so a process killed before its clean-up leaves
// nothing on the netdev (a program attached through netlink stays, and
// every later attach there fails with EBUSY). One XDP program per
// interface: the link is refused where another one is attached.
class Program {
 public:
  ~Program() {
    if (link_ >= 0) ::close(link_);
    bpf_object__close(obj_);
  }
  bool open(uint16_t port, std::string *why) {
    LIBBPF_OPTS(bpf_object_open_opts, oo, .object_name = "usrc_xdp");
    obj_ = bpf_object__open_mem(usrc_xdp_steer, sizeof usrc_xdp_steer, &oo);
    if (!obj_) return *why = "open the XDP program", false;
    // The port, before loading: the program's only read-only variable.
    bpf_map *rodata = bpf_object__find_map_by_name(obj_, ".rodata");
    size_t size = 0;
    const uint16_t be = htons(port);
    if (!rodata || !bpf_map__initial_value(rodata, &size) || size != sizeof be ||
        bpf_map__set_initial_value(rodata, &be, sizeof be))
      return *why = "the XDP program's port variable", false;
    return true;
  }
  // 0, or the error (negative errno).
  int attach(unsigned ifindex, xdp_attach_mode mode) {
    if (int e = bpf_object__load(obj_)) return e;
    bpf_program *p = bpf_object__next_program(obj_, nullptr);
    if (!p) return -ENOENT;
    LIBBPF_OPTS(bpf_link_create_opts, lo,
                .flags = mode == XDP_MODE_SKB ? XDP_FLAGS_SKB_MODE : XDP_FLAGS_DRV_MODE);
    const int fd = bpf_link_create(bpf_program__fd(p), int(ifindex), BPF_XDP, &lo);
    if (fd < 0) return fd;   // (libbpf's errors are negative errno)
    link_ = fd;
    return 0;
  }
  // The XSKMAP, once loaded.
  int xsks_fd() const {
    bpf_map *m = bpf_object__find_map_by_name(obj_, "usrc_xsks");
    return m ? bpf_map__fd(m) : -1;
  }

 private:
  bpf_object *obj_ = nullptr;
  int link_ = -1;
};

class XdpNic final : public Nic {
 public:
  ~XdpNic() override {
    // The program first: no packet must be steered to a closing socket.
    prog_.reset();
    if (xsk_tx_) xsk_socket__delete(xsk_tx_);
    if (xsk_) xsk_socket__delete(xsk_);
    if (umem_) xsk_umem__delete(umem_);
    if (sock_ >= 0) ::close(sock_);
    if (area_ != MAP_FAILED) munmap(area_, size_t(kFrame) * kFrames);
  }
  Endpoint local() const override { return local_; }
  int wait_fd() const override { return xsk_ ? xsk_socket__fd(xsk_) : -1; }
  LocalPeers *local_peers() override { return nullptr; }

  void add_peer(Endpoint e) override {
    uint8_t mac[6];
    if (!neigh_.find(e.ip, mac)) probe(e.ip);
  }

  size_t send(std::span<const TxPacket> pkts) override {
    reclaim_tx();
    const uint32_t room = xsk_prod_nb_free(&tx_, uint32_t(std::min<size_t>(pkts.size(), kRing)));
    uint32_t built = 0;
    for (const TxPacket &p : pkts) {
      if (free_tx_.empty() || built == room) break;
      uint8_t mac[6];
      if (!neigh_.find(p.dst.ip, mac)) {
        probe(p.dst.ip);   // dropped: the transport retransmits once resolved
        continue;
      }
      uint64_t addr = free_tx_.back();
      uint8_t *f = frame(addr);
      size_t len = 0;
      bool faulted = false;
      for (size_t i = 0; i < p.iovcnt && !faulted; i++) {
        if (kHdr + len + p.iov[i].iov_len > kFrame) break;
        faulted = !guard::copy(f + kHdr + len, p.iov[i].iov_base, p.iov[i].iov_len);
        len += p.iov[i].iov_len;
      }
      if (faulted) continue;   // (an unmapped payload: as ofi.cpp says)
      build_headers(f, mac, p, len);
      free_tx_.pop_back();
      out_[built++] = {addr, static_cast<uint32_t>(kHdr + len), 0};
    }
    if (built) {
      uint32_t idx;
      xsk_ring_prod__reserve(&tx_, built, &idx);   // (room was checked)
      for (uint32_t i = 0; i < built; i++) *xsk_ring_prod__tx_desc(&tx_, idx + i) = out_[i];
      xsk_ring_prod__submit(&tx_, built);
      kick_tx();
    }
    return built;
  }

  size_t recv(std::span<RxPacket> out) override {
    rx_done();
    uint32_t idx = 0, n = 0;
    const uint32_t take = xsk_ring_cons__peek(&rx_, uint32_t(std::min<size_t>(out.size(), kRing)), &idx);
    if (take && given() - take < fill_target_ / 2 && fill_target_ < kRxFrames) fill_target_ *= 2;
    if (tx_left_) kick_tx();   // (sends the kernel left in the ring: see kick_tx)
    for (uint32_t i = 0; i < take; i++) {
      const xdp_desc *d = xsk_ring_cons__rx_desc(&rx_, idx + i);
      rx_frames_.push_back(d->addr & ~uint64_t(kFrame - 1));
      const uint8_t *f = frame(d->addr);
      if (d->len < kHdr) continue;
      uint16_t tot = (f[16] << 8) | f[17];
      if (tot < 28 || 14u + tot > d->len) continue;
      out[n].src = {uint32_t(f[26]) << 24 | f[27] << 16 | f[28] << 8 | f[29],
                    static_cast<uint16_t>(f[34] << 8 | f[35])};
      out[n].data = f + kHdr;
      out[n].len = tot - 28;
      out[n].trusted = false;
      n++;
    }
    held_ = take;
    return n;
  }

  // Frames handed out are consumed: released (the fd is readable while
  // any is held), and the fill ring refilled.
  void rx_done() override {
    if (!held_) return;
    xsk_ring_cons__release(&rx_, held_);
    refill();
    held_ = 0;
  }

  int init(Endpoint local, const std::string &netdev, std::string *err, int *errno_out) {
    local_ = local;
    auto fail = [&](const std::string &what, int e = errno) {
      *errno_out = e;
      *err = what + ": " + strerror(e);
      return -1;
    };
    route_library_messages();
    ifindex_ = if_nametoindex(netdev.c_str());
    if (!ifindex_) return fail("netdev " + netdev);
    if (!neigh_.open(ifindex_)) return fail("rtnetlink (neighbours of " + netdev + ")");
    std::ifstream a("/sys/class/net/" + netdev + "/address");
    std::string mac;
    if (!(a >> mac) || !parse_mac(mac, src_mac_)) return fail("MAC of " + netdev);
    // A kernel UDP socket on our port reserves it (slots collide as with
    // udp) and sends the datagrams that make the kernel resolve neighbours.
    sock_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa = to_sockaddr(local);
    if (sock_ < 0 || bind(sock_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0)
      return fail("bind");

    // The UMEM: kRxFrames for receiving (the fill ring), then kTxFrames for sending.
    area_ = mmap(nullptr, size_t(kFrame) * kFrames, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area_ == MAP_FAILED) return fail("mmap umem");
    xsk_umem_config uc{};
    uc.fill_size = uc.comp_size = kRing;
    uc.frame_size = kFrame;
    uc.frame_headroom = 0;
    if (int e = xsk_umem__create(&umem_, area_, uint64_t(kFrame) * kFrames, &fill_, &comp_, &uc))
      return fail("AF_XDP umem", -e);
    for (uint32_t i = 0; i < kRxFrames; i++) rx_frames_.push_back(uint64_t(i) * kFrame);
    for (uint32_t i = kRxFrames; i < kFrames; i++) free_tx_.push_back(uint64_t(i) * kFrame);
    out_.resize(kRing);

    // Native XDP where the driver has it, else generic (SKB) mode: veth has
    // native XDP, but zero-copy only on real NICs; copy mode everywhere else.
    // The program is ours (it steers only our port), so the socket must
    // not load libxdp's default one.
    struct { xdp_attach_mode xdp; uint16_t bind; } modes[] = {{XDP_MODE_NATIVE, XDP_ZEROCOPY},
                                                             {XDP_MODE_NATIVE, XDP_COPY},
                                                             {XDP_MODE_SKB, XDP_COPY}};
    const char *force = getenv("USRC_XDP_MODE");   // "skb" forces generic mode
    std::string why = "no XDP mode";
    int last = EOPNOTSUPP;
    xdp_attach_mode refused = XDP_MODE_UNSPEC;
    for (auto m : modes) {
      if (force && !strcmp(force, "skb") && m.xdp != XDP_MODE_SKB) continue;
      if (m.xdp == refused) continue;
      if (!prog_ || prog_mode_ != m.xdp) {
        prog_.reset();   // (each mode gets the program opened anew)
        auto p = std::make_unique<Program>();
        if (!p->open(local.port, &why)) return fail(why, EINVAL);
        if (int e = p->attach(ifindex_, m.xdp)) {
          last = -e;
          refused = m.xdp;
          why = "attach the XDP program to " + netdev;
          continue;
        }
        prog_ = std::move(p);
        prog_mode_ = m.xdp;
      }
      const xsk_socket_config sc = socket_config(m.bind);
      if (int e = xsk_socket__create(&xsk_, netdev.c_str(), 0, umem_, &rx_, nullptr, &sc)) {
        last = -e;
        why = "bind an XSK to " + netdev + " queue 0";
        xsk_ = nullptr;
        continue;
      }
      if (m.bind == XDP_ZEROCOPY) fill_target_ = kRxFrames;
      break;
    }
    if (!xsk_) {
      prog_.reset();
      return fail(why + " (another XDP program or XSK there?)", last);
    }
    // Sending through a second socket on the same UMEM and queue: poll()
    // on a socket with a TX ring transmits in copy mode (under the
    // socket's mutex), so the progress thread's sleep on the receiving
    // one would contend with every send.
    // (Its bind flags are the first one's: it shares that one's UMEM.)
    const xsk_socket_config tx_sc = socket_config(0);
    if (int e = xsk_socket__create(&xsk_tx_, netdev.c_str(), 0, umem_, nullptr, &tx_, &tx_sc)) {
      xsk_tx_ = nullptr;
      prog_.reset();
      return fail("a sending XSK on " + netdev + " queue 0", -e);
    }
    // (libxdp opens them without close-on-exec.)
    for (xsk_socket *x : {xsk_, xsk_tx_}) fcntl(xsk_socket__fd(x), F_SETFD, FD_CLOEXEC);
    refill();
    if (int e = xsk_socket__update_xskmap(xsk_, prog_->xsks_fd())) return fail("XSKMAP update", -e);
    return 0;
  }

 private:
  uint8_t *frame(uint64_t addr) { return static_cast<uint8_t *>(xsk_umem__get_data(area_, addr)); }

  // Both XSKs' configuration (without libxdp's default program: see init).
  static xsk_socket_config socket_config(uint16_t bind_flags) {
    xsk_socket_config sc{};
    sc.rx_size = sc.tx_size = kRing;
    sc.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;
    sc.bind_flags = bind_flags;
    return sc;
  }

  void refill() {
    uint32_t idx;
    const uint32_t want = std::min<uint32_t>({fill_target_ - given(), uint32_t(rx_frames_.size()),
                                              xsk_prod_nb_free(&fill_, kRing)});
    const uint32_t k = xsk_ring_prod__reserve(&fill_, want, &idx);
    for (uint32_t i = 0; i < k; i++) {
      *xsk_ring_prod__fill_addr(&fill_, idx + i) = rx_frames_.back();
      rx_frames_.pop_back();
    }
    if (k) xsk_ring_prod__submit(&fill_, k);
  }

  // Copy and generic modes transmit only when told to, and a call takes
  // at most a batch (32 descriptors in Linux 6.x) before it says EAGAIN
  // (EBUSY: it dropped one): told again while the kernel takes some and
  // leaves some. What is left (a full completion ring, a busy device) goes
  // at the next send() or recv(): no poll() drives the sending socket.
  void kick_tx() {
    const int fd = xsk_socket__fd(xsk_tx_);
    tx_left_ = false;
    for (int i = 0; i < 2 * int(kRing / 32); i++) {
      const uint32_t before = __atomic_load_n(tx_.consumer, __ATOMIC_ACQUIRE);
      if (sendto(fd, nullptr, 0, MSG_DONTWAIT, nullptr, 0) >= 0) return;
      if (errno != EAGAIN && errno != EBUSY) break;
      const uint32_t after = __atomic_load_n(tx_.consumer, __ATOMIC_ACQUIRE);
      if (after == tx_.cached_prod) return;
      if (after == before) break;
    }
    tx_left_ = true;
  }

  void reclaim_tx() {
    uint32_t idx;
    const uint32_t n = xsk_ring_cons__peek(&comp_, kRing, &idx);
    for (uint32_t i = 0; i < n; i++) free_tx_.push_back(*xsk_ring_cons__comp_addr(&comp_, idx + i));
    if (n) xsk_ring_cons__release(&comp_, n);
  }

  void build_headers(uint8_t *f, const uint8_t dst_mac[6], const TxPacket &p, size_t len) {
    const Endpoint dst = p.dst;
    const uint16_t sport = p.src_port ? p.src_port : local_.port;
    memcpy(f, dst_mac, 6);
    memcpy(f + 6, src_mac_, 6);
    f[12] = 0x08, f[13] = 0x00;
    uint8_t *ip = f + 14;
    uint16_t tot = static_cast<uint16_t>(20 + 8 + len);
    // Version/IHL, the packet's TOS, length, IP ID 0, DF, its TTL (64 by
    // default), UDP: as the kernel sends from the udp backend (the ICRC
    // covers the IP ID and DF).
    const uint8_t h[20] = {0x45, p.tos, uint8_t(tot >> 8), uint8_t(tot), 0, 0, 0x40, 0,
                           uint8_t(p.ttl ? p.ttl : 64), IPPROTO_UDP,
                           0, 0, uint8_t(local_.ip >> 24), uint8_t(local_.ip >> 16),
                           uint8_t(local_.ip >> 8), uint8_t(local_.ip), uint8_t(dst.ip >> 24),
                           uint8_t(dst.ip >> 16), uint8_t(dst.ip >> 8), uint8_t(dst.ip)};
    memcpy(ip, h, 20);
    uint16_t c = ipv4_header_checksum(ip, 20);
    ip[10] = uint8_t(c >> 8), ip[11] = uint8_t(c);
    uint8_t *u = ip + 20;
    uint16_t ul = static_cast<uint16_t>(8 + len);
    const uint8_t uh[8] = {uint8_t(sport >> 8), uint8_t(sport), uint8_t(dst.port >> 8),
                           uint8_t(dst.port), uint8_t(ul >> 8), uint8_t(ul), 0, 0};   // no UDP checksum (IPv4)
    memcpy(u, uh, 8);
  }

  // One datagram through the kernel makes it resolve the neighbour (to the
  // discard port, not to usrc's: the peer's XDP program would take it).
  void probe(uint32_t ip) {
    uint64_t now = static_cast<uint64_t>(time(nullptr));
    if (probed_[ip] == now) return;
    probed_[ip] = now;
    sockaddr_in to = to_sockaddr({ip, 9});
    sendto(sock_, "", 0, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to), sizeof to);
  }

  Endpoint local_;
  unsigned ifindex_ = 0;
  uint8_t src_mac_[6] = {};
  int sock_ = -1;
  uint32_t held_ = 0;
  // Frames in the kernel's hands (the fill ring's, and those received and
  // not yet seen: every receive frame not on the free stack), and how many
  // it is given at most (see kRxFrames).
  uint32_t given() const { return kRxFrames - uint32_t(rx_frames_.size()); }
  uint32_t fill_target_ = kFillStart;
  bool tx_left_ = false;   // the last kick_tx left sends in the ring
  void *area_ = MAP_FAILED;
  xsk_umem *umem_ = nullptr;
  xsk_socket *xsk_ = nullptr;      // receives (the XSKMAP's)
  xsk_socket *xsk_tx_ = nullptr;   // sends
  xsk_ring_prod fill_{}, tx_{};
  xsk_ring_cons comp_{}, rx_{};
  std::unique_ptr<Program> prog_;
  xdp_attach_mode prog_mode_ = XDP_MODE_UNSPEC;
  std::vector<uint64_t> rx_frames_, free_tx_;
  std::vector<xdp_desc> out_;   // the descriptors of a send, before they enter the ring
  Neighbours neigh_;
  std::unordered_map<uint32_t, uint64_t> probed_;
};

}  // namespace

std::unique_ptr<Nic> open_xdp_nic(Endpoint local, const std::string &netdev, uint32_t,
                                  int *errno_out, std::string *err) {
  auto nic = std::make_unique<XdpNic>();
  *errno_out = 0;
  if (nic->init(local, netdev, err, errno_out)) return nullptr;
  return nic;
}

}  // namespace usrc::net
