// The netdev behind the port: its link state and addresses, watched over
// rtnetlink, raise the port's async events.
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "usrc/common/log.h"
#include "usrc/usrc.h"

namespace usrc {

static bool netdev_running(const std::string &name) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return true;
  ifreq r{};
  std::strncpy(r.ifr_name, name.c_str(), IFNAMSIZ - 1);
  bool up = ioctl(s, SIOCGIFFLAGS, &r) != 0 || ((r.ifr_flags & IFF_UP) && (r.ifr_flags & IFF_RUNNING));
  ::close(s);
  return up;
}

void Context::watch_netdev() {
  // Port events follow the netdev (IBV_EVENT_PORT_ACTIVE / PORT_ERR on link
  // changes, IBV_EVENT_GID_CHANGE on address changes): watch rtnetlink.
  ifindex_ = if_nametoindex(cfg_.netdev.c_str());
  port_up_ = netdev_running(cfg_.netdev);
  nl_fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (nl_fd_ >= 0) {
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    if (bind(nl_fd_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) {
      ::close(nl_fd_);
      nl_fd_ = -1;
    }
  }
}

// Reads rtnetlink notifications; raises the port's async events.
void Context::netdev_events() {
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    ssize_t n = recv(nl_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    for (auto *h = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(h, size_t(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == RTM_NEWLINK || h->nlmsg_type == RTM_DELLINK) {
        auto *ifi = static_cast<ifinfomsg *>(NLMSG_DATA(h));
        if (unsigned(ifi->ifi_index) != ifindex_) continue;
        bool up = h->nlmsg_type == RTM_NEWLINK && (ifi->ifi_flags & IFF_UP) &&
                  (ifi->ifi_flags & IFF_RUNNING);
        if (up != port_up_.exchange(up)) {
          log().info("{}: port {}", cfg_.name, up ? "ACTIVE" : "DOWN");
          async_event(reinterpret_cast<void *>(1), up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
        }
      } else if (h->nlmsg_type == RTM_NEWADDR || h->nlmsg_type == RTM_DELADDR) {
        auto *ifa = static_cast<ifaddrmsg *>(NLMSG_DATA(h));
        if (ifa->ifa_index == ifindex_) async_event(reinterpret_cast<void *>(1), IBV_EVENT_GID_CHANGE);
      }
    }
  }
}

}  // namespace usrc
