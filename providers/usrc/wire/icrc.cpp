#include "usrc/wire/icrc.h"

#include <zlib.h>

#include <cstring>

#include "usrc/wire/packet.h"

namespace usrc::wire {

uint32_t icrc_ipv4(const Ipv4Pseudo &ip, const iovec *iov, size_t iovcnt) {
  size_t udp_payload = kIcrcLen;
  for (size_t i = 0; i < iovcnt; i++) udp_payload += iov[i].iov_len;
  const size_t udp_len = 8 + udp_payload, ip_len = 20 + udp_len;

  uint8_t pre[8 + 20 + 8 + kBthLen];
  std::memset(pre, 0xff, 8);
  uint8_t *h = pre + 8;                        // IPv4 header
  h[0] = 0x45;
  h[1] = 0xff;                                 // TOS: variant
  h[2] = uint8_t(ip_len >> 8); h[3] = uint8_t(ip_len);
  h[4] = uint8_t(ip.ip_id >> 8); h[5] = uint8_t(ip.ip_id);
  h[6] = ip.dont_fragment ? 0x40 : 0; h[7] = 0;
  h[8] = 0xff;                                 // TTL: variant
  h[9] = 17;                                   // UDP
  h[10] = h[11] = 0xff;                        // header checksum: variant
  for (int i = 0; i < 4; i++) {
    h[12 + i] = uint8_t(ip.src_ip >> (24 - 8 * i));
    h[16 + i] = uint8_t(ip.dst_ip >> (24 - 8 * i));
  }
  uint8_t *u = h + 20;                         // UDP header
  u[0] = uint8_t(ip.src_port >> 8); u[1] = uint8_t(ip.src_port);
  u[2] = uint8_t(ip.dst_port >> 8); u[3] = uint8_t(ip.dst_port);
  u[4] = uint8_t(udp_len >> 8); u[5] = uint8_t(udp_len);
  u[6] = u[7] = 0xff;                          // checksum: variant
  uint8_t *b = u + 8;                          // BTH, resv8a variant
  std::memcpy(b, iov[0].iov_base, kBthLen);
  b[4] = 0xff;

  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, pre, sizeof pre);
  const auto *first = static_cast<const Bytef *>(iov[0].iov_base);
  crc = crc32(crc, first + kBthLen, static_cast<uInt>(iov[0].iov_len - kBthLen));
  for (size_t i = 1; i < iovcnt; i++)
    crc = crc32(crc, static_cast<const Bytef *>(iov[i].iov_base), static_cast<uInt>(iov[i].iov_len));
  return static_cast<uint32_t>(crc);
}

}  // namespace usrc::wire
