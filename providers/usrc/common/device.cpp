#include "usrc/device.h"

#include "usrc/common/config_text.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <type_traits>

namespace usrc {

std::string root_dir() {
  const char *r = std::getenv("USRC_ROOT");
  return (r && *r) ? std::string(r) : std::string("/run/usrc");
}

uint64_t net_namespace() {
  struct stat st {};
  return stat("/proc/thread-self/ns/net", &st) == 0 ? st.st_ino : 0;
}

bool make_xrc_dir(std::string *err) {
  const std::string d = xrc_dir();
  struct stat st {};
  if (mkdir(d.c_str(), 0700) == 0) {
    if (chmod(d.c_str(), 01777) == 0) return true;
  } else if (errno == EEXIST && lstat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return true;
  }
  *err = "cannot create " + d + ": " + strerror(errno);
  return false;
}

static const char *const kCounterNames[] = {
#define USRC_X(name, doc) #name,
    USRC_COUNTERS(USRC_X)
#undef USRC_X
};
static const char *const kCounterDocs[] = {
#define USRC_X(name, doc) doc,
    USRC_COUNTERS(USRC_X)
#undef USRC_X
};
const char *counter_name(Counter c) { return kCounterNames[static_cast<uint32_t>(c)]; }
const char *counter_doc(Counter c) { return kCounterDocs[static_cast<uint32_t>(c)]; }

std::optional<Backend> backend_of(const std::string &name) {
  for (uint8_t i = 0; i < std::size(kBackendNames); i++)
    if (name == kBackendNames[i]) return static_cast<Backend>(i);
  return std::nullopt;
}

static std::string ip_str(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, buf, sizeof buf);
}

std::string DeviceConfig::serialize() const {
  std::ostringstream o;
  o << "name=" << name << "\n"
    << "netdev=" << netdev << "\n"
    << "link_layer=" << (link_layer == LinkLayer::ib ? "ib" : "roce") << "\n"
    << "ipv4=" << ip_str(ipv4) << "\n"
    << "prefix_len=" << prefix_len << "\n"
    << "lid=" << lid << "\n"
    << "active_mtu=" << active_mtu << "\n"
    << "base_port=" << base_port << "\n"
    << "roce_port=" << roce_port << "\n"
    << "node_guid=0x" << std::hex << node_guid << std::dec << "\n"
    << "gid_tbl_len=" << gid_tbl_len << "\n"
    << "backend=" << backend_name(backend) << "\n";
  if (!provider.empty()) o << "provider=" << provider << "\n";
  if (netns) o << "netns=" << netns << "\n";
  if (sa_ip) o << "sa=" << ip_str(sa_ip) << ":" << sa_port << "\n" << "sm_lid=" << sm_lid << "\n";
  return o.str();
}

std::optional<DeviceConfig> DeviceConfig::parse(const std::string &text, std::string *err) {
  DeviceConfig c;
  auto line = [&c](const config::Line &l) -> std::string {
    std::string_view k, v;
    if (!config::key_value(l, &k, &v)) return "not key=value: " + std::string(l.text);
    const std::string val(v);
    auto number = [&](auto &field, uint64_t max, bool hex = false) -> std::string {
      auto n = config::to_uint(v, max, hex);
      if (!n) return "bad " + std::string(k) + ": '" + val + "' (a number, at most " + std::to_string(max) + ")";
      field = static_cast<std::remove_reference_t<decltype(field)>>(*n);
      return "";
    };
    if (k == "name") c.name = val;
    else if (k == "netdev") c.netdev = val;
    else if (k == "link_layer") {
      if (v == "ib") c.link_layer = LinkLayer::ib;
      else if (v == "roce") c.link_layer = LinkLayer::roce;
      else return "bad link_layer: " + val;
    } else if (k == "ipv4") {
      in_addr a{};
      if (inet_pton(AF_INET, val.c_str(), &a) != 1) return "bad ipv4: " + val;
      c.ipv4 = ntohl(a.s_addr);
    } else if (k == "prefix_len") return number(c.prefix_len, 32);
    else if (k == "lid") return number(c.lid, UINT16_MAX);
    else if (k == "active_mtu") return number(c.active_mtu, UINT32_MAX);
    else if (k == "base_port") return number(c.base_port, UINT16_MAX);
    else if (k == "roce_port") return number(c.roce_port, UINT16_MAX);
    else if (k == "node_guid") return number(c.node_guid, UINT64_MAX, true);
    else if (k == "gid_tbl_len") return number(c.gid_tbl_len, UINT32_MAX);
    else if (k == "backend") {
      auto b = backend_of(val);
      if (!b) return "bad backend: " + val;
      c.backend = *b;
    } else if (k == "provider") c.provider = val;
    else if (k == "netns") return number(c.netns, UINT64_MAX);
    else if (k == "sm_lid") return number(c.sm_lid, UINT16_MAX);
    else if (k == "sa") {
      const size_t colon = val.find(':');
      in_addr a{};
      if (colon == std::string::npos || inet_pton(AF_INET, val.substr(0, colon).c_str(), &a) != 1)
        return "bad sa: " + val + " (ADDR:PORT)";
      c.sa_ip = ntohl(a.s_addr);
      auto port = config::to_uint(std::string_view(val).substr(colon + 1), UINT16_MAX, false);
      if (!port || *port == 0) return "bad sa: " + val + " (ADDR:PORT)";
      c.sa_port = static_cast<uint16_t>(*port);
    }
    // Unknown keys are ignored so that newer tools can add keys.
    return "";
  };
  auto fail = [&](const std::string &why) -> std::optional<DeviceConfig> {
    if (err) *err = why;
    return std::nullopt;
  };
  if (std::string why = config::each_line(text, line); !why.empty()) return fail(why);
  if (c.name.empty() || c.ipv4 == 0) return fail("name and ipv4 are required");
  if (c.active_mtu != 256 && c.active_mtu != 512 && c.active_mtu != 1024 &&
      c.active_mtu != 2048 && c.active_mtu != 4096)
    return fail("active_mtu must be an IBA MTU (256..4096)");
  return c;
}

std::optional<DeviceConfig> DeviceConfig::load(const std::string &name, std::string *err) {
  std::ifstream f(ibdev_dir(name) + "/" + kConfigFile);
  if (!f) {
    if (err) *err = "no usrc device " + name + " (" + ibdev_dir(name) + ")";
    return std::nullopt;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = parse(ss.str(), err);
  if (!c && err) *err = ibdev_dir(name) + "/" + kConfigFile + ": " + *err;
  return c;
}

}  // namespace usrc
