// The RoCE v2 invariant CRC (IBA annex A17.3.3): CRC-32 over a pseudo
// header of eight 0xFF bytes, the IPv4 header with its variant fields (TOS,
// TTL, header checksum) set to ones, the UDP header with its checksum set
// to ones, then the BTH with its resv8a byte set to ones and the rest of
// the packet up to the ICRC. Appended little-endian.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace usrc::wire {

struct Ipv4Pseudo {
  uint32_t src_ip, dst_ip;      // host byte order
  uint16_t src_port, dst_port;
  uint16_t ip_id = 0;           // an unconnected DF socket sends 0
  bool dont_fragment = true;
};

// iov: the UDP payload without the ICRC; iov[0] holds at least the BTH.
uint32_t icrc_ipv4(const Ipv4Pseudo &ip, const iovec *iov, size_t iovcnt);

inline void store_icrc(uint8_t *dst, uint32_t icrc) {
  dst[0] = uint8_t(icrc);
  dst[1] = uint8_t(icrc >> 8);
  dst[2] = uint8_t(icrc >> 16);
  dst[3] = uint8_t(icrc >> 24);
}

}  // namespace usrc::wire
