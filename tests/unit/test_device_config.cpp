// The device configuration (usrc.conf, include/usrc/device.h): the backend
// by its name, through serialize and parse.
#include <catch2/catch.hpp>

#include "usrc/common/config_text.h"
#include "usrc/device.h"

using namespace usrc;

TEST_CASE("the backend is named by one table, and round-trips through usrc.conf", "[config]") {
  for (Backend b : {Backend::udp, Backend::xdp, Backend::ofi}) {
    REQUIRE(backend_of(backend_name(b)) == b);
    DeviceConfig c;
    c.name = "t0";
    c.ipv4 = 0x7f000001;
    c.backend = b;
    auto back = DeviceConfig::parse(c.serialize());
    REQUIRE(back);
    CHECK(back->backend == b);
    CHECK(c.serialize().find(std::string("backend=") + backend_name(b) + "\n") != std::string::npos);
  }
  CHECK(std::string(backend_name(Backend::udp)) == "udp");
  CHECK(std::string(backend_name(Backend::xdp)) == "xdp");
  CHECK(std::string(backend_name(Backend::ofi)) == "ofi");
  CHECK_FALSE(backend_of("UDP"));
  CHECK_FALSE(backend_of(""));
  std::string err;
  CHECK_FALSE(DeviceConfig::parse("name=t0\nipv4=127.0.0.1\nbackend=dpdk\n", &err));
  CHECK(err == "line 3: bad backend: dpdk");
  // No backend line: udp.
  auto d = DeviceConfig::parse("name=t0\nipv4=127.0.0.1\n");
  REQUIRE(d);
  CHECK(d->backend == Backend::udp);
}

TEST_CASE("usrc.conf: a bad line is refused by its number, never thrown", "[config]") {
  const std::string good = "name=t0\nipv4=127.0.0.1\n";
  struct Bad {
    const char *line, *err;
  } bad[] = {
      {"prefix_len=abc", "line 3: bad prefix_len: 'abc' (a number, at most 32)"},
      {"prefix_len=33", "line 3: bad prefix_len: '33' (a number, at most 32)"},
      {"prefix_len=24x", "line 3: bad prefix_len: '24x' (a number, at most 32)"},
      {"prefix_len=-1", "line 3: bad prefix_len: '-1' (a number, at most 32)"},
      {"prefix_len=", "line 3: bad prefix_len: '' (a number, at most 32)"},
      {"base_port=65536", "line 3: bad base_port: '65536' (a number, at most 65535)"},
      {"lid=99999999999999999999999", "line 3: bad lid: '99999999999999999999999' (a number, at most 65535)"},
      {"node_guid=0xzz", "line 3: bad node_guid: '0xzz' (a number, at most 18446744073709551615)"},
      {"active_mtu=1e3", "line 3: bad active_mtu: '1e3' (a number, at most 4294967295)"},
      {"ipv4=1.2.3", "line 3: bad ipv4: 1.2.3"},
      {"link_layer=eth", "line 3: bad link_layer: eth"},
      {"just words", "line 3: not key=value: just words"},
      {"=value", "line 3: not key=value: =value"},
  };
  for (const Bad &b : bad) {
    INFO(b.line);
    std::string err;
    CHECK_FALSE(DeviceConfig::parse(good + b.line + "\n", &err));
    CHECK(err == b.err);
  }
  std::string err;
  CHECK_FALSE(DeviceConfig::parse("name=t0\n", &err));
  CHECK(err == "name and ipv4 are required");
  CHECK_FALSE(DeviceConfig::parse(good + "active_mtu=1500\n", &err));
  CHECK(err == "active_mtu must be an IBA MTU (256..4096)");
}

