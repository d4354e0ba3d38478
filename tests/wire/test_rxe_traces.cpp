// Conformance against a peer we did not write (kernel rxe, Linux 6.1):
// every RoCE v2 packet of the traces parses to what tshark's InfiniBand
// dissector reads, our builder reproduces its headers byte for byte, and
// its ICRC recomputes exactly from the captured IPv4/UDP headers.
//
// [rxe] compares with the checked-in rxe-traces/*.expected (written by
// rxe-traces/regenerate.sh); [rxe-live] runs tshark now (ctest skips it when
// tshark is not installed).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "../common/pcap.h"
#include "tshark_rows.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc;
namespace fs = std::filesystem;

namespace {

using Row = test::TsharkRow;
uint64_t num(const std::string &s) { return std::stoull(s, nullptr, 0); }
bool flag(const std::string &s) { return test::tshark_flag(s); }
uint32_t bytes32(const std::string &s) { return uint32_t(test::tshark_bytes(s)); }

std::vector<fs::path> traces() {
  std::vector<fs::path> v;
  for (auto &e : fs::directory_iterator(USRC_RXE_TRACES))
    if (e.path().extension() == ".pcap") v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

// Checks every RoCE v2 datagram of `pcap` against tshark's rows for it.
// Returns the number of packets checked.
size_t check_trace(const fs::path &pcap, const std::vector<Row> &rows) {
  INFO(pcap.filename().string());
  const test::PcapFile file = test::read_pcap_file(pcap);
  REQUIRE(file.ok);
  CHECK(file.link_type == test::kLinkEthernet);   // all of them, checked with capinfos
  std::map<size_t, const test::UdpFrame *> roce;
  for (auto &fr : file.udp)
    if (fr.dst_port == wire::kRoceV2Port) roce[fr.frame_no] = &fr;
  REQUIRE(!roce.empty());
  REQUIRE(roce.size() == rows.size());
  std::mt19937 rng(3);
  for (const Row &x : rows) {
    auto field = [&](const char *name) -> const std::string & {
      auto it = x.find(name);
      REQUIRE(it != x.end());   // the field list and the rows disagree
      return it->second;
    };
    INFO("frame " << field("frame.number"));
    auto it = roce.find(num(field("frame.number")));
    REQUIRE(it != roce.end());
    const test::UdpFrame &fr = *it->second;
    REQUIRE(fr.ip_hdr_len == 20);
    const std::vector<uint8_t> &pkt = fr.payload;

    wire::Parsed p;
    REQUIRE(wire::parse(pkt.data(), pkt.size(), p) == wire::ParseError::ok);
    const wire::Headers &h = p.h;
    const uint32_t m = p.info->mask;
    CHECK(h.bth.opcode == num(field("infiniband.bth.opcode")));
    CHECK(h.bth.se == flag(field("infiniband.bth.se")));
    CHECK(h.bth.mig_req == flag(field("infiniband.bth.m")));
    CHECK(h.bth.pad_cnt == num(field("infiniband.bth.padcnt")));
    CHECK(h.bth.tver == num(field("infiniband.bth.tver")));
    CHECK(h.bth.pkey == num(field("infiniband.bth.p_key")));
    CHECK(h.bth.dest_qp == num(field("infiniband.bth.destqp")));
    CHECK(h.bth.ack_req == flag(field("infiniband.bth.a")));
    CHECK(h.bth.psn == num(field("infiniband.bth.psn")));
    CHECK(bool(m & wire::HAS_DETH) == !field("infiniband.deth.q_key").empty());
    if (m & wire::HAS_DETH) {
      CHECK(h.deth.qkey == num(field("infiniband.deth.q_key")));
      CHECK(h.deth.src_qp == num(field("infiniband.deth.srcqp")));
    }
    // tshark shows the VA and R_Key of an AtomicETH as RETH fields.
    CHECK(bool(m & (wire::HAS_RETH | wire::HAS_ATOMICETH)) ==
          !field("infiniband.reth.va").empty());
    if (m & wire::HAS_RETH) {
      CHECK(h.reth.va == num(field("infiniband.reth.va")));
      CHECK(h.reth.rkey == num(field("infiniband.reth.r_key")));
      CHECK(h.reth.dma_len == num(field("infiniband.reth.dmalen")));
    }
    CHECK(bool(m & wire::HAS_ATOMICETH) == !field("infiniband.atomiceth.swapdt").empty());
    if (m & wire::HAS_ATOMICETH) {
      CHECK(h.atomic.va == num(field("infiniband.reth.va")));
      CHECK(h.atomic.rkey == num(field("infiniband.reth.r_key")));
      CHECK(h.atomic.swap_add == num(field("infiniband.atomiceth.swapdt")));
      CHECK(h.atomic.compare == num(field("infiniband.atomiceth.cmpdt")));
    }
    CHECK(bool(m & wire::HAS_AETH) == !field("infiniband.aeth.syndrome").empty());
    if (m & wire::HAS_AETH) {
      CHECK(h.aeth.syndrome == num(field("infiniband.aeth.syndrome")));
      CHECK(h.aeth.msn == num(field("infiniband.aeth.msn")));
    }
    CHECK(bool(m & wire::HAS_ATOMICACKETH) ==
          !field("infiniband.atomicacketh.origremdt").empty());
    if (m & wire::HAS_ATOMICACKETH)
      CHECK(h.atomic_ack == num(field("infiniband.atomicacketh.origremdt")));
    CHECK(bool(m & wire::HAS_IMMDT) == !field("infiniband.immdt").empty());
    if (m & wire::HAS_IMMDT) CHECK(__builtin_bswap32(h.imm_be) == bytes32(field("infiniband.immdt")));
    CHECK(bool(m & wire::HAS_IETH) == !field("infiniband.ieth").empty());
    if (m & wire::HAS_IETH) CHECK(h.ieth == bytes32(field("infiniband.ieth")));
    CHECK(p.payload_len + h.bth.pad_cnt + p.info->hdr_len + wire::kIcrcLen == pkt.size());

    // tshark prints the ICRC as the four wire bytes read big-endian; it
    // does not verify it. We do, over the captured IP ID, DF, addresses.
    CHECK(__builtin_bswap32(p.icrc) == num(field("infiniband.invariant.crc")));
    const wire::Ipv4Pseudo ip{fr.src_ip, fr.dst_ip, fr.src_port, fr.dst_port, fr.ip_id, fr.df};
    iovec whole{const_cast<uint8_t *>(pkt.data()), pkt.size() - wire::kIcrcLen};
    CHECK(wire::icrc_ipv4(ip, &whole, 1) == p.icrc);
    CHECK(wire::check_icrc_ipv4(ip, pkt.data(), pkt.size()) == wire::ParseError::ok);
    wire::Ipv4Pseudo other = ip;
    other.ip_id ^= 1;
    CHECK(wire::check_icrc_ipv4(other, pkt.data(), pkt.size()) == wire::ParseError::bad_icrc);
    // What a UDP socket receiver does, which sees no IP ID (rxe's count
    // up from a non-zero start): the ICRC tells it.
    wire::Ipv4Pseudo blind = ip;
    blind.ip_id = 0;
    uint16_t id = 0;
    CHECK(wire::solve_ip_id(wire::icrc_ipv4(blind, &whole, 1), p.icrc, pkt.size(), &id));
    CHECK(id == fr.ip_id);
    // The same over the packet gathered from three pieces cut anywhere.
    size_t a = rng() % (whole.iov_len + 1), b = rng() % (whole.iov_len + 1);
    if (a > b) std::swap(a, b);
    uint8_t *d = const_cast<uint8_t *>(pkt.data());
    iovec parts[3] = {{d, a}, {d + a, b - a}, {d + b, whole.iov_len - b}};
    CHECK(wire::icrc_ipv4(ip, parts, 3) == p.icrc);

    // Our builder reproduces rxe's headers byte for byte.
    uint8_t hdr[wire::kMaxHdrLen];
    const size_t hl = wire::build_headers(h, p.payload_len, hdr);
    REQUIRE(hl == p.info->hdr_len);
    CHECK(std::memcmp(hdr, pkt.data(), hl) == 0);
  }
  return rows.size();
}

}  // namespace

TEST_CASE("every packet of the kernel rxe traces parses as tshark read it", "[wire][rxe]") {
  size_t files = 0, packets = 0;
  for (const fs::path &pcap : traces()) {
    std::ifstream in(fs::path(pcap).replace_extension(".expected"));
    REQUIRE(in);
    packets += check_trace(pcap, test::read_tshark_rows(in));
    files++;
  }
  CHECK(files == 12);
  CHECK(packets == 221);
}

TEST_CASE("every packet of the kernel rxe traces parses as tshark reads it now",
          "[.][rxe-live]") {
  std::string fields;
  {
    std::ifstream in(std::string(USRC_RXE_TRACES) + "/fields.txt");
    std::string f;
    while (std::getline(in, f))
      if (!f.empty()) fields += " -e " + f;
  }
  size_t files = 0, packets = 0;
  for (const fs::path &pcap : traces()) {
    const std::string cmd = "tshark -n -r '" + pcap.string() +
                            "' -Y 'udp.dstport == 4791' -T fields -E header=y -E separator=,"
                            " -E occurrence=f" + fields + " 2>/dev/null";
    bool ok = false;
    const std::string out = test::run_capture(cmd, ok);
    REQUIRE(ok);
    std::istringstream in(out);
    packets += check_trace(pcap, test::read_tshark_rows(in));
    files++;
  }
  CHECK(files == 12);
  CHECK(packets == 221);
}

// The reader handles what other captures come as: the same datagrams
// re-encoded as raw IPv4, Linux cooked (SLL) and big-endian files.
TEST_CASE("the pcap reader handles other link types and byte orders", "[wire][rxe]") {
  const fs::path src = fs::path(USRC_RXE_TRACES) / "rc_send_multi.pcap";
  std::ifstream in(src, std::ios::binary);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(d.size() > 24);
  const auto want = test::read_pcap(src);
  REQUIRE(!want.empty());
  // The file's LINKTYPE_* and the DLT_* libpcap reports for it.
  const std::pair<uint32_t, uint32_t> links[] = {
      {101, test::kLinkRaw}, {113, test::kLinkLinuxSll}, {228, test::kLinkIpv4}};
  for (auto [linktype, link] : links) {
    for (bool big : {false, true}) {
      auto put32 = [&](std::vector<uint8_t> &o, uint32_t v) {
        if (big) v = __builtin_bswap32(v);
        const auto *b = reinterpret_cast<const uint8_t *>(&v);
        o.insert(o.end(), b, b + 4);
      };
      std::vector<uint8_t> o;
      put32(o, 0xa1b2c3d4);
      put32(o, big ? 0x00020004 : 0x00040002);   // version 2.4: two 16-bit fields
      put32(o, 0);
      put32(o, 0);
      put32(o, 65535);
      put32(o, linktype);
      for (size_t off = 24; off + 16 <= d.size();) {
        uint32_t incl;
        std::memcpy(&incl, d.data() + off + 8, 4);
        const uint8_t *eth = d.data() + off + 16;
        std::vector<uint8_t> l2;
        if (link == test::kLinkLinuxSll) {
          l2.assign(16, 0);
          l2[14] = 0x08;   // protocol IPv4
        }
        l2.insert(l2.end(), eth + 14, eth + incl);
        for (int i = 0; i < 2; i++) put32(o, 0);
        for (int i = 0; i < 2; i++) put32(o, uint32_t(l2.size()));
        o.insert(o.end(), l2.begin(), l2.end());
        off += 16 + incl;
      }
      const std::string path = (fs::temp_directory_path() /
                                ("usrc-wire-pcap-" + std::to_string(getpid()) + ".pcap")).string();
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(o.data()),
                                                  std::streamsize(o.size()));
      const test::PcapFile got = test::read_pcap_file(path);
      fs::remove(path);
      INFO("link type " << linktype << (big ? " big-endian" : " little-endian") << " " << got.error);
      CHECK(got.ok);
      CHECK(got.link_type == link);
      REQUIRE(got.udp.size() == want.size());
      for (size_t i = 0; i < want.size(); i++) {
        CHECK(got.udp[i].payload == want[i].payload);
        CHECK(got.udp[i].ip_id == want[i].ip_id);
        CHECK(got.udp[i].src_port == want[i].src_port);
      }
    }
  }
  // Not a capture: refused with libpcap's reason, not misread.
  const std::string junk = (fs::temp_directory_path() /
                            ("usrc-wire-junk-" + std::to_string(getpid()) + ".pcap")).string();
  std::ofstream(junk) << "this is not a capture file, not at all\n";
  const test::PcapFile bad = test::read_pcap_file(junk);
  fs::remove(junk);
  CHECK_FALSE(bad.ok);
  CHECK_FALSE(bad.error.empty());
}

// A pcapng capture (what Wireshark and dumpcap write by default) reads as the
// same datagrams: converted from a trace by editcap, which comes with tshark.
TEST_CASE("the pcap reader reads pcapng", "[.][rxe-live]") {
  const fs::path src = fs::path(USRC_RXE_TRACES) / "rc_send_multi.pcap";
  const std::string ng = (fs::temp_directory_path() /
                          ("usrc-wire-" + std::to_string(getpid()) + ".pcapng")).string();
  const std::string cmd = "editcap -F pcapng '" + src.string() + "' '" + ng + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream f(ng, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  CHECK(std::memcmp(magic, "\x0a\x0d\x0d\x0a", 4) == 0);   // a pcapng section header
  const test::PcapFile got = test::read_pcap_file(ng);
  fs::remove(ng);
  const test::PcapFile want = test::read_pcap_file(src);
  REQUIRE(got.ok);
  CHECK(got.link_type == test::kLinkEthernet);
  CHECK(got.records == want.records);
  REQUIRE(got.udp.size() == want.udp.size());
  for (size_t i = 0; i < want.udp.size(); i++) {
    CHECK(got.udp[i].payload == want.udp[i].payload);
    CHECK(got.udp[i].frame_no == want.udp[i].frame_no);
  }
}
