#include "usrc/net/xdp.h"

#include "usrc/common/guard.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#ifndef SOL_XDP
#define SOL_XDP 283
#endif

namespace usrc::net {

namespace {

constexpr uint32_t kFrame = 4096, kFrames = 4096, kRing = 2048;   // half RX, half TX
constexpr size_t kHdr = 14 + 20 + 8;                                // Ethernet, IPv4, UDP

// One ring of the AF_XDP socket, mapped from the kernel.
struct Ring {
  uint32_t *producer, *consumer, mask;
  void *desc;
  void *map = MAP_FAILED;
  size_t map_len = 0;
  uint32_t load(uint32_t *p) { return std::atomic_ref<uint32_t>(*p).load(std::memory_order_acquire); }
  void store(uint32_t *p, uint32_t v) { std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release); }
  uint64_t &addr(uint32_t i) { return static_cast<uint64_t *>(desc)[i & mask]; }
  xdp_desc &xd(uint32_t i) { return static_cast<xdp_desc *>(desc)[i & mask]; }
};

// The XDP program, assembled by hand (no BPF compiler needed): IPv4/UDP
// frames for our port, unfragmented and without IP options, go to the XSK
// of their receive queue; everything else, and every queue without an XSK,
// passes to the kernel.
std::vector<bpf_insn> steer_program(int map_fd, uint16_t port) {
  auto I = [](uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    bpf_insn i{};
    i.code = code;
    i.dst_reg = dst;
    i.src_reg = src;
    i.off = off;
    i.imm = imm;
    return i;
  };
  // Loads see the bytes in memory order on a little-endian CPU.
  int32_t ipv4 = 0x0008, dport = ((port & 0xff) << 8) | (port >> 8);
  std::vector<bpf_insn> p = {
      I(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),                 // r6 = ctx
      I(BPF_LDX | BPF_MEM | BPF_W, 2, 1, 0, 0),                   // r2 = data
      I(BPF_LDX | BPF_MEM | BPF_W, 3, 1, 4, 0),                   // r3 = data_end
      I(BPF_ALU64 | BPF_MOV | BPF_X, 4, 2, 0, 0),
      I(BPF_ALU64 | BPF_ADD | BPF_K, 4, 0, 0, kHdr),
      I(BPF_JMP | BPF_JGT | BPF_X, 4, 3, 13, 0),                  // too short: pass
      I(BPF_LDX | BPF_MEM | BPF_H, 5, 2, 12, 0),
      I(BPF_JMP | BPF_JNE | BPF_K, 5, 0, 11, ipv4),               // not IPv4
      I(BPF_LDX | BPF_MEM | BPF_B, 5, 2, 14, 0),
      I(BPF_JMP | BPF_JNE | BPF_K, 5, 0, 9, 0x45),                // IP options
      I(BPF_LDX | BPF_MEM | BPF_B, 5, 2, 23, 0),
      I(BPF_JMP | BPF_JNE | BPF_K, 5, 0, 7, IPPROTO_UDP),
      I(BPF_LDX | BPF_MEM | BPF_H, 5, 2, 20, 0),
      I(BPF_ALU64 | BPF_AND | BPF_K, 5, 0, 0, 0xff3f),            // MF or fragment offset
      I(BPF_JMP | BPF_JNE | BPF_K, 5, 0, 4, 0),
      I(BPF_LDX | BPF_MEM | BPF_H, 5, 2, 36, 0),
      I(BPF_JMP | BPF_JNE | BPF_K, 5, 0, 2, dport),
      I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
      I(0, 0, 0, 0, 0),
      // (the jumps above land on "pass" below, counting the two-slot load)
  };
  // Fix the jump targets: every "goto pass" lands after the redirect block.
  p.push_back(I(BPF_LDX | BPF_MEM | BPF_W, 2, 6, 16, 0));       // r2 = rx_queue_index
  p.push_back(I(BPF_ALU64 | BPF_MOV | BPF_K, 3, 0, 0, XDP_PASS)); // fallback action
  p.push_back(I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_redirect_map));
  p.push_back(I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
  size_t pass = p.size();
  p.push_back(I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, XDP_PASS));
  p.push_back(I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
  for (size_t i = 0; i < 17; i++)
    if (BPF_CLASS(p[i].code) == BPF_JMP && BPF_OP(p[i].code) != BPF_CALL)
      p[i].off = static_cast<int16_t>(pass - i - 1);
  return p;
}

uint16_t csum16(const uint8_t *p, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i + 1 < n; i += 2) s += (p[i] << 8) | p[i + 1];
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return static_cast<uint16_t>(~s);
}

