// rtnetlink through libmnl: one socket that hears some of the kernel's
// multicast groups (link, address, neighbour changes) and carries requests
// (RTM_GETLINK, RTM_GETNEIGH dumps), read without ever blocking. The
// kernel answers a request within the send, so a read right after it finds
// the answer (or the first part of a dump).
#pragma once

#include <linux/netlink.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

struct mnl_socket;

namespace usrc::net {

class Rtnl {
 public:
  Rtnl() = default;
  Rtnl(const Rtnl &) = delete;
  Rtnl &operator=(const Rtnl &) = delete;
  ~Rtnl();

  // A NETLINK_ROUTE socket hearing `groups` (RTMGRP_*; 0: requests only).
  // False, errno set, when it cannot be had.
  bool open(unsigned groups);
  int fd() const;   // -1 when not open

  // Sends request `type` (RTM_GET*) with `flags` beside NLM_F_REQUEST and
  // the family header `hdr` (ifinfomsg, ndmsg, ...).
  bool request(uint16_t type, uint16_t flags, const void *hdr, size_t len);

  // Hands each message that has arrived to each(); returns when none is
  // left. False when the kernel dropped some since the last read (its
  // buffer overflowed): the caller asks for the state again.
  bool read(const std::function<void(const nlmsghdr *)> &each);

 private:
  // Room for the largest datagram rtnetlink sends (a dump's part grows to
  // the reader's buffer; a link message with many VFs passes 4 KB).
  static constexpr size_t kBuffer = 32768;
  mnl_socket *nl_ = nullptr;
  uint32_t seq_ = 0;
  std::vector<char> buf_;
};

}  // namespace usrc::net
