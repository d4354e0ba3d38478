// Conformance against a peer we did not write: every RoCE v2 packet of the
// kernel rxe traces parses to what tshark's dissector reads (the .expected
// files, see rxe-traces/regenerate.sh), and its ICRC recomputes exactly.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>

#include "../common/pcap.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc;

namespace {

std::vector<std::vector<std::string>> read_expected(const std::string &path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cols.push_back(c);
    if (!line.empty() && line.back() == ',') cols.push_back("");
    cols.resize(20);
    rows.push_back(cols);
  }
  return rows;
}

uint64_t num(const std::string &s) { return std::stoull(s, nullptr, 0); }

}  // namespace

TEST_CASE("every packet of the kernel rxe traces parses as tshark reads it", "[wire][rxe]") {
  namespace fs = std::filesystem;
  int files = 0, packets = 0;
  for (auto &e : fs::directory_iterator(USRC_RXE_TRACES)) {
    if (e.path().extension() != ".pcap") continue;
    files++;
    auto frames = test::read_pcap(e.path());
    std::vector<test::UdpFrame> roce;
    for (auto &fr : frames)
      if (fr.dst_port == wire::kRoceV2Port) roce.push_back(fr);
    auto expected = read_expected(fs::path(e.path()).replace_extension(".expected"));
    INFO(e.path().filename());
    REQUIRE(!roce.empty());
    REQUIRE(roce.size() == expected.size());
    for (size_t i = 0; i < roce.size(); i++) {
      const auto &fr = roce[i];
      const auto &x = expected[i];
      INFO("packet " << x[0]);
      wire::Parsed p;
      REQUIRE(wire::parse(fr.payload.data(), fr.payload.size(), p) == wire::ParseError::ok);
      const wire::Headers &h = p.h;
      CHECK(h.bth.opcode == num(x[1]));
      CHECK(h.bth.psn == num(x[2]));
      CHECK(h.bth.dest_qp == num(x[3]));
      CHECK(h.bth.ack_req == (num(x[4]) != 0));
      CHECK(h.bth.se == (num(x[5]) != 0));
      CHECK(h.bth.pad_cnt == num(x[6]));
      CHECK(h.bth.pkey == num(x[7]));
      uint32_t m = p.info->mask;
      CHECK(bool(m & wire::HAS_AETH) == !x[8].empty());
      if (m & wire::HAS_AETH) {
        CHECK(h.aeth.syndrome == num(x[8]));
        CHECK(h.aeth.msn == num(x[9]));
      }
      if (m & wire::HAS_RETH) {
        CHECK(h.reth.va == num(x[10]));
        CHECK(h.reth.rkey == num(x[11]));
        CHECK(h.reth.dma_len == num(x[12]));
      }
      if (m & wire::HAS_ATOMICETH) {   // tshark shows the AtomicETH VA/rkey as RETH fields
        CHECK(h.atomic.va == num(x[10]));
        CHECK(h.atomic.rkey == num(x[11]));
        CHECK(h.atomic.swap_add == num(x[13]));
        CHECK(h.atomic.compare == num(x[14]));
      }
      if (m & wire::HAS_ATOMICACKETH) CHECK(h.atomic_ack == num(x[15]));
      CHECK(bool(m & wire::HAS_IMMDT) == !x[16].empty());
      if (m & wire::HAS_IMMDT) CHECK(__builtin_bswap32(h.imm_be) == num("0x" + x[16]));
      if (m & wire::HAS_DETH) {
        CHECK(h.deth.qkey == num(x[17]));
        CHECK(h.deth.src_qp == num(x[18]));
      }
      // tshark prints the ICRC as the four wire bytes read big-endian.
      CHECK(__builtin_bswap32(p.icrc) == num(x[19]));
      // The ICRC over the real IPv4/UDP headers recomputes to the wire value.
      iovec iov{const_cast<uint8_t *>(fr.payload.data()), fr.payload.size() - wire::kIcrcLen};
      wire::Ipv4Pseudo ip{fr.src_ip, fr.dst_ip, fr.src_port, fr.dst_port, fr.ip_id, fr.df};
      CHECK(wire::icrc_ipv4(ip, &iov, 1) == p.icrc);
      // And our builder reproduces the headers byte for byte.
      uint8_t hdr[wire::kMaxHdrLen];
      size_t hl = wire::build_headers(h, p.payload_len, hdr);
      REQUIRE(hl == p.info->hdr_len);
      CHECK(std::memcmp(hdr, fr.payload.data(), hl) == 0);
      packets++;
    }
  }
  CHECK(files == 12);
  CHECK(packets > 150);
}
