// `usrc link add|del|show`: the device tree libibverbs reads through
// SYSFS_PATH (see include/usrc/device.h and README "How it works").
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "usrc/cm/sa.h"
#include "usrc/common/config_text.h"
#include "usrc/device.h"
#include "usrc/version.h"

namespace fs = std::filesystem;

namespace usrc::cli {

namespace {

int fail(const std::string &msg) {
  fprintf(stderr, "usrc: %s\n", msg.c_str());
  return 1;
}

void write_file(const fs::path &p, const std::string &content, mode_t mode = 0644) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p);
  f << content;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + p.string());
  chmod(p.c_str(), mode);
}

std::string read_file(const fs::path &p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string ip_str(uint32_t ip) {
  in_addr a{htonl(ip)};
  char b[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, b, sizeof b);
}

// sysfs GID format: eight groups of four hex digits.
std::string gid_str(const uint8_t g[16]) {
  char b[40];
  snprintf(b, sizeof b, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
           g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13],
           g[14], g[15]);
  return b;
}

std::string guid_str(uint64_t guid) {
  char b[24];
  snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
           unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
  return b;
}

struct Ipv4 { uint32_t ip; uint32_t prefix; };

std::vector<Ipv4> netdev_ipv4(const std::string &ifname) {
  std::vector<Ipv4> out;
  ifaddrs *ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return out;
  for (ifaddrs *i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || ifname != i->ifa_name) continue;
    uint32_t ip = ntohl(reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr);
    uint32_t mask = i->ifa_netmask
                        ? ntohl(reinterpret_cast<sockaddr_in *>(i->ifa_netmask)->sin_addr.s_addr)
                        : 0xffffffff;
    out.push_back({ip, static_cast<uint32_t>(__builtin_popcount(mask))});
  }
  freeifaddrs(ifa);
  return out;
}

// IBA MTUs: the largest that fits the netdev MTU with our headers (IPv4 20,
// UDP 8, BTH 12, the largest extended header 28, ICRC 4).
uint32_t active_mtu_for(uint32_t netdev_mtu) {
  uint32_t best = 0;
  for (uint32_t m : {256u, 512u, 1024u, 2048u, 4096u})
    if (m + 72 <= netdev_mtu) best = m;
  return best;
}

uint64_t make_guid(const std::string &name, uint32_t ip) {
  uint64_t h = 0xcbf29ce484222325ull;   // FNV-1a
  auto mix = [&](uint8_t b) { h = (h ^ b) * 0x100000001b3ull; };
  for (char c : name) mix(static_cast<uint8_t>(c));
  for (int i = 0; i < 4; i++) mix(static_cast<uint8_t>(ip >> (8 * i)));
  // Locally administered EUI-64 style: 0x02 in the top byte.
  return (h & 0x00ffffffffffffffull) | 0x0200000000000000ull;
}

fs::path verbs_dir() { return fs::path(sysfs_dir()) / "class/infiniband_verbs"; }

// The uverbsN directory of a device, or "" if none.
std::string uverbs_of(const std::string &name) {
  std::error_code ec;
  for (auto &e : fs::directory_iterator(verbs_dir(), ec))
    if (e.is_directory() && read_file(e.path() / "ibdev") == name) return e.path().filename();
  return "";
}

}  // namespace

