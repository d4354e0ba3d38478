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
  be::put16(h + 2, uint16_t(ip_len));
  be::put16(h + 4, ip.ip_id);
  h[6] = ip.dont_fragment ? 0x40 : 0; h[7] = 0;
  h[8] = 0xff;                                 // TTL: variant
  h[9] = 17;                                   // protocol UDP
  h[10] = h[11] = 0xff;                        // header checksum: variant
  be::put32(h + 12, ip.src_ip);
  be::put32(h + 16, ip.dst_ip);
  uint8_t *u = h + kIpv4Len;                   // UDP header
  be::put16(u, ip.src_port);
  be::put16(u + 2, ip.dst_port);
  be::put16(u + 4, uint16_t(udp_len));
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
  b[4] = 0xff;                                 // BTH resv8a (F, B, resv6): variant

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
  if (len < kMinPacketLen) return ParseError::too_short;
  iovec iov{const_cast<uint8_t *>(buf), len - kIcrcLen};
  return icrc_ipv4(ip, &iov, 1) == icrc::get(buf + len - kIcrcLen) ? ParseError::ok : ParseError::bad_icrc;
}

}  // namespace usrc::wire