TEST_CASE("usrc.conf: comments, blanks and numbers as written", "[config]") {
  auto c = DeviceConfig::parse(
      "# a device\n\n  name = t0  \r\nipv4=10.0.0.1 # trailing comment\nnetdev=a#b\n"
      "node_guid=0x02ab00000000cdef\nbase_port=21000\nprefix_len=24\nfuture_key=anything\n");
  REQUIRE(c);
  CHECK(c->name == "t0");
  CHECK(c->ipv4 == 0x0a000001);
  CHECK(c->netdev == "a#b");   // '#' starts a comment only at the start of a word
  CHECK(c->node_guid == 0x02ab00000000cdefull);
  CHECK(c->base_port == 21000);
  CHECK(c->prefix_len == 24);
}

TEST_CASE("the shared config reader: words, line numbers, numbers", "[config]") {
  std::vector<std::pair<unsigned, std::vector<std::string>>> seen;
  std::string why = config::each_line("a b\n\n# c\n  d\te  # f\ng", [&](const config::Line &l) {
    seen.push_back({l.number, {l.words.begin(), l.words.end()}});
    return std::string(l.words[0] == "g" ? "no g" : "");
  });
  CHECK(why == "line 5: no g");
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == std::pair<unsigned, std::vector<std::string>>{1, {"a", "b"}});
  CHECK(seen[1] == std::pair<unsigned, std::vector<std::string>>{4, {"d", "e"}});
  CHECK(seen[2].first == 5);
  CHECK(config::to_uint("0", 0) == 0u);
  CHECK(config::to_uint("65535", 65535) == 65535u);
  CHECK_FALSE(config::to_uint("65536", 65535));
  CHECK_FALSE(config::to_uint("+1", 10));
  CHECK_FALSE(config::to_uint(" 1", 10));
  CHECK_FALSE(config::to_uint("0x10", 100));   // hex only when asked
  CHECK(config::to_uint("0x10", 100, true) == 16u);
  CHECK(config::to_uint("10", 100, true) == 10u);
  CHECK_FALSE(config::to_uint("0x", 100, true));
}

TEST_CASE("usrc.conf: the network namespace round-trips; a device without one has 0", "[config]") {
  CHECK(net_namespace() != 0);   // (this test's own: /proc is mounted)
  DeviceConfig c;
  c.name = "t0";
  c.ipv4 = 0x7f000001;
  CHECK(c.serialize().find("netns=") == std::string::npos);   // 0: not written
  c.netns = 4026531840ull;
  auto back = DeviceConfig::parse(c.serialize());
  REQUIRE(back);
  CHECK(back->netns == 4026531840ull);
  // A device made before namespaces were recorded.
  auto old = DeviceConfig::parse("name=t0\nipv4=127.0.0.1\n");
  REQUIRE(old);
  CHECK(old->netns == 0);
  std::string err;
  CHECK_FALSE(DeviceConfig::parse("name=t0\nipv4=127.0.0.1\nnetns=net:[4026531840]\n", &err));
  CHECK(err.find("line 3: bad netns") == 0);
}

TEST_CASE("usrc.conf: the subnet administrator and the SM LID round-trip", "[config]") {
  DeviceConfig c;
  c.name = "sa0";
  c.ipv4 = 0x0a000002;
  c.lid = 7;
  c.sa_ip = 0x0a000001;
  c.sa_port = 29700;
  c.sm_lid = 1;
  const std::string text = c.serialize();
  CHECK(text.find("sa=10.0.0.1:29700\n") != std::string::npos);
  auto back = DeviceConfig::parse(text);
  REQUIRE(back);
  CHECK(back->sa_ip == c.sa_ip);
  CHECK(back->sa_port == 29700);
  CHECK(back->sm_lid == 1);
  CHECK(back->lid == 7);
  // None: no sa line, and LIDs follow the address.
  DeviceConfig n;
  n.name = "sa1";
  n.ipv4 = 0x0a000003;
  CHECK(n.serialize().find("sa=") == std::string::npos);
  std::string err;
  const std::string good = "name=t0\nipv4=127.0.0.1\n";
  for (const char *bad : {"sa=10.0.0.1", "sa=10.0.0.1:0", "sa=10.0.0.1:70000", "sa=host:1", "sa=:5"})
    CHECK_FALSE(DeviceConfig::parse(good + bad + "\n", &err));
}