std::vector<std::string> device_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto &e : fs::directory_iterator(fs::path(sysfs_dir()) / "class/infiniband", ec))
    if (fs::exists(e.path() / kConfigFile)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

int link_add(const LinkAddArgs &a) {
  if (!std::regex_match(a.name, std::regex("[A-Za-z0-9_-]{1,31}")))
    return fail("bad device name '" + a.name + "' (letters, digits, '_' and '-', at most 31)");
  if (a.type != "ib" && a.type != "roce") return fail("type must be ib or roce");
  const std::optional<Backend> backend = backend_of(a.backend);
  if (!backend) return fail("backend must be udp, xdp or ofi");
  if (!a.provider.empty() && backend != Backend::ofi) return fail("provider applies to backend ofi only");
  if (std::any_of(a.provider.begin(), a.provider.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; }))
    return fail("bad provider name '" + a.provider + "'");
  if (a.port < 1024 || a.port > 65535 - int(kMaxSlots))
    return fail("port must be 1024.." + std::to_string(65535 - kMaxSlots));
  unsigned ifindex = if_nametoindex(a.netdev.c_str());
  if (!ifindex) return fail("no network interface '" + a.netdev + "'");
  if (geteuid() != 0) return fail("link add needs root (it creates /dev/infiniband nodes)");
  fs::path dev = ibdev_dir(a.name);
  if (fs::exists(dev)) return fail("device " + a.name + " exists");
  auto addrs = netdev_ipv4(a.netdev);
  if (addrs.empty()) return fail(a.netdev + " has no IPv4 address (usrc binds one)");

  DeviceConfig c;
  c.name = a.name;
  c.netdev = a.netdev;
  c.link_layer = a.type == "ib" ? LinkLayer::ib : LinkLayer::roce;
  c.ipv4 = addrs[0].ip;
  c.prefix_len = addrs[0].prefix;
  if (!a.sa.empty() && c.link_layer != LinkLayer::ib)
    return fail("sa applies to type ib only (RoCE has no LIDs)");
  if (c.link_layer == LinkLayer::ib && a.sa.empty()) {
    c.lid = lid_for(c.ipv4);
    if (c.lid == 0)
      return fail("address " + ip_str(c.ipv4) +
                  " has no LID: on InfiniBand link layer the LID is the low 14 bits of the "
                  "address, which must not be 0 (use another address or type roce)");
  }
  const uint32_t mtu = static_cast<uint32_t>(
      config::to_uint(read_file("/sys/class/net/" + a.netdev + "/mtu"), UINT32_MAX).value_or(1500));
  c.active_mtu = active_mtu_for(mtu);
  // libfabric's udp provider carries at most 1472 bytes (a 1500-byte
  // Ethernet MTU) whatever the netdev: keep ofi packets within it.
  if (backend == Backend::ofi) c.active_mtu = std::min<uint32_t>(c.active_mtu, 1024);
  // An AF_XDP frame (4096 bytes, less the kernel's 256 bytes of headroom)
  // carries an IBA MTU of 2048 at most, whatever the netdev's MTU.
  if (backend == Backend::xdp) c.active_mtu = std::min<uint32_t>(c.active_mtu, 2048);
  if (!c.active_mtu) return fail(a.netdev + " MTU " + std::to_string(mtu) + " is too small");
  c.base_port = static_cast<uint16_t>(a.port);
  // The RoCE v2 port is the udp backend's (its contexts share it: a kernel
  // socket group); xdp and ofi contexts receive at base + slot alone.
  if (a.roce_port > 0 && backend != Backend::udp)
    return fail("roce_port needs the udp backend (xdp and ofi devices use the slot scheme: roce_port 0)");
  c.roce_port = static_cast<uint16_t>(a.roce_port < 0 ? (backend == Backend::udp ? 4791 : 0) : a.roce_port);
  c.backend = *backend;
  c.provider = a.provider;
  c.node_guid = make_guid(a.name, c.ipv4);
  // The netdev was found by name in this process's namespace: the device is
  // that namespace's (the provider offers it there only).
  c.netns = net_namespace();
  if (!a.sa.empty()) {
    // The SA gives the LID (docs/sa.md); the port registers now.
    sa::Endpoint e;
    if (!sa::parse_endpoint(a.sa, &e)) return fail("bad sa '" + a.sa + "' (ADDR[:PORT])");
    c.sa_ip = e.ip;
    c.sa_port = e.port;
    if (std::string why = sa_register_device(c); !why.empty()) return fail(why);
  }

  // GID table: IB: the port GID (fe80::/64 + GUID) then the IPv4-mapped
  // addresses; RoCE v2: the IPv4-mapped addresses.
  std::vector<std::array<uint8_t, 16>> gids;
  if (c.link_layer == LinkLayer::ib) {
    std::array<uint8_t, 16> g{0xfe, 0x80};
    for (int i = 0; i < 8; i++) g[8 + i] = uint8_t(c.node_guid >> (56 - 8 * i));
    gids.push_back(g);
  }
  for (auto &ad : addrs) {
    std::array<uint8_t, 16> g{};
    g[10] = g[11] = 0xff;
    for (int i = 0; i < 4; i++) g[12 + i] = uint8_t(ad.ip >> (24 - 8 * i));
    gids.push_back(g);
  }
  // RoCE peers (rxe, mlx5) have their IPv4-mapped GID at index 1, and
  // their users say so (`ibv_rc_pingpong -g 1`, perftest `-x 1`); index 0
  // is their IPv6 link-local, which usrc, IPv4 only, could not route. So
  // index 1 repeats index 0: both indices name the first address.
  if (c.link_layer == LinkLayer::roce && !gids.empty()) gids.insert(gids.begin() + 1, gids[0]);
  c.gid_tbl_len = static_cast<uint32_t>(gids.size());

  try {
    fs::path root = root_dir();
    fs::create_directories(verbs_dir());
    chmod(root.c_str(), 0755);
    write_file(verbs_dir() / "abi_version", "6\n");
    // What librdmacm reads before it opens /dev/infiniband/rdma_cm, which
    // the preloaded provider emulates (docs/cm.md): the ucma ABI version.
    write_file(fs::path(sysfs_dir()) / "class/misc/rdma_cm/abi_version", "4\n");

    // Build the device directory aside and rename it into place: libibverbs
    // must never see a half-written device.
    fs::path tmp = fs::path(sysfs_dir()) / "class/infiniband" / ("." + a.name + ".tmp");
    fs::remove_all(tmp);
    write_file(tmp / "node_type", "1: CA\n");
    write_file(tmp / "node_guid", guid_str(c.node_guid) + "\n");
    write_file(tmp / "sys_image_guid", guid_str(c.node_guid) + "\n");
    write_file(tmp / "fw_ver", USRC_VERSION "\n");
    write_file(tmp / "board_id", "USRC_UDP\n");
    write_file(tmp / "hca_type", "usrc\n");
    write_file(tmp / "node_desc", "usrc " + a.name + " (" + a.netdev + ")\n");
    // device/net/IF: where tools look for an RDMA device's netdev, as under
    // a NIC's device in sysfs (rdma-core's tests, for one). As in sysfs it
    // is the netdev's own directory: a link to /sys/class/net/IF, resolved
    // in the reader's /sys (`ip netns exec` mounts its namespace's), and
    // only processes of the device's namespace are offered the device.
    fs::create_directories(tmp / "device/net");
    fs::create_symlink("/sys/class/net/" + a.netdev, tmp / "device/net" / a.netdev);
    fs::path port = tmp / "ports/1";
    write_file(port / "state", "4: ACTIVE\n");
    write_file(port / "phys_state", "5: LinkUp\n");
    char lid[16];
    snprintf(lid, sizeof lid, "0x%x\n", c.lid);
    write_file(port / "lid", lid);
    write_file(port / "lid_mask_count", "0\n");
    snprintf(lid, sizeof lid, "0x%x\n", c.sm_lid);
    write_file(port / "sm_lid", lid);
    write_file(port / "link_layer", c.link_layer == LinkLayer::ib ? "InfiniBand\n" : "Ethernet\n");
    write_file(port / "rate", "2.5 Gb/sec (1X SDR)\n");
    for (size_t i = 0; i < gids.size(); i++) {
      write_file(port / "gids" / std::to_string(i), gid_str(gids[i].data()) + "\n");
      if (c.link_layer == LinkLayer::roce) {
        write_file(port / "gid_attrs/types" / std::to_string(i), "RoCE v2\n");
        write_file(port / "gid_attrs/ndevs" / std::to_string(i), a.netdev + "\n");
      }
    }
    // The empty rest of the table: an all-zero GID, as the kernel shows one.
    const std::array<uint8_t, 16> zero{};
    // (On RoCE a type too: libibverbs' sysfs reader fails an entry without
    // one, where the kernel's read of an empty entry's type is EINVAL.)
    for (size_t i = gids.size(); i < c.gid_table_size(); i++) {
      write_file(port / "gids" / std::to_string(i), gid_str(zero.data()) + "\n");
      if (c.link_layer == LinkLayer::roce) write_file(port / "gid_attrs/types" / std::to_string(i), "RoCE v2\n");
    }
    write_file(port / "pkeys/0", "0xffff\n");
    write_file(tmp / kConfigFile, c.serialize());
    fs::rename(tmp, dev);

    if (std::string err; !make_counters_dir(a.name, &err) || !make_xrc_dir(&err)) throw std::runtime_error(err);

    // The character node libibverbs opens: a /dev/null clone. Never removed:
    // it is harmless and may serve devices of another USRC_ROOT.
    int n = 0;
    while (fs::exists(verbs_dir() / ("uverbs" + std::to_string(n)))) n++;
    std::string uv = "uverbs" + std::to_string(n);
    fs::create_directories("/dev/infiniband");
    std::string node = "/dev/infiniband/" + uv;
    struct stat st;
    if (stat(node.c_str(), &st) != 0) {
      if (mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
        throw std::runtime_error("mknod " + node + ": " + strerror(errno));
      chmod(node.c_str(), 0666);
    } else if (!S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 3)) {
      throw std::runtime_error(node + " exists and is not a character device 1:3 (/dev/null's)");
    }
    // Last: the uverbs entry makes the device visible.
    fs::path uvtmp = verbs_dir() / ("." + uv + ".tmp");
    fs::remove_all(uvtmp);
    write_file(uvtmp / "ibdev", a.name + "\n");
    // The device number of the node, and of every context's command fd
    // (the provider's /dev/null): libibverbs' ibv_import_device finds a
    // device by it.
    write_file(uvtmp / "dev", "1:3\n");
    write_file(uvtmp / "abi_version", "1\n");
    fs::rename(uvtmp, verbs_dir() / uv);
  } catch (const std::exception &e) {
    return fail(e.what());
  }
  return 0;
}

