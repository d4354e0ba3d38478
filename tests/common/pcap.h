// The IPv4/UDP datagrams of a capture for tests, read through libpcap (so
// pcap and pcapng, either byte order, any timestamp precision), whatever
// its link type among Ethernet (with or without 802.1Q tags), Linux cooked
// (SLL, SLL2), raw IP and BSD loopback; and a writer of Ethernet captures.
#pragma once

#include <pcap/pcap.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace usrc::test {

// Link types as libpcap reports them (DLT_*; a file's LINKTYPE_RAW reads as DLT_RAW).
enum : uint32_t {
  kLinkNull = DLT_NULL, kLinkEthernet = DLT_EN10MB, kLinkRaw = DLT_RAW,
  kLinkLinuxSll = DLT_LINUX_SLL, kLinkIpv4 = DLT_IPV4, kLinkLinuxSll2 = DLT_LINUX_SLL2,
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
  bool ok = false;                   // a capture libpcap reads
  std::string error;                 // libpcap's reason when not
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

using PcapHandle = std::unique_ptr<pcap_t, decltype(&pcap_close)>;

inline PcapFile read_pcap_file(const std::string &path) {
  PcapFile out;
  char errbuf[PCAP_ERRBUF_SIZE] = "";
  PcapHandle p(pcap_open_offline(path.c_str(), errbuf), &pcap_close);
  if (!p) {
    out.error = errbuf;
    return out;
  }
  out.link_type = static_cast<uint32_t>(pcap_datalink(p.get()));
  const bool swapped = pcap_is_swapped(p.get()) == 1;
  out.ok = true;
  pcap_pkthdr *h;
  const u_char *f;
  // (A truncated last record ends the walk as an error: what came before stays.)
  while (pcap_next_ex(p.get(), &h, &f) == 1) {
    out.records++;
    const size_t incl = h->caplen;
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

// Every IPv4/UDP datagram of a capture.
inline std::vector<UdpFrame> read_pcap(const std::string &path) { return read_pcap_file(path).udp; }

// Writes UDP payloads as Ethernet/IPv4/UDP frames (the frames' IP ID and DF,
// TTL 64, valid IP header checksum, UDP checksum 0 as RoCE v2 allows).
// False when the file cannot be written.
inline bool write_pcap(const std::string &path, const std::vector<UdpFrame> &frames) {
  PcapHandle p(pcap_open_dead(DLT_EN10MB, 65535), &pcap_close);
  if (!p) return false;
  std::unique_ptr<pcap_dumper_t, decltype(&pcap_dump_close)> d(pcap_dump_open(p.get(), path.c_str()),
                                                                 &pcap_dump_close);
  if (!d) return false;
  long t = 0;
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
    pcap_pkthdr h{};
    h.ts.tv_sec = t++;
    h.caplen = h.len = static_cast<bpf_u_int32>(e.size());
    pcap_dump(reinterpret_cast<u_char *>(d.get()), &h, e.data());
  }
  return pcap_dump_flush(d.get()) == 0;
}

}  // namespace usrc::test
