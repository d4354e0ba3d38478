// The netdev behind the port: its link state and addresses, watched over
// rtnetlink (net/rtnl.h), raise the port's async events.
#include <libmnl/libmnl.h>
#include <linux/rtnetlink.h>
#include <net/if.h>

#include <optional>

#include "usrc/common/log.h"
#include "usrc/usrc.h"

namespace usrc {

namespace {

// A link message about ifindex: whether it is up and running.
std::optional<bool> link_running(const nlmsghdr *h, unsigned ifindex) {
  if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) return std::nullopt;
  if (mnl_nlmsg_get_payload_len(h) < sizeof(ifinfomsg)) return std::nullopt;
  auto *ifi = static_cast<const ifinfomsg *>(mnl_nlmsg_get_payload(h));
  if (unsigned(ifi->ifi_index) != ifindex) return std::nullopt;
  return h->nlmsg_type == RTM_NEWLINK && (ifi->ifi_flags & IFF_UP) && (ifi->ifi_flags & IFF_RUNNING);
}

// An address message about ifindex.
bool address_changed(const nlmsghdr *h, unsigned ifindex) {
  if (h->nlmsg_type != RTM_NEWADDR && h->nlmsg_type != RTM_DELADDR) return false;
  if (mnl_nlmsg_get_payload_len(h) < sizeof(ifaddrmsg)) return false;
  return static_cast<const ifaddrmsg *>(mnl_nlmsg_get_payload(h))->ifa_index == ifindex;
}

}  // namespace

void Context::watch_netdev() {
  // Port events follow the netdev (IBV_EVENT_PORT_ACTIVE / PORT_ERR on link
  // changes, IBV_EVENT_GID_CHANGE on address changes): watch rtnetlink,
  // after asking for the link's state now. (Up when it cannot be asked.)
  ifindex_ = if_nametoindex(cfg_.netdev.c_str());
  port_up_ = true;
  if (!nl_.open(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)) return;
  nl_fd_ = nl_.fd();
  ifinfomsg ifi{};
  ifi.ifi_index = int(ifindex_);
  if (ifindex_ && nl_.request(RTM_GETLINK, 0, &ifi, sizeof ifi))
    nl_.read([this](const nlmsghdr *h) {
      if (auto up = link_running(h, ifindex_)) port_up_ = *up;
    });
}

// Reads rtnetlink notifications; raises the port's async events.
void Context::netdev_events() {
  auto each = [this](const nlmsghdr *h) {
    if (auto up = link_running(h, ifindex_)) {
      if (*up != port_up_.exchange(*up)) {
        log().info("{}: port {}", cfg_.name, *up ? "ACTIVE" : "DOWN");
        async_event(nullptr, reinterpret_cast<void *>(1), *up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
      }
    } else if (address_changed(h, ifindex_)) {
      async_event(nullptr, reinterpret_cast<void *>(1), IBV_EVENT_GID_CHANGE);
    }
  };
  // Notifications lost to an overflow: ask for the link again, and say the
  // addresses may have changed (a few times at most under a storm).
  for (int i = 0; i < 4 && !nl_.read(each); i++) {
    async_event(nullptr, reinterpret_cast<void *>(1), IBV_EVENT_GID_CHANGE);
    ifinfomsg ifi{};
    ifi.ifi_index = int(ifindex_);
    if (!ifindex_ || !nl_.request(RTM_GETLINK, 0, &ifi, sizeof ifi)) break;
  }
}

}  // namespace usrc