int link_del(const std::string &name) {
  fs::path dev = ibdev_dir(name);
  if (!fs::exists(dev / kConfigFile)) return fail("no device " + name);
  try {
    std::string uv = uverbs_of(name);
    if (!uv.empty()) fs::remove_all(verbs_dir() / uv);
    fs::remove_all(dev);
    if (std::string err; !remove_counters_dir(name, &err)) throw std::runtime_error(err);
    fs::remove(fs::path(root_dir()) / "counters" / name);   // (the single file of older versions)
  } catch (const std::exception &e) {
    return fail(e.what());
  }
  return 0;
}

// `netdev IF [type ib|roce] [port P] [roce_port P] [backend B] [provider P] [sa ADDR[:PORT]]`, iproute2
// style: "" when good, else what is wrong.
std::string link_words(const std::vector<std::string_view> &words, LinkAddArgs &a) {
  for (size_t i = 0; i < words.size(); i += 2) {
    const std::string k(words[i]);
    if (i + 1 >= words.size()) return "'" + k + "' needs a value";
    const std::string v(words[i + 1]);
    if (k == "netdev") a.netdev = v;
    else if (k == "type") a.type = v;
    else if (k == "backend") a.backend = v;
    else if (k == "provider") a.provider = v;
    else if (k == "sa") a.sa = v;
    else if (k == "port") {
      auto p = config::to_uint(v, 65535);
      if (!p) return "bad port '" + v + "'";
      a.port = static_cast<int>(*p);
    } else if (k == "roce_port") {
      auto p = config::to_uint(v, 65535);
      if (!p) return "bad roce_port '" + v + "'";
      a.roce_port = static_cast<int>(*p);
    } else {
      return "unknown keyword '" + k + "' (expected netdev, type, port, roce_port, backend, provider, sa)";
    }
  }
  if (a.netdev.empty()) return "link needs 'netdev IFNAME'";
  return "";
}

