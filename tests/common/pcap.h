// A minimal pcap (libpcap classic format) reader and writer for tests:
// Ethernet + IPv4 + UDP frames.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace usrc::test {

struct UdpFrame {
  uint32_t src_ip, dst_ip;     // host order
  uint16_t src_port, dst_port;
  uint16_t ip_id;
  bool df;
  std::vector<uint8_t> payload;  // the UDP payload
};

inline uint16_t be16(const uint8_t *p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t be32(const uint8_t *p) { return uint32_t(be16(p)) << 16 | be16(p + 2); }

// Reads every IPv4/UDP frame of an Ethernet pcap.
inline std::vector<UdpFrame> read_pcap(const std::string &path) {
  std::vector<UdpFrame> out;
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(f)), {});
  if (d.size() < 24) return out;
  uint32_t magic;
  std::memcpy(&magic, d.data(), 4);
  if (magic != 0xa1b2c3d4 && magic != 0xa1b23c4d) return out;   // little-endian files only
  size_t off = 24;
  while (off + 16 <= d.size()) {
    uint32_t incl;
    std::memcpy(&incl, d.data() + off + 8, 4);
    off += 16;
    if (off + incl > d.size()) break;
    const uint8_t *e = d.data() + off;
    off += incl;
    if (incl < 14 + 20 + 8 || be16(e + 12) != 0x0800) continue;
    const uint8_t *ip = e + 14;
    size_t ihl = (ip[0] & 0xf) * 4;
    if (ip[9] != 17 || incl < 14 + ihl + 8) continue;
    const uint8_t *udp = ip + ihl;
    size_t ulen = be16(udp + 4);
    if (ulen < 8 || 14 + ihl + ulen > incl) continue;
    UdpFrame u{be32(ip + 12), be32(ip + 16), be16(udp), be16(udp + 2), be16(ip + 4),
               (ip[6] & 0x40) != 0, std::vector<uint8_t>(udp + 8, udp + ulen)};
    out.push_back(std::move(u));
  }
  return out;
}

// Writes UDP payloads as Ethernet/IPv4/UDP frames (IP ID 0, DF).
inline void write_pcap(const std::string &path, const std::vector<UdpFrame> &frames) {
  std::ofstream f(path, std::ios::binary);
  uint32_t hdr[6] = {0xa1b2c3d4, 0x00040002, 0, 0, 65535, 1};
  f.write(reinterpret_cast<const char *>(hdr), sizeof hdr);
  uint32_t t = 0;
  for (const UdpFrame &u : frames) {
    std::vector<uint8_t> e(14 + 20 + 8);
    e[12] = 0x08;
    uint8_t *ip = e.data() + 14;
    size_t iplen = 20 + 8 + u.payload.size();
    ip[0] = 0x45;
    ip[2] = uint8_t(iplen >> 8); ip[3] = uint8_t(iplen);
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
    uint32_t rec[4] = {t++, 0, uint32_t(e.size()), uint32_t(e.size())};
    f.write(reinterpret_cast<const char *>(rec), sizeof rec);
    f.write(reinterpret_cast<const char *>(e.data()), e.size());
  }
}

}  // namespace usrc::test
