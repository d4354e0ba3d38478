#include "usrc/wire/icrc.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

namespace usrc::wire {

namespace {

constexpr size_t kIpv4Len = 20, kUdpLen = 8;

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) by ISA-L's
// carry-less multiply folding: fast at every length, which matters because
// every ACK and the 48-byte masked prefix of every packet are short pieces.
// Takes and returns the finished CRC, so calls chain.
uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) { return crc32_gzip_refl(crc, p, n); }

}  // namespace

uint32_t icrc_ipv4(const Ipv4Pseudo &ip, const iovec *iov, size_t iovcnt) {
  size_t udp_payload = kIcrcLen;
  for (size_t i = 0; i < iovcnt; i++) udp_payload += iov[i].iov_len;
  const size_t udp_len = kUdpLen + udp_payload, ip_len = kIpv4Len + udp_len;

  // The masked prefix: 8 x 0xFF, IPv4 header, UDP header, BTH.
  uint8_t pre[8 + kIpv4Len + kUdpLen + kBthLen];
  std::memset(pre, 0xff, 8);
  uint8_t *h = pre + 8;                        // IPv4 header
  h[0] = 0x45;                                 // version 4, IHL 5
  h[1] = 0xff;                                 // TOS (DSCP/ECN): variant
  h[2] = uint8_t(ip_len >> 8); h[3] = uint8_t(ip_len);
  h[4] = uint8_t(ip.ip_id >> 8); h[5] = uint8_t(ip.ip_id);
  h[6] = ip.dont_fragment ? 0x40 : 0; h[7] = 0;
  h[8] = 0xff;                                 // TTL: variant
  h[9] = 17;                                   // protocol UDP
  h[10] = h[11] = 0xff;                        // header checksum: variant
  for (int i = 0; i < 4; i++) {
    h[12 + i] = uint8_t(ip.src_ip >> (24 - 8 * i));
    h[16 + i] = uint8_t(ip.dst_ip >> (24 - 8 * i));
  }
  uint8_t *u = h + kIpv4Len;                   // UDP header
  u[0] = uint8_t(ip.src_port >> 8); u[1] = uint8_t(ip.src_port);
  u[2] = uint8_t(ip.dst_port >> 8); u[3] = uint8_t(ip.dst_port);
  u[4] = uint8_t(udp_len >> 8); u[5] = uint8_t(udp_len);
  u[6] = u[7] = 0xff;                          // UDP checksum: variant

  // The BTH, gathered (usually all of it from iov[0]); then resv8a masked.
  uint8_t *b = u + kUdpLen;
  size_t got = 0, i = 0, skip = 0;   // skip: BTH bytes taken from iov[i]
  for (; i < iovcnt && got < kBthLen; i++) {
    skip = std::min(kBthLen - got, iov[i].iov_len);
    std::memcpy(b + got, iov[i].iov_base, skip);
    got += skip;
  }
  std::memset(b + got, 0, kBthLen - got);      // a runt: CRC it anyway, it is only wrong
  b[4] = 0xff;                                 // BTH resv8a: variant

  uint32_t crc = crc_update(0, pre, sizeof pre);
  if (i > 0) {   // the rest of the buffer the BTH ended in
    const iovec &last = iov[i - 1];
    crc = crc_update(crc, static_cast<const uint8_t *>(last.iov_base) + skip, last.iov_len - skip);
  }
  for (; i < iovcnt; i++)
    crc = crc_update(crc, static_cast<const uint8_t *>(iov[i].iov_base), iov[i].iov_len);
  return crc;
}

ParseError check_icrc_ipv4(const Ipv4Pseudo &ip, const uint8_t *buf, size_t len) {
  if (len < kBthLen + kIcrcLen) return ParseError::too_short;
  const uint8_t *ic = buf + len - kIcrcLen;
  const uint32_t wire =
      uint32_t(ic[0]) | uint32_t(ic[1]) << 8 | uint32_t(ic[2]) << 16 | uint32_t(ic[3]) << 24;
  iovec iov{const_cast<uint8_t *>(buf), len - kIcrcLen};
  return icrc_ipv4(ip, &iov, 1) == wire ? ParseError::ok : ParseError::bad_icrc;
}

}  // namespace usrc::wire
