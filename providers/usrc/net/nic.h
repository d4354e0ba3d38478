// The narrow interface between the transport and a datagram NIC (design.md:
// "NIC backends"). A backend moves whole UDP payloads to and from IPv4
// endpoints, in batches; it knows nothing of the IBA.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace usrc::net {

struct Endpoint {
  uint32_t ip = 0;     // host byte order
  uint16_t port = 0;   // host byte order
  friend bool operator==(const Endpoint &, const Endpoint &) = default;
};

struct TxPacket {
  Endpoint dst;
  const iovec *iov;    // the UDP payload, in pieces
  size_t iovcnt;
};

struct RxPacket {
  Endpoint src;
  const uint8_t *data; // owned by the NIC; valid until the next recv()
  size_t len;
};

class Nic {
 public:
  virtual ~Nic() = default;
  virtual Endpoint local() const = 0;
  // A file descriptor that becomes readable when packets arrive (for the
  // progress thread's poll), or -1 if the backend has none.
  virtual int wait_fd() const = 0;
  // Sends as many packets as it can, in order; returns how many it sent.
  virtual size_t send(std::span<const TxPacket> pkts) = 0;
  // Non-blocking: fills up to out.size() packets, returns how many.
  virtual size_t recv(std::span<RxPacket> out) = 0;
};

}  // namespace usrc::net
