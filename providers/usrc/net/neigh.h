// The kernel's IPv4 neighbour table (ARP) for one netdev, as the AF_XDP
// backend needs it to address Ethernet frames: dumped once over rtnetlink
// (RTM_GETNEIGH), then kept by the neighbour notifications (RTMGRP_NEIGH),
// so an entry that changes or goes is changed or dropped here too. Nothing
// blocks: a lookup reads what the kernel has sent meanwhile, at once on a
// miss and at most every millisecond on a hit.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>

#include "usrc/net/rtnl.h"

namespace usrc::net {

class Neighbours {
 public:
  // False, errno set, when rtnetlink cannot be had.
  bool open(unsigned ifindex);
  // The MAC of ip (host order), if the kernel has it resolved.
  bool find(uint32_t ip, uint8_t mac[6]);

 private:
  void update();
  void dump();

  Rtnl nl_;
  unsigned ifindex_ = 0;
  uint64_t next_read_ns_ = 0;
  std::unordered_map<uint32_t, std::array<uint8_t, 6>> macs_;
};

}  // namespace usrc::net
