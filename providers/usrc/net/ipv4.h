// IPv4 helpers shared by the backends (udp, ofi, xdp) and the tracer.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>

#include "usrc/net/nic.h"

namespace usrc::net {

// An endpoint as the sockets API takes it (network byte order).
inline sockaddr_in to_sockaddr(Endpoint e) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(e.ip);
  a.sin_port = htons(e.port);
  return a;
}

// The header checksum of an IPv4 header of n bytes (a multiple of 4: 20
// without options) whose checksum field is zero: the one's complement of
// the one's complement sum of its 16-bit words (RFC 791, RFC 1071), to be
// stored big-endian at offset 10.
inline uint16_t ipv4_header_checksum(const uint8_t *h, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < n; i += 2) sum += uint32_t(h[i] << 8 | h[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(~sum);
}

}  // namespace usrc::net
