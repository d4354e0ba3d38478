// A minimal reader and writer of classic pcap files (not pcapng) for tests:
// the IPv4/UDP datagrams of a capture, whatever its link type among
// Ethernet (with or without 802.1Q tags), Linux cooked (SLL, SLL2), raw IP
// and BSD loopback. Either byte order, micro- or nanosecond timestamps.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace usrc::test {

// pcap link types (LINKTYPE_* of tcpdump.org/linktypes.html).
enum : uint32_t {
  kLinkNull = 0, kLinkEthernet = 1, kLinkRaw = 101, kLinkLinuxSll = 113, kLinkIpv4 = 228,
  kLinkLinuxSll2 = 276,
};

struct UdpFrame {
  uint32_t src_ip = 0, dst_ip = 0;   // host order
  uint16_t src_port = 0, dst_port = 0;
  uint16_t ip_id = 0;
  bool df = true;
  std::vector<uint8_t> payload;      // the UDP payload
  size_t frame_no = 0;               // 1-based record number in the file, as tshark counts
  size_t ip_hdr_len = 20;            // > 20: IPv4 options present
};

struct PcapFile {
  bool ok = false;                   // a pcap file we understand
  uint32_t link_type = 0;
  size_t records = 0;
  std::vector<UdpFrame> udp;         // its unfragmented IPv4/UDP datagrams
};

inline uint16_t be16(const uint8_t *p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t be32(const uint8_t *p) { return uint32_t(be16(p)) << 16 | be16(p + 2); }

// Where the IPv4 header starts in a frame of this link type, or nullptr.
inline const uint8_t *pcap_ipv4(uint32_t link, bool swapped, const uint8_t *f, size_t n) {
  switch (link) {
    case kLinkEthernet: {
      size_t off = 12;
      while (off + 2 <= n && (be16(f + off) == 0x8100 || be16(f + off) == 0x88a8)) off += 4;
      if (off + 2 > n || be16(f + off) != 0x0800) return nullptr;
      return f + off + 2;
    }
    case kLinkLinuxSll: return n >= 16 && be16(f + 14) == 0x0800 ? f + 16 : nullptr;
    case kLinkLinuxSll2: return n >= 20 && be16(f) == 0x0800 ? f + 20 : nullptr;
    case kLinkRaw:
    case kLinkIpv4: return n >= 1 && (f[0] >> 4) == 4 ? f : nullptr;
    case kLinkNull: {   // 4-byte address family in the writer's byte order
      if (n < 4) return nullptr;
      uint32_t fam;
      std::memcpy(&fam, f, 4);
      if (swapped) fam = __builtin_bswap32(fam);
      return fam == 2 ? f + 4 : nullptr;   // AF_INET
    }
  }
  return nullptr;
}

inline PcapFile read_pcap_file(const std::string &path) {
  PcapFile out;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(in)), {});
  if (d.size() < 24) return out;
  uint32_t magic;
  std::memcpy(&magic, d.data(), 4);
  bool swapped;
  if (magic == 0xa1b2c3d4 || magic == 0xa1b23c4d) swapped = false;
  else if (magic == 0xd4c3b2a1 || magic == 0x4d3cb2a1) swapped = true;
  else return out;
  auto u32 = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, d.data() + off, 4);
    return swapped ? __builtin_bswap32(v) : v;
  };
  out.link_type = u32(20) & 0x0fffffff;   // the top bits may carry FCS info
  out.ok = true;
  size_t off = 24;
  while (off + 16 <= d.size()) {
    const uint32_t incl = u32(off + 8);
    off += 16;
    if (incl > d.size() - off) break;   // a truncated last record
    const uint8_t *f = d.data() + off;
    off += incl;
    out.records++;
    const uint8_t *ip = pcap_ipv4(out.link_type, swapped, f, incl);
    if (!ip) continue;
    const size_t avail = incl - size_t(ip - f);
    if (avail < 20 || (ip[0] >> 4) != 4 || ip[9] != 17) continue;
    const size_t ihl = size_t(ip[0] & 0xf) * 4;
    if (ihl < 20 || be16(ip + 6) & 0x3fff) continue;   // bad IHL, or a fragment
    if (avail < ihl + 8) continue;
    const uint8_t *udp = ip + ihl;
    const size_t ulen = be16(udp + 4);
    if (ulen < 8 || ihl + ulen > avail) continue;   // snapped short
    UdpFrame u;
    u.src_ip = be32(ip + 12);
    u.dst_ip = be32(ip + 16);
    u.src_port = be16(udp);
    u.dst_port = be16(udp + 2);
    u.ip_id = be16(ip + 4);
    u.df = (ip[6] & 0x40) != 0;
    u.payload.assign(udp + 8, udp + ulen);
    u.frame_no = out.records;
    u.ip_hdr_len = ihl;
    out.udp.push_back(std::move(u));
  }
  return out;
}

// Every IPv4/UDP datagram of a pcap file.
inline std::vector<UdpFrame> read_pcap(const std::string &path) { return read_pcap_file(path).udp; }

// Writes UDP payloads as Ethernet/IPv4/UDP frames (the frames' IP ID and DF,
// TTL 64, valid IP header checksum, UDP checksum 0 as RoCE v2 allows).
inline void write_pcap(const std::string &path, const std::vector<UdpFrame> &frames) {
  std::ofstream f(path, std::ios::binary);
  const uint32_t hdr[6] = {0xa1b2c3d4, 0x00040002, 0, 0, 65535, kLinkEthernet};
  f.write(reinterpret_cast<const char *>(hdr), sizeof hdr);
  uint32_t t = 0;
  for (const UdpFrame &u : frames) {
    std::vector<uint8_t> e(14 + 20 + 8);
    e[0] = 0x02; e[6] = 0x02; e[11] = 1;   // locally administered MACs
    e[12] = 0x08;
    uint8_t *ip = e.data() + 14;
    const size_t iplen = 20 + 8 + u.payload.size();
    ip[0] = 0x45;
    ip[2] = uint8_t(iplen >> 8); ip[3] = uint8_t(iplen);
    ip[4] = uint8_t(u.ip_id >> 8); ip[5] = uint8_t(u.ip_id);
    ip[6] = u.df ? 0x40 : 0;
    ip[8] = 64; ip[9] = 17;
    for (int i = 0; i < 4; i++) {
      ip[12 + i] = uint8_t(u.src_ip >> (24 - 8 * i));
      ip[16 + i] = uint8_t(u.dst_ip >> (24 - 8 * i));
    }
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += uint32_t(ip[i] << 8 | ip[i + 1]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    ip[10] = uint8_t(~sum >> 8); ip[11] = uint8_t(~sum);
    uint8_t *udp = ip + 20;
    udp[0] = uint8_t(u.src_port >> 8); udp[1] = uint8_t(u.src_port);
    udp[2] = uint8_t(u.dst_port >> 8); udp[3] = uint8_t(u.dst_port);
    udp[4] = uint8_t((8 + u.payload.size()) >> 8); udp[5] = uint8_t(8 + u.payload.size());
    e.insert(e.end(), u.payload.begin(), u.payload.end());
    const uint32_t rec[4] = {t++, 0, uint32_t(e.size()), uint32_t(e.size())};
    f.write(reinterpret_cast<const char *>(rec), sizeof rec);
    f.write(reinterpret_cast<const char *>(e.data()), std::streamsize(e.size()));
  }
}

}  // namespace usrc::test
