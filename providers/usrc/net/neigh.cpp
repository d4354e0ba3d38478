#include "usrc/net/neigh.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <time.h>

#include <cstring>

namespace usrc::net {

namespace {

uint64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

}  // namespace

bool Neighbours::open(unsigned ifindex) {
  ifindex_ = ifindex;
  if (!nl_.open(RTMGRP_NEIGH)) return false;
  dump();
  return true;
}

void Neighbours::dump() {
  ndmsg q{};
  q.ndm_family = AF_INET;
  nl_.request(RTM_GETNEIGH, NLM_F_DUMP, &q, sizeof q);
}

// Applies the notifications and dump answers that have arrived.
void Neighbours::update() {
  auto each = [this](const nlmsghdr *h) {
    if (h->nlmsg_type != RTM_NEWNEIGH && h->nlmsg_type != RTM_DELNEIGH) return;
    if (mnl_nlmsg_get_payload_len(h) < sizeof(ndmsg)) return;
    auto *nd = static_cast<const ndmsg *>(mnl_nlmsg_get_payload(h));
    if (nd->ndm_family != AF_INET || unsigned(nd->ndm_ifindex) != ifindex_) return;
    const nlattr *at[NDA_MAX + 1] = {};
    mnl_attr_parse(h, sizeof(ndmsg), [](const nlattr *a, void *p) {
      if (mnl_attr_type_valid(a, NDA_MAX) > 0) static_cast<const nlattr **>(p)[mnl_attr_get_type(a)] = a;
      return int(MNL_CB_OK);
    }, at);
    const nlattr *dst = at[NDA_DST], *lladdr = at[NDA_LLADDR];
    if (lladdr && mnl_attr_get_payload_len(lladdr) != 6) lladdr = nullptr;
    if (dst && mnl_attr_get_payload_len(dst) != 4) dst = nullptr;
    if (!dst) return;
    uint32_t ip;
    memcpy(&ip, mnl_attr_get_payload(dst), 4);
    ip = ntohl(ip);
    // Complete entries only (as /proc/net/arp's ATF_COM): reachable, stale
    // (still the kernel's best), being confirmed, or static.
    constexpr uint16_t kComplete =
        NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;
    if (h->nlmsg_type == RTM_NEWNEIGH && lladdr && (nd->ndm_state & kComplete)) {
      std::array<uint8_t, 6> mac;
      memcpy(mac.data(), mnl_attr_get_payload(lladdr), 6);
      macs_[ip] = mac;
    } else {
      macs_.erase(ip);   // gone, failed, or being resolved again
    }
  };
  // Lost notifications: the table again, from scratch (twice at most
  // here: the datapath waits for this).
  for (int i = 0; i < 2 && !nl_.read(each); i++) {
    macs_.clear();
    dump();
  }
}

bool Neighbours::find(uint32_t ip, uint8_t mac[6]) {
  const uint64_t now = coarse_now_ns();
  auto it = macs_.find(ip);
  if (it == macs_.end() || now >= next_read_ns_) {
    update();
    next_read_ns_ = now + 1'000'000;
    it = macs_.find(ip);
    if (it == macs_.end()) return false;
  }
  memcpy(mac, it->second.data(), 6);
  return true;
}

}  // namespace usrc::net
