// Our packets, as tshark's InfiniBand dissector sees them: one packet of
// each RC opcode (and UD SEND), built with build_headers(), then every
// opcode through every header builder (builders.h), padded, with a valid
// ICRC (DF, IP ID 0), in Ethernet/IPv4/UDP to port 4791. tshark must
// dissect each as the opcode and header values we meant, and flag nothing
// as malformed. Exit 77 (skipped) when tshark is not installed.
#include <arpa/inet.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../common/pcap.h"
#include "builders.h"
#include "tshark_rows.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc;
using wire::Opcode;

namespace {

struct Case {
  Opcode op;
  size_t payload_len;
  uint8_t syndrome = wire::aeth_ack();   // for opcodes with an AETH
  const char *what = "";
};

int failures = 0;

void expect(bool ok, size_t i, const char *what, const std::string &field, const std::string &got) {
  if (ok) return;
  fprintf(stderr, "packet %zu (%s): %s is '%s'\n", i + 1, what, field.c_str(), got.c_str());
  failures++;
}

}  // namespace

int main() {
  if (system("command -v tshark >/dev/null 2>&1") != 0) {
    printf("tshark not installed: skipped (install the tshark package to run this test)\n");
    return 77;
  }
  const Case cases[] = {
      {Opcode::RC_SEND_FIRST, 1024},
      {Opcode::RC_SEND_MIDDLE, 1024},
      {Opcode::RC_SEND_LAST, 1021},   // pad 3
      {Opcode::RC_SEND_ONLY, 64},
      {Opcode::RC_SEND_LAST_IMM, 2},
      {Opcode::RC_SEND_ONLY_IMM, 5},
      {Opcode::RC_SEND_ONLY_INV, 64},
      {Opcode::RC_WRITE_FIRST, 1024},
      {Opcode::RC_WRITE_MIDDLE, 1024},
      {Opcode::RC_WRITE_LAST, 1023},
      {Opcode::RC_WRITE_ONLY, 3000 % 1024},
      {Opcode::RC_WRITE_ONLY_IMM, 0},
      {Opcode::RC_READ_REQUEST, 0},
      {Opcode::RC_READ_RESPONSE_FIRST, 1024},
      {Opcode::RC_READ_RESPONSE_MIDDLE, 1024},
      {Opcode::RC_READ_RESPONSE_LAST, 1},
      {Opcode::RC_READ_RESPONSE_ONLY, 64},
      {Opcode::RC_ACKNOWLEDGE, 0, wire::aeth_ack(), "ACK"},
      {Opcode::RC_ACKNOWLEDGE, 0, wire::aeth_nak(wire::NAK_PSN_SEQ), "NAK PSN sequence error"},
      {Opcode::RC_ACKNOWLEDGE, 0, wire::aeth_nak(wire::NAK_REMOTE_ACCESS), "NAK remote access"},
      {Opcode::RC_ACKNOWLEDGE, 0, wire::aeth_rnr_nak(14), "RNR NAK"},
      {Opcode::RC_COMPARE_SWAP, 0},
      {Opcode::RC_FETCH_ADD, 0},
      {Opcode::RC_ATOMIC_ACKNOWLEDGE, 0},
      {Opcode::UD_SEND_ONLY, 100},
  };
  // The packets: the cases above, built with build_headers(); then every
  // opcode through every builder (builders.h; tests/wire checks that they
  // write the same bytes), so that tshark reads what each one writes. Our
  // manufacturer-specific opcode is left out: tshark does not know it.
  struct Item {
    wire::Headers h;
    size_t payload_len;
    std::string what;
    std::vector<uint8_t> hdr;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const Case &c = cases[i];
    const wire::OpcodeInfo *info = wire::opcode_info(uint8_t(c.op));
    wire::Headers h;
    h.bth.opcode = uint8_t(c.op);
    h.bth.psn = (0xfffff0 + uint32_t(i)) & 0xffffff;   // through the 24-bit rollover
    h.bth.dest_qp = 0x1005 + uint32_t(i);
    h.bth.ack_req = (info->mask & wire::IS_REQUEST) && (info->mask & wire::IS_LAST);
    h.bth.se = c.op == Opcode::RC_SEND_ONLY_IMM;
    h.reth = {0x00007f0012345000 + i, 0x1234 + uint32_t(i), 4096 + uint32_t(i)};
    h.aeth = {c.syndrome, 0x100 + uint32_t(i)};
    h.atomic = {0x00007f0000000008 + i * 8, 0xabcd, 0x1111111122222222 + i, 0x3333333344444444};
    h.atomic_ack = 0x5555555566666666;
    h.imm_be = htonl(0xdead0000 + uint32_t(i));
    h.ieth = 0xbeef00 + uint32_t(i);
    h.deth = {0x11111111, 0x42};
    std::vector<uint8_t> hdr(wire::kMaxHdrLen);
    hdr.resize(wire::build_headers(h, c.payload_len, hdr.data()));
    items.push_back({h, c.payload_len, *c.what ? c.what : info->name, hdr});
  }
  for (const test::BuildCase &c : test::every_opcode_every_builder()) {
    if (c.h.bth.opcode == uint8_t(Opcode::USRC_WRITE_PLACED)) continue;
    for (const test::Built &b : c.built)
      items.push_back({c.h, c.payload_len,
                       std::string(wire::opcode_info(c.h.bth.opcode)->name) + " by " + b.builder, b.hdr});
  }
  const size_t n = items.size();
  const uint32_t ip_a = 0x0a000001, ip_b = 0x0a000002;   // 10.0.0.1, 10.0.0.2
  std::vector<test::UdpFrame> frames;
  for (size_t i = 0; i < n; i++) {
    const Item &it = items[i];
    const wire::OpcodeInfo *info = wire::opcode_info(it.h.bth.opcode);
    std::vector<uint8_t> pkt = it.hdr;
    for (size_t k = 0; k < it.payload_len; k++) pkt.push_back(uint8_t(k));
    pkt.insert(pkt.end(), wire::pad_for(it.payload_len), 0);
    // Requests go a -> b, responses b -> a; always to the RoCE v2 port.
    const bool req = info->mask & wire::IS_REQUEST;
    wire::Ipv4Pseudo ip{req ? ip_a : ip_b, req ? ip_b : ip_a, 49152, wire::kRoceV2Port};
    iovec iov{pkt.data(), pkt.size()};
    const uint32_t crc = wire::icrc_ipv4(ip, &iov, 1);
    pkt.resize(pkt.size() + wire::kIcrcLen);
    wire::store_icrc(pkt.data() + pkt.size() - wire::kIcrcLen, crc);
    // Our own parser agrees before tshark is asked.
    wire::Parsed p;
    if (wire::parse(pkt.data(), pkt.size(), p) != wire::ParseError::ok ||
        wire::check_icrc_ipv4(ip, pkt.data(), pkt.size()) != wire::ParseError::ok) {
      fprintf(stderr, "packet %zu (%s): our own parser rejects it\n", i + 1, it.what.c_str());
      return 1;
    }
    frames.push_back({ip.src_ip, ip.dst_ip, ip.src_port, ip.dst_port, ip.ip_id,
                      ip.dont_fragment, pkt, 0, 20});
  }

  char path[] = "/tmp/usrc-wire-tshark-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return 1;
  close(fd);
  if (!test::write_pcap(path, frames)) {
    fprintf(stderr, "cannot write %s\n", path);
    unlink(path);
    return 1;
  }
  const std::string cmd =
      std::string("tshark -n -r ") + path +
      " -T fields -E header=y -E separator=, -E occurrence=f"
      " -e frame.number -e _ws.malformed -e _ws.expert.severity -e udp.dstport"
      " -e infiniband.bth.opcode -e infiniband.bth.psn -e infiniband.bth.destqp"
      " -e infiniband.bth.a -e infiniband.bth.se -e infiniband.bth.padcnt -e infiniband.bth.p_key"
      " -e infiniband.reth.va -e infiniband.reth.r_key -e infiniband.reth.dmalen"
      " -e infiniband.aeth.syndrome -e infiniband.aeth.msn"
      " -e infiniband.atomiceth.swapdt -e infiniband.atomiceth.cmpdt"
      " -e infiniband.atomicacketh.origremdt -e infiniband.immdt -e infiniband.ieth"
      " -e infiniband.deth.q_key -e infiniband.deth.srcqp -e infiniband.invariant.crc"
      " 2>/dev/null";
  bool ran = false;
  const std::string out = test::run_capture(cmd, ran);
  unlink(path);
  std::istringstream in(out);
  const auto rows = test::read_tshark_rows(in);
  if (!ran || rows.size() != n) {
    fprintf(stderr, "tshark dissected %zu of %zu packets:\n%s\n", rows.size(), n, out.c_str());
    return 1;
  }

  using test::tshark_bytes, test::tshark_flag, test::tshark_num;
  for (size_t i = 0; i < n; i++) {
    const wire::Headers &h = items[i].h;
    const uint32_t m = wire::opcode_info(h.bth.opcode)->mask;
    const char *what = items[i].what.c_str();
    const auto &r = rows[i];
    auto f = [&](const char *name) { return r.at(name); };
    auto want = [&](const char *name, uint64_t v) { expect(tshark_num(f(name)) == v, i, what, name, f(name)); };
    auto want_absent = [&](const char *name) { expect(f(name).empty(), i, what, name, f(name)); };

    expect(f("_ws.malformed").empty() && f("_ws.expert.severity").empty(), i, what,
           "malformed/expert info", f("_ws.malformed") + f("_ws.expert.severity"));
    want("udp.dstport", wire::kRoceV2Port);
    want("infiniband.bth.opcode", h.bth.opcode);
    want("infiniband.bth.psn", h.bth.psn);
    want("infiniband.bth.destqp", h.bth.dest_qp);
    expect(tshark_flag(f("infiniband.bth.a")) == h.bth.ack_req, i, what, "ack_req", f("infiniband.bth.a"));
    expect(tshark_flag(f("infiniband.bth.se")) == h.bth.se, i, what, "se", f("infiniband.bth.se"));
    want("infiniband.bth.padcnt", wire::pad_for(items[i].payload_len));
    want("infiniband.bth.p_key", 0xffff);
    // Wireshark 4.0 names the XRC opcodes but does not dissect what
    // follows their BTH ("Unknown Header Sequence"), and predates ATOMIC
    // WRITE (IBA 1.5); our own parser checked those headers above.
    if ((m & wire::IS_XRC) || (h.bth.opcode & 0x1f) == uint8_t(wire::Opcode::RC_ATOMIC_WRITE)) continue;
    if (m & wire::HAS_RETH) {
      want("infiniband.reth.va", h.reth.va);
      want("infiniband.reth.r_key", h.reth.rkey);
      want("infiniband.reth.dmalen", h.reth.dma_len);
    } else if (m & wire::HAS_ATOMICETH) {   // tshark shows its VA and R_Key as RETH fields
      want("infiniband.reth.va", h.atomic.va);
      want("infiniband.reth.r_key", h.atomic.rkey);
      want("infiniband.atomiceth.swapdt", h.atomic.swap_add);
      want("infiniband.atomiceth.cmpdt", h.atomic.compare);
    } else {
      want_absent("infiniband.reth.va");
    }
    if (m & wire::HAS_AETH) {
      want("infiniband.aeth.syndrome", h.aeth.syndrome);
      want("infiniband.aeth.msn", h.aeth.msn);
    } else {
      want_absent("infiniband.aeth.syndrome");
    }
    if (m & wire::HAS_ATOMICACKETH) want("infiniband.atomicacketh.origremdt", h.atomic_ack);
    if (m & wire::HAS_IMMDT)
      expect(tshark_bytes(f("infiniband.immdt")) == ntohl(h.imm_be), i, what, "immdt", f("infiniband.immdt"));
    else
      want_absent("infiniband.immdt");
    if (m & wire::HAS_IETH)
      expect(tshark_bytes(f("infiniband.ieth")) == h.ieth, i, what, "ieth", f("infiniband.ieth"));
    if (m & wire::HAS_DETH) {
      want("infiniband.deth.q_key", h.deth.qkey);
      want("infiniband.deth.srcqp", h.deth.src_qp);
    }
    // tshark prints the ICRC bytes as a big-endian number; we store it little-endian.
    const uint8_t *ic = frames[i].payload.data() + frames[i].payload.size() - wire::kIcrcLen;
    want("infiniband.invariant.crc", test::be32(ic));
  }
  if (failures) {
    fprintf(stderr, "%d mismatches\n%s", failures, out.c_str());
    return 1;
  }
  printf("tshark dissected all %zu packets as intended\n", n);
  return 0;
}