namespace {

// The config's lines as link-add arguments; false (after a message) on a
// bad line, so that a typo never half-applies a config.
bool read_links_conf(const std::string &path, std::vector<LinkAddArgs> &out) {
  std::ifstream f(path);
  std::stringstream text;
  if (f) text << f.rdbuf();
  if (!f) {
    fprintf(stderr, "usrc: cannot read %s\n", path.c_str());
    return false;
  }
  std::string why = config::each_line(text.str(), [&](const config::Line &l) {
    LinkAddArgs a;
    a.name = l.words[0];
    std::string bad = link_words({l.words.begin() + 1, l.words.end()}, a);
    if (bad.empty()) out.push_back(a);
    return bad;
  });
  if (!why.empty()) {
    fprintf(stderr, "usrc: %s: %s (expected NAME netdev IF [type ib|roce] [port P] [roce_port P] [backend B])\n",
            path.c_str(), why.c_str());
    return false;
  }
  return true;
}

}  // namespace

int link_restore(const std::string &config) {
  std::vector<LinkAddArgs> links;
  if (!read_links_conf(config, links)) return 1;
  int rc = 0;
  for (auto &a : links) {
    std::string err;
    if (auto c = DeviceConfig::load(a.name, &err)) {
      LinkLayer ll = a.type == "ib" ? LinkLayer::ib : LinkLayer::roce;
      if (c->netdev != a.netdev || c->link_layer != ll || c->base_port != a.port)
        fprintf(stderr, "usrc: %s exists with other settings; left as it is\n", a.name.c_str());
      // (A device an older usrc made has a single counters file instead.)
      if (!fs::is_directory(counters_dir(a.name)) && !make_counters_dir(a.name, &err))
        fprintf(stderr, "usrc: %s: %s\n", a.name.c_str(), err.c_str());
      continue;
    }
    if (link_add(a) != 0) rc = 1;   // try the others: one bad netdev must not hide the rest
  }
  return rc;
}

