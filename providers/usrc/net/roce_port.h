// The RoCE v2 port (IBA A17.2.1: UDP destination port 4791) shared by every
// usrc context on one address (docs/design.md "Addressing"). Each context's
// socket joins one SO_REUSEPORT group on ip:4791; a classic BPF program
// attached to the group steers each datagram by the process slot in its
// destination QPN (QPN = slot << 12 | index) to that slot's socket. The
// group's socket indices are kept in a registry file, in join order, the
// kernel's own order; a context that leaves moves the last entry into its
// hole, as the kernel moves the last socket. A context that died without
// leaving is found by its lock and treated alike when the next one joins.
// The mapping can still be stale for a moment (or wrong after several
// died at once): a context that receives a datagram for another slot
// forwards it to that slot's private port (base + slot), behind a
// ForwardHdr that keeps the sender's endpoint, and counts it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "usrc/net/nic.h"

namespace usrc::net {

constexpr uint16_t kRoceV2Port = 4791;

// What a forwarder puts before a datagram it hands on. The receiver trusts
// it only from its own address and the RoCE port (a socket of the group:
// the kernel lets only the group's user join it).
struct ForwardHdr {
  static constexpr uint32_t kMagic = 0x55465731;   // "UFW1"
  uint32_t magic;
  uint32_t src_ip;      // the original sender, host byte order
  uint16_t src_port;
  uint16_t dst_port;    // where it arrived (the ICRC covers it)

  // The header at the start of a forwarded datagram of n bytes; false if
  // there is none (too short, or another magic).
  static bool read(const uint8_t *p, size_t n, ForwardHdr &h) {
    if (n < sizeof h) return false;
    std::memcpy(&h, p, sizeof h);
    return h.magic == kMagic;
  }
};

// The classic BPF program: steers by slot to the index listed for it (QP1's
// slot 0 to the host's GSI owner, cm/host.cpp, once it has joined); any
// other slot falls back to the kernel's hash.
// slots[i] is the slot of the group's socket i. At most kMaxSteered.
constexpr size_t kMaxSteered = 2000;
struct BpfInsn {
  uint16_t code;
  uint8_t jt, jf;
  uint32_t k;
};
std::vector<BpfInsn> steering_program(const std::vector<uint16_t> &slots);

class RocePort {
 public:
  // Joins the group on ip:port for `slot`; registry: the directory that
  // holds the group's index file (made if missing). -1 from fd() if the
  // port cannot be had (taken by another user or without SO_REUSEPORT):
  // *err says why.
  RocePort(uint32_t ip, uint16_t port, uint16_t slot, const std::string &registry,
           uint32_t sock_buf, std::string *err);
  ~RocePort();
  RocePort(const RocePort &) = delete;
  RocePort &operator=(const RocePort &) = delete;
  int fd() const { return fd_; }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1, lock_fd_ = -1, slot_lock_ = -1;
  uint16_t port_, slot_;
  std::string dir_;
  bool update(bool join);   // under the registry lock
};

}  // namespace usrc::net
