// The `usrc` admin CLI: device lifecycle (link), running programs (exec),
// counters (stats).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "usrc/device.h"

namespace usrc::cli {

struct LinkAddArgs {
  std::string name, netdev, type = "ib", backend = "udp", provider;
  std::string sa;   // ADDR[:PORT] of the subnet administrator (docs/sa.md), or ""
  int port = 20000;
  int roce_port = -1;   // 0: none (the slot scheme alone); -1: 4791 on the udp backend, else none
};
int link_add(const LinkAddArgs &a);
int link_del(const std::string &name);
// Devices that survive a reboot: /etc/usrc/links.conf, one `NAME netdev IF
// [type ib|roce] [port P]` per line, '#' comments. restore adds the missing
// ones (idempotent); flush removes the ones named there.
int link_restore(const std::string &config);
int link_flush(const std::string &config);
// The words after `link add NAME` (and after NAME in links.conf): "" when
// good, else what is wrong with them.
std::string link_words(const std::vector<std::string_view> &words, LinkAddArgs &a);
inline constexpr const char *kLinksConf = "/etc/usrc/links.conf";
int link_show(const std::string &name, bool json);
int stats_show(const std::string &name, bool json);
int stats_reset(const std::string &name);
int exec_cmd(const std::vector<std::string> &argv);
std::vector<std::string> device_names();   // in this root, sorted

// `usrc sa` (docs/sa.md): the subnet administrator daemon, queries, and
// registration by hand.
struct SaArgs {
  std::string listen, state, sa, device, kind = "path", sgid, dgid, guid, addr, desc;
  int slid = -1, dlid = -1, lid = -1, port = 20000, window = 16;
  bool json = false, get = false;
};
int sa_serve(const SaArgs &a);
int sa_query(const SaArgs &a);
int sa_register(const SaArgs &a);
// Registers a device's port with the SA its sa_ip/sa_port name: fills lid
// and sm_lid. "" or why not.
std::string sa_register_device(DeviceConfig &c);

}  // namespace usrc::cli