int link_flush(const std::string &config) {
  std::vector<LinkAddArgs> links;
  if (!read_links_conf(config, links)) return 1;
  for (auto &a : links)
    if (fs::exists(fs::path(ibdev_dir(a.name)) / kConfigFile) && link_del(a.name) != 0) return 1;
  return 0;
}

int link_show(const std::string &name, bool json) {
  std::vector<std::string> names = name.empty() ? device_names() : std::vector<std::string>{name};
  auto out = nlohmann::ordered_json::array();
  for (auto &n : names) {
    std::string err;
    auto c = DeviceConfig::load(n, &err);
    if (!c) return fail(err);
    const char *type = c->link_layer == LinkLayer::ib ? "ib" : "roce";
    if (json) {
      nlohmann::ordered_json o = {{"ifname", n},
                                  {"port", 1},
                                  {"state", "ACTIVE"},
                                  {"physical_state", "LINK_UP"},
                                  {"netdev", c->netdev},
                                  {"type", type},
                                  {"lid", c->lid},
                                  {"ipv4", ip_str(c->ipv4)},
                                  {"mtu", c->active_mtu},
                                  {"udp_port", c->base_port},
                                  {"uverbs", uverbs_of(n)},
                                  {"backend", backend_name(c->backend)}};
      if (!c->provider.empty()) o["provider"] = c->provider;
      if (c->sa_ip) {
        o["sa"] = ip_str(c->sa_ip) + ":" + std::to_string(c->sa_port);
        o["sm_lid"] = c->sm_lid;
      }
      out.push_back(std::move(o));
    } else {
      const std::string sa =
          c->sa_ip ? " sa " + ip_str(c->sa_ip) + ":" + std::to_string(c->sa_port) + " sm_lid " + std::to_string(c->sm_lid) : "";
      printf("link %s/1 state ACTIVE physical_state LINK_UP netdev %s type %s lid %u ipv4 %s "
             "mtu %u port %u backend %s%s%s%s\n",
             n.c_str(), c->netdev.c_str(), type, c->lid, ip_str(c->ipv4).c_str(), c->active_mtu,
             c->base_port, backend_name(c->backend), c->provider.empty() ? "" : " provider ",
             c->provider.c_str(), sa.c_str());
    }
  }
  // (Names, netdevs and providers are escaped: a netdev may be named
  // anything the kernel allows.)
  if (json) printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace usrc::cli
