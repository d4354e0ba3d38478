#include "usrc/device.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace usrc {

std::string root_dir() {
  const char *r = std::getenv("USRC_ROOT");
  return (r && *r) ? std::string(r) : std::string("/run/usrc");
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
    << "node_guid=0x" << std::hex << node_guid << std::dec << "\n"
    << "gid_tbl_len=" << gid_tbl_len << "\n"
    << "backend=" << backend_name(backend) << "\n";
  if (!provider.empty()) o << "provider=" << provider << "\n";
  return o.str();
}

std::optional<DeviceConfig> DeviceConfig::parse(const std::string &text, std::string *err) {
  DeviceConfig c;
  std::istringstream in(text);
  std::string line;
  auto fail = [&](const std::string &why) -> std::optional<DeviceConfig> {
    if (err) *err = why;
    return std::nullopt;
  };
  try {
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      auto eq = line.find('=');
      if (eq == std::string::npos) return fail("line without '=': " + line);
      std::string k = line.substr(0, eq), v = line.substr(eq + 1);
      if (k == "name") c.name = v;
      else if (k == "netdev") c.netdev = v;
      else if (k == "link_layer") {
        if (v == "ib") c.link_layer = LinkLayer::ib;
        else if (v == "roce") c.link_layer = LinkLayer::roce;
        else return fail("bad link_layer: " + v);
      } else if (k == "ipv4") {
        in_addr a{};
        if (inet_pton(AF_INET, v.c_str(), &a) != 1) return fail("bad ipv4: " + v);
        c.ipv4 = ntohl(a.s_addr);
      } else if (k == "prefix_len") c.prefix_len = std::stoul(v);
      else if (k == "lid") c.lid = static_cast<uint16_t>(std::stoul(v));
      else if (k == "active_mtu") c.active_mtu = std::stoul(v);
      else if (k == "base_port") c.base_port = static_cast<uint16_t>(std::stoul(v));
      else if (k == "node_guid") c.node_guid = std::stoull(v, nullptr, 0);
      else if (k == "gid_tbl_len") c.gid_tbl_len = std::stoul(v);
      else if (k == "backend") {
        auto b = backend_of(v);
        if (!b) return fail("bad backend: " + v);
        c.backend = *b;
      } else if (k == "provider") c.provider = v;
      // Unknown keys are ignored so that newer tools can add keys.
    }
  } catch (const std::exception &e) {
    return fail(std::string("bad number: ") + e.what());
  }
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
  return parse(ss.str(), err);
}

}  // namespace usrc