bool parse_mac(const std::string &s, uint8_t mac[6]) {
  unsigned m[6];
  if (sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
    return false;
  for (int i = 0; i < 6; i++) mac[i] = static_cast<uint8_t>(m[i]);
  return true;
}

class XdpNic final : public Nic {
 public:
  ~XdpNic() override {
    if (attached_) bpf_xdp_detach(ifindex_, xdp_flags_, nullptr);
    for (Ring *r : {&fill_, &comp_, &rx_, &tx_})
      if (r->map != MAP_FAILED) munmap(r->map, r->map_len);
    for (int fd : {xsk_, prog_, map_, sock_})
      if (fd >= 0) ::close(fd);
    if (umem_ != MAP_FAILED) munmap(umem_, size_t(kFrame) * kFrames);
  }
  Endpoint local() const override { return local_; }
  int wait_fd() const override { return xsk_; }
  LocalPeers *local_peers() override { return nullptr; }

  void add_peer(Endpoint e) override {
    uint8_t mac[6];
    if (!neighbour(e.ip, mac)) probe(e.ip);
  }

  size_t send(std::span<const TxPacket> pkts) override {
    reclaim_tx();
    uint32_t prod = *tx_.producer, sent = 0;
    uint32_t room = kRing - (prod - tx_.load(tx_.consumer));
    for (const TxPacket &p : pkts) {
      if (free_tx_.empty() || sent == room) break;
      uint8_t mac[6];
      if (!neighbour(p.dst.ip, mac)) {
        probe(p.dst.ip);   // dropped: the transport retransmits once resolved
        continue;
      }
      uint64_t addr = free_tx_.back();
      uint8_t *f = umem(addr);
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
      tx_.xd(prod + sent) = {addr, static_cast<uint32_t>(kHdr + len), 0};
      sent++;
    }
    if (sent) {
      tx_.store(tx_.producer, prod + sent);
      // Copy and generic modes transmit only when told to.
      sendto(xsk_, nullptr, 0, MSG_DONTWAIT, nullptr, 0);
    }
    return sent;
  }

  size_t recv(std::span<RxPacket> out) override {
    // Frames handed out last time are consumed: release them, refill.
    if (held_) {
      rx_.store(rx_.consumer, *rx_.consumer + held_);
      refill();
      held_ = 0;
    }
    uint32_t cons = *rx_.consumer, avail = rx_.load(rx_.producer) - cons, n = 0;
    uint32_t take = std::min<uint32_t>(avail, out.size());
    for (uint32_t i = 0; i < take; i++) {
      const xdp_desc &d = rx_.xd(cons + i);
      rx_frames_.push_back(d.addr & ~uint64_t(kFrame - 1));
      const uint8_t *f = umem(d.addr);
      if (d.len < kHdr) continue;
      uint16_t tot = (f[16] << 8) | f[17];
      if (tot < 28 || 14u + tot > d.len) continue;
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

  int init(Endpoint local, const std::string &netdev, std::string *err, int *errno_out) {
    local_ = local;
    auto fail = [&](const std::string &what) {
      *errno_out = errno;
      *err = what + ": " + strerror(errno);
      return -1;
    };
    ifindex_ = if_nametoindex(netdev.c_str());
    if (!ifindex_) return fail("netdev " + netdev);
    std::ifstream a("/sys/class/net/" + netdev + "/address");
    std::string mac;
    if (!(a >> mac) || !parse_mac(mac, src_mac_)) return fail("MAC of " + netdev);
    // A kernel UDP socket on our port reserves it (slots collide as with
    // udp) and sends the datagrams that make the kernel resolve neighbours.
    sock_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(local.ip);
    sa.sin_port = htons(local.port);
    if (sock_ < 0 || bind(sock_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0)
      return fail("bind");

    umem_ = mmap(nullptr, size_t(kFrame) * kFrames, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (umem_ == MAP_FAILED) return fail("mmap umem");
    xsk_ = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (xsk_ < 0) return fail("AF_XDP socket");
    xdp_umem_reg reg{};
    reg.addr = reinterpret_cast<uint64_t>(umem_);
    reg.len = uint64_t(kFrame) * kFrames;
    reg.chunk_size = kFrame;
    if (setsockopt(xsk_, SOL_XDP, XDP_UMEM_REG, &reg, sizeof reg)) return fail("XDP_UMEM_REG");
    int n = kRing;
    for (int opt : {XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING, XDP_TX_RING})
      if (setsockopt(xsk_, SOL_XDP, opt, &n, sizeof n)) return fail("XDP ring size");
    xdp_mmap_offsets off{};
    socklen_t ol = sizeof off;
    if (getsockopt(xsk_, SOL_XDP, XDP_MMAP_OFFSETS, &off, &ol)) return fail("XDP_MMAP_OFFSETS");
    if (!map_ring(fill_, off.fr, XDP_UMEM_PGOFF_FILL_RING, sizeof(uint64_t)) ||
        !map_ring(comp_, off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, sizeof(uint64_t)) ||
        !map_ring(rx_, off.rx, XDP_PGOFF_RX_RING, sizeof(xdp_desc)) ||
        !map_ring(tx_, off.tx, XDP_PGOFF_TX_RING, sizeof(xdp_desc)))
      return fail("mmap XDP ring");
    for (uint32_t i = 0; i < kFrames / 2; i++) rx_frames_.push_back(uint64_t(i) * kFrame);
    for (uint32_t i = kFrames / 2; i < kFrames; i++) free_tx_.push_back(uint64_t(i) * kFrame);
    refill();

    // The program first (bind needs no program, but packets must not reach
    // the XSK before it exists: the map is filled after bind).
    map_ = bpf_map_create(BPF_MAP_TYPE_XSKMAP, "usrc_xsks", 4, 4, 64, nullptr);
    if (map_ < 0) return fail("XSKMAP");
    auto insns = steer_program(map_, local.port);
    char log[4096] = "";
    LIBBPF_OPTS(bpf_prog_load_opts, po, .log_size = sizeof log, .log_buf = log);
    prog_ = bpf_prog_load(BPF_PROG_TYPE_XDP, "usrc_xdp", "GPL", insns.data(), insns.size(), &po);
    if (prog_ < 0) return fail(std::string("XDP program load (") + log + ")");
    // Native XDP where the driver has it, else generic (SKB) mode: veth has
    // native XDP, but zero-copy only on real NICs; copy mode everywhere else.
    struct { uint32_t xdp, bind; } modes[] = {{XDP_FLAGS_DRV_MODE, XDP_ZEROCOPY},
                                             {XDP_FLAGS_DRV_MODE, XDP_COPY},
                                             {XDP_FLAGS_SKB_MODE, XDP_COPY}};
    const char *force = getenv("USRC_XDP_MODE");   // "skb" forces generic mode
    bool bound = false;
    for (auto m : modes) {
      if (force && !strcmp(force, "skb") && m.xdp != XDP_FLAGS_SKB_MODE) continue;
      if (bpf_xdp_attach(ifindex_, prog_, m.xdp | XDP_FLAGS_UPDATE_IF_NOEXIST, nullptr)) continue;
      attached_ = true;
      xdp_flags_ = m.xdp;
      sockaddr_xdp sx{};
      sx.sxdp_family = AF_XDP;
      sx.sxdp_ifindex = ifindex_;
      sx.sxdp_queue_id = 0;
      sx.sxdp_flags = static_cast<uint16_t>(m.bind);
      if (bind(xsk_, reinterpret_cast<sockaddr *>(&sx), sizeof sx) == 0) {
        bound = true;
        break;
      }
      bpf_xdp_detach(ifindex_, m.xdp, nullptr);
      attached_ = false;
    }
    if (!bound) return fail("attach XDP program / bind XSK to " + netdev + " queue 0 (another XDP program there?)");
    int key = 0;
    if (bpf_map_update_elem(map_, &key, &xsk_, 0)) return fail("XSKMAP update");
    return 0;
  }

 private:
  uint8_t *umem(uint64_t addr) { return static_cast<uint8_t *>(umem_) + addr; }

  bool map_ring(Ring &r, const xdp_ring_offset &o, off_t pgoff, size_t esz) {
    r.map_len = o.desc + kRing * esz;
    r.map = mmap(nullptr, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, xsk_, pgoff);
    if (r.map == MAP_FAILED) return false;
    auto *b = static_cast<uint8_t *>(r.map);
    r.producer = reinterpret_cast<uint32_t *>(b + o.producer);
    r.consumer = reinterpret_cast<uint32_t *>(b + o.consumer);
    r.desc = b + o.desc;
    r.mask = kRing - 1;
    return true;
  }

  void refill() {
    uint32_t prod = *fill_.producer;
    uint32_t room = kRing - (prod - fill_.load(fill_.consumer)), k = 0;
    while (k < room && !rx_frames_.empty()) {
      fill_.addr(prod + k++) = rx_frames_.back();
      rx_frames_.pop_back();
    }
    if (k) fill_.store(fill_.producer, prod + k);
  }

  void reclaim_tx() {
    uint32_t cons = *comp_.consumer, n = comp_.load(comp_.producer) - cons;
    for (uint32_t i = 0; i < n; i++) free_tx_.push_back(comp_.addr(cons + i));
    if (n) comp_.store(comp_.consumer, cons + n);
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
    uint16_t c = csum16(ip, 20);
    ip[10] = uint8_t(c >> 8), ip[11] = uint8_t(c);
    uint8_t *u = ip + 20;
    uint16_t ul = static_cast<uint16_t>(8 + len);
    const uint8_t uh[8] = {uint8_t(sport >> 8), uint8_t(sport), uint8_t(dst.port >> 8),
                           uint8_t(dst.port), uint8_t(ul >> 8), uint8_t(ul), 0, 0};   // no UDP checksum (IPv4)
    memcpy(u, uh, 8);
  }

  // The peer's MAC from the kernel's neighbour table (/proc/net/arp),
  // cached once complete.
  bool neighbour(uint32_t ip, uint8_t mac[6]) {
    auto it = macs_.find(ip);
    if (it != macs_.end()) {
      memcpy(mac, it->second.data(), 6);
      return true;
    }
    std::ifstream arp("/proc/net/arp");
    std::string line;
    std::getline(arp, line);
    while (std::getline(arp, line)) {
      std::istringstream ls(line);
      std::string addr, hw, flags, m;
      ls >> addr >> hw >> flags >> m;
      in_addr a{};
      if (inet_pton(AF_INET, addr.c_str(), &a) != 1 || ntohl(a.s_addr) != ip) continue;
      if (std::stoul(flags, nullptr, 16) & 0x2 /* ATF_COM */ && parse_mac(m, mac)) {
        std::array<uint8_t, 6> v;
        memcpy(v.data(), mac, 6);
        macs_[ip] = v;
        return true;
      }
    }
    return false;
  }
  // One datagram through the kernel makes it resolve the neighbour (to the
  // discard port, not to usrc's: the peer's XDP program would take it).
  void probe(uint32_t ip) {
    uint64_t now = static_cast<uint64_t>(time(nullptr));
    if (probed_[ip] == now) return;
    probed_[ip] = now;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(ip);
    to.sin_port = htons(9);
    sendto(sock_, "", 0, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to), sizeof to);
  }

  Endpoint local_;
  unsigned ifindex_ = 0;
  uint8_t src_mac_[6] = {};
  int sock_ = -1, xsk_ = -1, map_ = -1, prog_ = -1;
  bool attached_ = false;
  uint32_t xdp_flags_ = 0, held_ = 0;
  void *umem_ = MAP_FAILED;
  Ring fill_, comp_, rx_, tx_;
  std::vector<uint64_t> rx_frames_, free_tx_;
  std::unordered_map<uint32_t, std::array<uint8_t, 6>> macs_;
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
