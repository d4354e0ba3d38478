// The `usrc` admin CLI: device lifecycle (link), running programs (exec),
// counters (stats).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace usrc::cli {

struct LinkAddArgs {
  std::string name, netdev, type = "ib", backend = "udp", provider;
  int port = 20000;
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

}  // namespace usrc::cli
