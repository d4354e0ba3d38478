// IPv4 helpers shared by the backends (udp, ofi, xdp) and the tracer.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

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

// Sets a datagram socket's receive and send buffers to `bytes`: past
// net.core.rmem_max and wmem_max where the process may (SO_RCVBUFFORCE,
// CAP_NET_ADMIN), up to them elsewhere. A burst of a send window must fit
// the receive buffer: a small one drops it, and a drop costs a timeout.
// Returns the receive buffer granted (the kernel doubles what is asked,
// for its bookkeeping; 0: unknown).
inline uint32_t size_socket_buffers(int fd, uint32_t bytes) {
  const int b = static_cast<int>(bytes);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof b) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof b) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
  int got = 0;
  socklen_t len = sizeof got;
  return getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &got, &len) == 0 && got > 0 ? uint32_t(got) : 0;
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
