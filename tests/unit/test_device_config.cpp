// The device configuration (usrc.conf, include/usrc/device.h): the backend
// by its name, through serialize and parse.
#include <catch2/catch.hpp>

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
  CHECK(err == "bad backend: dpdk");
  // No backend line: udp.
  auto d = DeviceConfig::parse("name=t0\nipv4=127.0.0.1\n");
  REQUIRE(d);
  CHECK(d->backend == Backend::udp);
}
