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

namespace {

constexpr uint32_t kPoly = 0xedb88320;   // CRC-32, reflected

// a * b mod P, polynomials in the reflected order (bit 31 is x^0).
uint32_t mult_mod(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m; m >>= 1) {
    if (a & m) p ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8n) mod P: what n zero bytes do to a CRC register.
uint32_t x8n_mod(size_t n) {
  uint32_t p = 1u << 31, sq = 1u << 23;   // x^0; x^8
  for (; n; n >>= 1) {
    if (n & 1) p = mult_mod(p, sq);
    sq = mult_mod(sq, sq);
  }
  return p;
}

// The CRC register (initial 0, no final XOR) after the two ID bytes.
uint32_t raw_crc16(uint16_t id) {
  uint32_t c = 0;
  for (uint8_t byte : {uint8_t(id >> 8), uint8_t(id)}) {
    c ^= byte;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
  }
  return c;
}

}  // namespace

bool solve_ip_id(uint32_t icrc0, uint32_t icrc, size_t udp_payload, uint16_t *id) {
  if (udp_payload < kIcrcLen) return false;
  // The ID is bytes 12-13 of the CRC's input (8 x 0xFF, then the IPv4
  // header's ID at 4); the rest of the input follows it: the IPv4 header
  // from 6, the UDP header, the payload without the ICRC.
  const size_t after = (kIpv4Len - 6) + kUdpLen + (udp_payload - kIcrcLen);
  // The system depends on the length alone, and a stream's packets are
  // mostly of one length: the last one's elimination is kept.
  struct Basis {
    size_t after = SIZE_MAX;
    // basis[b] has its highest set bit b and is the effect of the ID bits
    // in comb[b] (Gaussian elimination over GF(2)).
    uint32_t basis[32], comb[32];
  };
  static thread_local Basis m;
  if (m.after != after) {
    const uint32_t shift = x8n_mod(after);
    m.after = after;
    std::memset(m.basis, 0, sizeof m.basis);
    for (int bit = 0; bit < 16; bit++) {
      uint32_t v = mult_mod(raw_crc16(uint16_t(1u << bit)), shift), c = 1u << bit;
      for (int b = 31; b >= 0 && v; b--) {
        if (!(v >> b & 1)) continue;
        if (!m.basis[b]) {
          m.basis[b] = v, m.comb[b] = c;
          break;
        }
        v ^= m.basis[b], c ^= m.comb[b];
      }
    }
  }
  const uint32_t *basis = m.basis, *comb = m.comb;
  uint32_t d = icrc ^ icrc0, x = 0;
  for (int b = 31; b >= 0 && d; b--) {
    if (!(d >> b & 1)) continue;
    if (!basis[b]) return false;
    d ^= basis[b], x ^= comb[b];
  }
  *id = uint16_t(x);
  return true;
}

}  // namespace usrc::wire
