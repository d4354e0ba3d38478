// The RoCE v2 invariant CRC (IBA annex A17.3.3): CRC-32 over a pseudo
// header of eight 0xFF bytes, the IPv4 header with its variant fields (TOS,
// TTL, header checksum) set to ones, the UDP header with its checksum set
// to ones, then the BTH with its resv8a byte set to ones and the rest of
// the packet up to the ICRC. Appended little-endian.
//
// The IP identification, DF flag and total length are covered: a sender
// that wants to compute the ICRC before the kernel builds the IP header
// must send with IP ID 0 (an unconnected UDP socket with DF set does).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "usrc/wire/packet.h"

namespace usrc::wire {

// The IPv4 and UDP header fields the ICRC covers. The IPv4 header is the
// option-less 20 bytes, fragment offset 0; lengths come from the packet.
struct Ipv4Pseudo {
  uint32_t src_ip, dst_ip;      // host byte order
  uint16_t src_port, dst_port;
  uint16_t ip_id = 0;           // an unconnected DF socket sends 0
  bool dont_fragment = true;
};

// iov: the UDP payload without the ICRC, possibly gathered from several
// buffers (the BTH may even straddle them). Returns the ICRC; store it with
// store_icrc(). Copies only the 12-byte BTH, never the payload.
uint32_t icrc_ipv4(const Ipv4Pseudo &ip, const iovec *iov, size_t iovcnt);

inline void store_icrc(uint8_t *dst, uint32_t crc) { icrc::put(dst, crc); }

// buf/len: a whole UDP payload, ICRC included. ok if its trailing ICRC is
// right for `ip`, too_short if there is no BTH and ICRC, else bad_icrc.
ParseError check_icrc_ipv4(const Ipv4Pseudo &ip, const uint8_t *buf, size_t len);

// The IP ID a received packet's ICRC was computed with, which a UDP socket
// does not show (a GSO send gives segment i ID i; rxe and RoCE NICs count
// up). CRC-32 is affine over GF(2): the ICRC for ID x is the ICRC for ID 0
// plus a linear function of x's 16 bits, fixed by the packet's length. So
// `icrc` (the packet's, for ID 0 `icrc0`, both of a UDP payload of
// udp_payload bytes, ICRC included) is one of those 65536 values iff the 32
// equations in 16 unknowns have a solution: *id then. What is left to
// guard the packet is 16 of the CRC's 32 bits (and the UDP checksum, which
// the kernel verified if the sender set it).
bool solve_ip_id(uint32_t icrc0, uint32_t icrc, size_t udp_payload, uint16_t *id);

}  // namespace usrc::wire
