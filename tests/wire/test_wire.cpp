// The wire codec: the opcode table, build/parse round trips for every
// opcode and payload length, rejection of malformed packets, the ICRC over
// gathered buffers, and a fuzz loop (parse must never read out of bounds:
// every input is an exactly-sized heap copy, so ASan/valgrind catch it).
#include <catch2/catch.hpp>
#include <zlib.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "builders.h"
#include "usrc/rc/wr_opcode.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc::wire;

namespace {

const Ipv4Pseudo kIp{0x0a000001, 0x0a000002, 20001, kRoceV2Port};

std::vector<uint8_t> make_packet(const Headers &h, const std::vector<uint8_t> &payload,
                                 const Ipv4Pseudo &ip = kIp) {
  std::vector<uint8_t> pkt(kMaxHdrLen);
  const size_t hl = build_headers(h, payload.size(), pkt.data());
  REQUIRE(hl > 0);
  pkt.resize(hl);
  pkt.insert(pkt.end(), payload.begin(), payload.end());
  pkt.insert(pkt.end(), pad_for(payload.size()), 0);
  iovec iov{pkt.data(), pkt.size()};
  const uint32_t crc = icrc_ipv4(ip, &iov, 1);
  pkt.resize(pkt.size() + kIcrcLen);
  store_icrc(pkt.data() + pkt.size() - kIcrcLen, crc);
  return pkt;
}

// Parses an exactly-sized heap copy of buf[0, n), so that ASan sees any overread.
ParseError parse_copy(const std::vector<uint8_t> &buf, size_t n, Parsed &p,
                      std::unique_ptr<uint8_t[]> &keep) {
  keep.reset(new uint8_t[n ? n : 1]);
  std::copy(buf.begin(), buf.begin() + std::ptrdiff_t(n), keep.get());
  return parse(keep.get(), n, p);
}

Headers random_headers(std::mt19937_64 &rng, uint8_t op) {
  Headers h;
  h.bth.opcode = op;
  h.bth.se = rng() & 1;
  h.bth.mig_req = rng() & 1;
  h.bth.pad_cnt = uint8_t(rng() & 3);   // ignored: build_headers derives it
  h.bth.pkey = uint16_t(rng());
  h.bth.fecn = rng() & 1;
  h.bth.becn = rng() & 1;
  h.bth.dest_qp = rng() & 0xffffff;
  h.bth.ack_req = rng() & 1;
  h.bth.psn = rng() & 0xffffff;
  h.reth = {rng(), uint32_t(rng()), uint32_t(rng())};
  h.aeth = {uint8_t(rng()), uint32_t(rng() & 0xffffff)};
  h.atomic = {rng(), uint32_t(rng()), rng(), rng()};
  h.atomic_ack = rng();
  h.imm_be = uint32_t(rng());
  h.ieth = uint32_t(rng());
  h.deth = {uint32_t(rng()), uint32_t(rng() & 0xffffff)};
  return h;
}

// Payload lengths to try for an opcode: all pads around 0 and 4096 for
// packets that end a message; FIRST/MIDDLE carry whole PMTUs (multiples of 4).
std::vector<size_t> lengths_for(const OpcodeInfo &info, std::mt19937_64 &rng) {
  if (!(info.mask & HAS_PAYLOAD)) return {0};
  std::vector<size_t> v;
  const bool pads = info.mask & IS_LAST;
  for (size_t n = 0; n <= 4096; n++)
    if ((n <= 9 || n >= 4091 || rng() % 256 == 0) && (pads || n % 4 == 0)) v.push_back(n);
  return v;
}

}  // namespace

TEST_CASE("the opcode table is IBA table 38", "[wire]") {
  std::set<int> valid;
  for (int op = 0; op < 256; op++)
    if (const OpcodeInfo *info = opcode_info(uint8_t(op))) {
      valid.insert(op);
      INFO(info->name);
      const uint32_t m = info->mask;
      // One direction and one position in the message.
      CHECK(bool(m & IS_REQUEST) != bool(m & IS_RESPONSE));
      const int pos = bool(m & IS_MIDDLE) + bool(m & IS_ONLY) +
                      (bool(m & IS_FIRST) && !(m & IS_LAST)) + (bool(m & IS_LAST) && !(m & IS_FIRST));
      CHECK(pos == 1);
      CHECK(bool(m & IS_ONLY) == (bool(m & IS_FIRST) && bool(m & IS_LAST)));
      // hdr_len is BTH plus exactly the extended headers of the mask.
      const size_t len = kBthLen + (m & HAS_RETH ? kRethLen : 0) + (m & HAS_AETH ? kAethLen : 0) +
                         (m & HAS_ATOMICETH ? kAtomicEthLen : 0) +
                         (m & HAS_ATOMICACKETH ? kAtomicAckEthLen : 0) +
                         (m & HAS_IMMDT ? kImmDtLen : 0) + (m & HAS_IETH ? kIethLen : 0) +
                         (m & HAS_DETH ? kDethLen : 0) + (m & HAS_XRCETH ? kXrcEthLen : 0);
      CHECK(info->hdr_len == len);
      CHECK(info->hdr_len <= kMaxHdrLen);
      // The transport prefix of the name matches the top three bits.
      const std::string name = info->name;
      const bool xrc = op >= 0xa0 && op < 0xc0;
      CHECK(name.substr(0, op >= 0xc0 ? 5 : xrc ? 4 : 3) ==
            (op < 0x20 ? "RC_" : op < 0x40 ? "UC_" : op < 0xa0 ? "UD_" : xrc ? "XRC_" : "USRC_"));
      // The transport bit is the top three bits' (none for ours).
      CHECK((m & (IS_RC | IS_UC | IS_UD | IS_XRC)) ==
            (op < 0x20 ? IS_RC : op < 0x40 ? IS_UC : op < 0xa0 ? IS_UD : xrc ? IS_XRC : 0u));
      // Only UD has a DETH, only XRC requests the XRCETH; only RC and XRC
      // have responses, READ, atomics, invalidate, and an XRC opcode is
      // its RC one with the XRCETH on requests.
      CHECK(bool(m & HAS_DETH) == (op >= 0x60 && op < 0xa0));
      CHECK(bool(m & HAS_XRCETH) == (xrc && (m & IS_REQUEST)));
      if (op >= 0x20 && !xrc) CHECK(!(m & (IS_RESPONSE | IS_READ | IS_ATOMIC | HAS_IETH)));
      if (xrc) CHECK((m & ~(IS_XRC | HAS_XRCETH)) == (opcode_info(uint8_t(op - 0xa0))->mask & ~IS_RC));
      // A receive WQE is consumed by the packet that completes a SEND or a
      // WRITE with immediate; never by READ or atomics.
      CHECK(bool(m & CONSUMES_RWQE) ==
            (((m & IS_SEND) || ((m & IS_WRITE) && (m & HAS_IMMDT))) && (m & IS_LAST)));
    }
  std::set<int> want;
  for (int op = 0x00; op <= 0x14; op++) want.insert(op);
  want.insert({0x16, 0x17, 0x1d});   // (0x1d: ATOMIC WRITE, IBA 1.5)
  for (int op = 0x20; op <= 0x2b; op++) want.insert(op);
  want.insert({0x64, 0x65});
  for (int op : std::set<int>(want)) if (op < 0x20) want.insert(op + 0xa0);   // XRC: RC's
  want.insert(0xc0);   // ours (manufacturer-specific): a placed RDMA WRITE
  CHECK(valid == want);

  auto info = [](Opcode op) { return *opcode_info(uint8_t(op)); };
  CHECK(info(Opcode::RC_SEND_ONLY).hdr_len == 12);
  CHECK(info(Opcode::RC_SEND_ONLY_IMM).hdr_len == 16);
  CHECK(info(Opcode::RC_SEND_ONLY_INV).hdr_len == 16);
  CHECK(info(Opcode::RC_WRITE_FIRST).hdr_len == 28);
  CHECK(info(Opcode::RC_WRITE_MIDDLE).hdr_len == 12);
  CHECK(info(Opcode::RC_WRITE_ONLY_IMM).hdr_len == 32);
  CHECK(info(Opcode::RC_READ_REQUEST).hdr_len == 28);
  CHECK(info(Opcode::RC_READ_RESPONSE_FIRST).hdr_len == 16);
  CHECK(info(Opcode::RC_READ_RESPONSE_MIDDLE).hdr_len == 12);
  CHECK(info(Opcode::RC_ACKNOWLEDGE).hdr_len == 16);
  CHECK(info(Opcode::RC_ATOMIC_ACKNOWLEDGE).hdr_len == 24);
  CHECK(info(Opcode::RC_COMPARE_SWAP).hdr_len == 40);
  CHECK(info(Opcode::UD_SEND_ONLY_IMM).hdr_len == 24);
  CHECK(info(Opcode::RC_READ_REQUEST).mask == (IS_RC | IS_REQUEST | IS_READ | HAS_RETH | IS_FIRST |
                                               IS_LAST | IS_ONLY));
  CHECK(std::string(info(Opcode::UC_WRITE_LAST_IMM).name) == "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE");
}

TEST_CASE("every opcode round-trips through build and parse", "[wire]") {
  std::mt19937_64 rng(1);
  size_t packets = 0;
  for (int op = 0; op < 256; op++) {
    const OpcodeInfo *info = opcode_info(uint8_t(op));
    if (!info) continue;
    const uint32_t m = info->mask;
    for (size_t len : lengths_for(*info, rng)) {
      const Headers h = random_headers(rng, uint8_t(op));
      std::vector<uint8_t> payload(len);
      for (auto &b : payload) b = uint8_t(rng());
      const auto pkt = make_packet(h, payload);
      CHECK(pkt.size() % 4 == 0);
      Parsed p;
      std::unique_ptr<uint8_t[]> keep;
      REQUIRE(parse_copy(pkt, pkt.size(), p, keep) == ParseError::ok);
      packets++;
      CHECK(p.info == info);
      CHECK(p.h.bth.opcode == op);
      CHECK(p.h.bth.se == h.bth.se);
      CHECK(p.h.bth.mig_req == h.bth.mig_req);
      CHECK(p.h.bth.pad_cnt == pad_for(len));
      CHECK(p.h.bth.tver == 0);
      CHECK(p.h.bth.pkey == h.bth.pkey);
      CHECK(p.h.bth.fecn == h.bth.fecn);
      CHECK(p.h.bth.becn == h.bth.becn);
      CHECK(p.h.bth.dest_qp == h.bth.dest_qp);
      CHECK(p.h.bth.ack_req == h.bth.ack_req);
      CHECK(p.h.bth.psn == h.bth.psn);
      if (m & HAS_RETH) {
        CHECK(p.h.reth.va == h.reth.va);
        CHECK(p.h.reth.rkey == h.reth.rkey);
        CHECK(p.h.reth.dma_len == h.reth.dma_len);
      }
      if (m & HAS_AETH) {
        CHECK(p.h.aeth.syndrome == h.aeth.syndrome);
        CHECK(p.h.aeth.msn == h.aeth.msn);
      }
      if (m & HAS_ATOMICETH) {
        CHECK(p.h.atomic.va == h.atomic.va);
        CHECK(p.h.atomic.rkey == h.atomic.rkey);
        CHECK(p.h.atomic.swap_add == h.atomic.swap_add);
        CHECK(p.h.atomic.compare == h.atomic.compare);
      }
      if (m & HAS_ATOMICACKETH) CHECK(p.h.atomic_ack == h.atomic_ack);
      if (m & HAS_IMMDT) {
        CHECK(p.h.imm_be == h.imm_be);
        // imm_be is kept in network order: its bytes are the wire bytes.
        CHECK(std::memcmp(&p.h.imm_be, pkt.data() + info->hdr_len - kImmDtLen -
                                           (m & HAS_IETH ? kIethLen : 0), 4) == 0);
      }
      if (m & HAS_IETH) CHECK(p.h.ieth == h.ieth);
      if (m & HAS_DETH) {
        CHECK(p.h.deth.qkey == h.deth.qkey);
        CHECK(p.h.deth.src_qp == h.deth.src_qp);
      }
      REQUIRE(p.payload_len == len);
      CHECK(p.payload == keep.get() + info->hdr_len);
      CHECK(std::equal(payload.begin(), payload.end(), p.payload));
      CHECK(check_icrc_ipv4(kIp, keep.get(), pkt.size()) == ParseError::ok);
    }
  }
  CHECK(packets > 37 * 10);
}

TEST_CASE("every header builder writes what build_headers writes, for every opcode", "[wire]") {
  const auto cases = usrc::test::every_opcode_every_builder();
  std::set<std::string> builders;
  size_t compared = 0;
  for (const auto &c : cases) {
    const OpcodeInfo &info = *opcode_info(c.h.bth.opcode);
    INFO(info.name << " syndrome " << int(c.h.aeth.syndrome));
    REQUIRE(c.built[0].builder == "build_headers");
    const auto &want = c.built[0].hdr;
    REQUIRE(want.size() == info.hdr_len);
    for (const auto &b : c.built) {
      INFO(b.builder);
      builders.insert(b.builder);
      CHECK(b.hdr == want);
      compared++;
    }
    // And what build_headers wrote is what was asked for, read back
    // through both layers of accessors.
    std::vector<uint8_t> pkt = want;
    pkt.resize(want.size() + c.payload_len + pad_for(c.payload_len) + kIcrcLen);
    Parsed p;
    REQUIRE(parse(pkt.data(), pkt.size(), p) == ParseError::ok);
    CHECK(p.h.bth.psn == c.h.bth.psn);
    CHECK(p.payload_len == c.payload_len);
    const HdrView v = p.view();
    CHECK(v.psn() == bth::psn(pkt.data()));
    CHECK(v.qpn() == c.h.bth.dest_qp);
    CHECK(v.ack_req() == c.h.bth.ack_req);
    CHECK(v.se() == c.h.bth.se);
    if (v.has(HAS_RETH)) CHECK((v.reth_va() == c.h.reth.va && v.reth_rkey() == c.h.reth.rkey &&
                                v.reth_len() == c.h.reth.dma_len));
    if (v.has(HAS_AETH)) CHECK((v.syndrome() == c.h.aeth.syndrome && v.msn() == c.h.aeth.msn));
    if (v.has(HAS_IMMDT)) CHECK(v.imm_be() == c.h.imm_be);
    if (v.has(HAS_ATOMICETH))
      CHECK((v.atomic_va() == c.h.atomic.va && v.atomic_swap_add() == c.h.atomic.swap_add &&
             v.atomic_compare() == c.h.atomic.compare && v.atomic_rkey() == c.h.atomic.rkey));
    if (v.has(HAS_ATOMICACKETH)) CHECK(v.atomic_orig() == c.h.atomic_ack);
    if (v.has(HAS_DETH)) CHECK((v.qkey() == c.h.deth.qkey && v.src_qp() == c.h.deth.src_qp));
    if (v.has(HAS_IETH)) CHECK(v.ieth_rkey() == c.h.ieth);
    if (v.has(HAS_XRCETH)) CHECK(v.xrc_srqn() == c.h.xrc_srqn);
  }
  CHECK(cases.size() == 40 + 23 + 3);   // every opcode (RC, UC, UD, ours; XRC), the ACK four ways
  CHECK(builders == std::set<std::string>{"build_headers", "put_request", "bth words + put_request_ext", "put_ack"});
  // build_headers for each; put_request for the SENDs, WRITEs (ATOMIC WRITE too), READ
  // requests and SENDs with invalidate of RC and XRC, UC's and ours; the
  // in-place builder for RC's and UC's SENDs and WRITEs, RC's READ request
  // and ours; put_ack.
  CHECK(compared == 66 + (16 + 12 + 16 + 1) + (14 + 12 + 1) + 4);
}

TEST_CASE("a work request's packets come from the WR opcode table", "[wire]") {
  using usrc::rc::WrOpcode, usrc::rc::wr_info, usrc::rc::request_opcode;
  auto ops = [](WrOpcode op, uint32_t n) {
    std::vector<Opcode> v;
    for (uint32_t k = 0; k < n; k++) v.push_back(Opcode(request_opcode(wr_info(op), k, n)));
    return v;
  };
  using V = std::vector<Opcode>;
  CHECK(ops(WrOpcode::send, 1) == V{Opcode::RC_SEND_ONLY});
  CHECK(ops(WrOpcode::send, 3) == V{Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST});
  CHECK(ops(WrOpcode::send_imm, 1) == V{Opcode::RC_SEND_ONLY_IMM});
  CHECK(ops(WrOpcode::send_imm, 2) == V{Opcode::RC_SEND_FIRST, Opcode::RC_SEND_LAST_IMM});
  CHECK(ops(WrOpcode::rdma_write, 1) == V{Opcode::RC_WRITE_ONLY});
  CHECK(ops(WrOpcode::rdma_write, 3) == V{Opcode::RC_WRITE_FIRST, Opcode::RC_WRITE_MIDDLE, Opcode::RC_WRITE_LAST});
  CHECK(ops(WrOpcode::rdma_write_imm, 1) == V{Opcode::RC_WRITE_ONLY_IMM});
  CHECK(ops(WrOpcode::rdma_write_imm, 2) == V{Opcode::RC_WRITE_FIRST, Opcode::RC_WRITE_LAST_IMM});
  CHECK(ops(WrOpcode::rdma_read, 1) == V{Opcode::RC_READ_REQUEST});
  CHECK(ops(WrOpcode::atomic_cmp_swp, 1) == V{Opcode::RC_COMPARE_SWAP});
  CHECK(ops(WrOpcode::atomic_fetch_add, 1) == V{Opcode::RC_FETCH_ADD});
  const auto &read = wr_info(WrOpcode::rdma_read);
  CHECK(read.response[position(true, true)] == Opcode::RC_READ_RESPONSE_ONLY);
  CHECK(read.response[position(true, false)] == Opcode::RC_READ_RESPONSE_FIRST);
  CHECK(read.response[position(false, false)] == Opcode::RC_READ_RESPONSE_MIDDLE);
  CHECK(read.response[position(false, true)] == Opcode::RC_READ_RESPONSE_LAST);
  CHECK(wr_info(WrOpcode::atomic_fetch_add).response[POS_ONLY] == Opcode::RC_ATOMIC_ACKNOWLEDGE);
  // What each means, as the verbs name them.
  CHECK(wr_info(WrOpcode::send_imm).wc_opcode == usrc::rc::WcOpcode::send);
  CHECK(wr_info(WrOpcode::rdma_write_imm).wc_opcode == usrc::rc::WcOpcode::rdma_write);
  CHECK(wr_info(WrOpcode::atomic_cmp_swp).wc_opcode == usrc::rc::WcOpcode::comp_swap);
  for (unsigned op = 0; op < 7; op++) {
    const auto *w = usrc::rc::wr_opcode_info(op);
    REQUIRE(w);
    const bool rd = op == 4 || op == 5 || op == 6;   // READ, CMP_AND_SWP, FETCH_AND_ADD
    CHECK(bool(w->mask & usrc::rc::WR_READ_OR_ATOMIC) == rd);
    CHECK(bool(w->mask & usrc::rc::WR_INLINE_OK) == !rd);
  }
  // SEND with Invalidate: its last packet carries the IETH; the local
  // operations have no packets.
  CHECK(ops(WrOpcode::send_inv, 1) == V{Opcode::RC_SEND_ONLY_INV});
  CHECK(ops(WrOpcode::send_inv, 2) == V{Opcode::RC_SEND_FIRST, Opcode::RC_SEND_LAST_INV});
  CHECK(wr_info(WrOpcode::local_inv).mask == usrc::rc::WR_LOCAL);
  CHECK(wr_info(WrOpcode::bind_mw).wc_opcode == usrc::rc::WcOpcode::bind_mw);
  CHECK(usrc::rc::wr_opcode_info(10) == nullptr);   // IBV_WR_TSO and on: not supported
}

TEST_CASE("the BTH and extended headers sit where IBA 9.2 and 9.3 put them", "[wire]") {
  Headers h;
  h.bth = {uint8_t(Opcode::RC_WRITE_ONLY_IMM), true, true, 0, 0, 0x8001, true, true,
           0xabcdef, true, 0x123456};
  h.reth = {0x0102030405060708, 0x090a0b0c, 0x11121314};
  h.imm_be = 0xddccbbaa;   // network order: bytes aa bb cc dd
  uint8_t out[kMaxHdrLen];
  REQUIRE(build_headers(h, 5, out) == 32);
  const uint8_t want[32] = {0x0b, 0xc0 | 0x30, 0x80, 0x01, 0xc0, 0xab, 0xcd, 0xef,
                            0x80, 0x12, 0x34, 0x56,                              // BTH, pad 3
                            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x11, 0x12, 0x13, 0x14,  // RETH
                            0xaa, 0xbb, 0xcc, 0xdd};                             // ImmDt
  CHECK(std::memcmp(out, want, 32) == 0);

  Headers a;
  a.bth.opcode = uint8_t(Opcode::RC_ATOMIC_ACKNOWLEDGE);
  a.aeth = {aeth_ack(), 0x000102};
  a.atomic_ack = 0xfedcba9876543210;
  REQUIRE(build_headers(a, 0, out) == 24);
  const uint8_t want_a[12] = {0x1f, 0x00, 0x01, 0x02, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10};
  CHECK(std::memcmp(out + 12, want_a, 12) == 0);

  Headers d;   // UD: DETH right after the BTH, its reserved byte zero
  d.bth.opcode = uint8_t(Opcode::UD_SEND_ONLY_IMM);
  d.deth = {0x11111111, 0x00001a};
  d.imm_be = 0x04030201;
  REQUIRE(build_headers(d, 0, out) == 24);
  const uint8_t want_d[12] = {0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x1a, 1, 2, 3, 4};
  CHECK(std::memcmp(out + 12, want_d, 12) == 0);

  Headers bad;
  bad.bth.opcode = 0x15;   // reserved
  CHECK(build_headers(bad, 0, out) == 0);
}

TEST_CASE("malformed packets are rejected", "[wire]") {
  std::mt19937_64 rng(2);
  Parsed p;
  std::unique_ptr<uint8_t[]> keep;

  SECTION("truncated at every length, every opcode") {
    for (int op = 0; op < 256; op++) {
      const OpcodeInfo *info = opcode_info(uint8_t(op));
      if (!info) continue;
      INFO(info->name);
      const bool has_payload = info->mask & HAS_PAYLOAD;
      const size_t len = has_payload ? ((info->mask & IS_LAST) ? 9 : 12) : 0;
      const auto pkt = make_packet(random_headers(rng, uint8_t(op)), std::vector<uint8_t>(len, 5));
      const uint8_t pad = pad_for(len);
      for (size_t n = 0; n < pkt.size(); n++) {
        INFO("length " << n);
        const ParseError e = parse_copy(pkt, n, p, keep);
        const size_t min = info->hdr_len + kIcrcLen;
        if (n < min) {
          CHECK(e == ParseError::too_short);
        } else if (!has_payload) {
          CHECK(false);   // unreachable: the whole packet is min bytes
        } else if (n - min < pad) {
          CHECK(e == ParseError::bad_pad);
        } else if ((n - min) % 4) {
          CHECK(e == ParseError::bad_length);
        } else {
          // Cut at a 4-byte boundary: a well-formed shorter packet (its
          // ICRC will be wrong; parse does not check it).
          CHECK(e == ParseError::ok);
          CHECK(p.payload_len == n - min - pad);
        }
      }
    }
  }
  SECTION("the opcode needs more headers than the packet holds") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
    auto pkt = make_packet(s, {});   // 16 bytes: BTH + ICRC
    for (Opcode op : {Opcode::RC_WRITE_ONLY, Opcode::RC_READ_REQUEST, Opcode::RC_ACKNOWLEDGE,
                      Opcode::RC_COMPARE_SWAP, Opcode::RC_SEND_ONLY_IMM, Opcode::UD_SEND_ONLY}) {
      pkt[0] = uint8_t(op);
      CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::too_short);
    }
    // A 40-byte WRITE_ONLY is 4 bytes short of a CMP_SWAP (40 + ICRC).
    s.bth.opcode = uint8_t(Opcode::RC_WRITE_ONLY);
    pkt = make_packet(s, std::vector<uint8_t>(8, 0));   // 28 + 8 + 4 = 40 bytes
    pkt[0] = uint8_t(Opcode::RC_COMPARE_SWAP);
    CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::too_short);
  }
  SECTION("unknown opcodes") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
    auto pkt = make_packet(s, std::vector<uint8_t>(64, 1));
    for (int op = 0; op < 256; op++) {
      pkt[0] = uint8_t(op);
      const ParseError e = parse_copy(pkt, pkt.size(), p, keep);
      if (!opcode_info(uint8_t(op))) CHECK(e == ParseError::bad_opcode);
    }
  }
  SECTION("transport header version other than 0") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
    auto pkt = make_packet(s, std::vector<uint8_t>(64, 1));
    for (uint8_t v = 1; v < 16; v++) {
      pkt[1] = uint8_t((pkt[1] & 0xf0) | v);
      CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::bad_tver);
    }
  }
  SECTION("payload and pad not a multiple of 4") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_LAST);
    auto pkt = make_packet(s, std::vector<uint8_t>(1024, 1));
    pkt.insert(pkt.end() - kIcrcLen, 0);
    CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::bad_length);
  }
  SECTION("pad count larger than the payload") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
    auto pkt = make_packet(s, {});
    pkt[1] |= 0x30;   // pad 3 and not a byte of payload
    CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::bad_pad);
  }
  SECTION("pad on a FIRST or MIDDLE packet") {
    for (Opcode op : {Opcode::RC_SEND_FIRST, Opcode::RC_WRITE_MIDDLE, Opcode::RC_READ_RESPONSE_FIRST,
                      Opcode::UC_SEND_MIDDLE}) {
      Headers s;
      s.bth.opcode = uint8_t(op);
      auto pkt = make_packet(s, std::vector<uint8_t>(256, 1));
      REQUIRE(parse_copy(pkt, pkt.size(), p, keep) == ParseError::ok);
      pkt[1] |= 0x10;
      CHECK(parse_copy(pkt, pkt.size(), p, keep) == ParseError::bad_pad);
    }
  }
  SECTION("payload or pad on an opcode without payload") {
    for (Opcode op : {Opcode::RC_ACKNOWLEDGE, Opcode::RC_READ_REQUEST, Opcode::RC_FETCH_ADD,
                      Opcode::RC_ATOMIC_ACKNOWLEDGE}) {
      Headers a;
      a.bth.opcode = uint8_t(op);
      const auto good = make_packet(a, {});
      REQUIRE(parse_copy(good, good.size(), p, keep) == ParseError::ok);
      CHECK(p.payload_len == 0);
      auto bad = good;
      bad.insert(bad.end() - kIcrcLen, 4, 0);
      CHECK(parse_copy(bad, bad.size(), p, keep) == ParseError::bad_length);
      bad = good;
      bad[1] |= 0x30;
      CHECK(parse_copy(bad, bad.size(), p, keep) == ParseError::bad_pad);
    }
  }
}

TEST_CASE("error names", "[wire]") {
  std::set<std::string> names;
  for (ParseError e : {ParseError::ok, ParseError::too_short, ParseError::bad_opcode,
                       ParseError::bad_tver, ParseError::bad_pad, ParseError::bad_length,
                       ParseError::bad_icrc})
    names.insert(to_string(e));
  CHECK(names.size() == 7);
}

TEST_CASE("AETH syndromes (IBA 9.7.5.1)", "[wire]") {
  CHECK(aeth_ack() == 0x1f);   // what we send, and rxe too
  CHECK(aeth_type(aeth_ack()) == AckType::ack);
  CHECK(aeth_type(aeth_ack(3)) == AckType::ack);
  CHECK(aeth_value(aeth_ack(3)) == 3);
  for (uint8_t t = 0; t < 32; t++) {
    CHECK(aeth_type(aeth_rnr_nak(t)) == AckType::rnr_nak);
    CHECK(aeth_value(aeth_rnr_nak(t)) == t);
  }
  CHECK(aeth_rnr_nak(26) == 0x3a);   // rxe's RNR NAK in the traces (timer 26)
  for (uint8_t c : {NAK_PSN_SEQ, NAK_INVALID_REQUEST, NAK_REMOTE_ACCESS, NAK_REMOTE_OP,
                    NAK_INVALID_RD}) {
    CHECK(aeth_type(aeth_nak(c)) == AckType::nak);
    CHECK(aeth_value(aeth_nak(c)) == c);
  }
  CHECK(aeth_nak(NAK_PSN_SEQ) == 0x60);
  CHECK(aeth_nak(NAK_REMOTE_ACCESS) == 0x62);   // rxe's answer to a bad rkey
  CHECK(aeth_type(0x40) == AckType::reserved);  // 10 in bits 6:5
  CHECK(aeth_type(0x9f) == AckType::reserved);  // bit 7 set
  static_assert(aeth_nak(NAK_REMOTE_OP) == 0x63);
}

TEST_CASE("the ICRC over gathered buffers, and what it covers", "[wire]") {
  Headers h;
  h.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
  h.bth.dest_qp = 0x1234;
  const auto pkt = make_packet(h, std::vector<uint8_t>(1000, 7));
  const size_t n = pkt.size() - kIcrcLen;
  uint8_t *d = const_cast<uint8_t *>(pkt.data());
  iovec whole{d, n};
  const uint32_t crc = icrc_ipv4(kIp, &whole, 1);

  // Any split, even inside the BTH, with empty pieces, gives the same CRC.
  for (size_t a : {size_t(0), size_t(1), size_t(4), size_t(5), size_t(11), size_t(12),
                   size_t(13), size_t(300), n}) {
    for (size_t b = a; b <= n; b += 97) {
      iovec parts[4] = {{d, a}, {d + a, 0}, {d + a, b - a}, {d + b, n - b}};
      CHECK(icrc_ipv4(kIp, parts, 4) == crc);
    }
  }
  // The variant fields of the BTH do not count: resv8a (FECN, BECN).
  auto variant = pkt;
  variant[4] = 0xc0;
  iovec v{variant.data(), n};
  CHECK(icrc_ipv4(kIp, &v, 1) == crc);
  // Every invariant field does.
  std::set<uint32_t> crcs{crc};
  for (int i = 0; i < 7; i++) {
    Ipv4Pseudo ip = kIp;
    switch (i) {
      case 0: ip.src_ip ^= 1; break;
      case 1: ip.dst_ip ^= 0x80000000; break;
      case 2: ip.src_port++; break;
      case 3: ip.dst_port++; break;
      case 4: ip.ip_id = 1; break;
      case 5: ip.dont_fragment = false; break;
      case 6: break;
    }
    if (i == 6) {
      auto changed = pkt;
      changed[100] ^= 1;   // one payload bit
      iovec c{changed.data(), n};
      crcs.insert(icrc_ipv4(ip, &c, 1));
    } else {
      crcs.insert(icrc_ipv4(ip, &whole, 1));
    }
  }
  CHECK(crcs.size() == 8);

  CHECK(check_icrc_ipv4(kIp, pkt.data(), pkt.size()) == ParseError::ok);
  auto bad = pkt;
  bad.back() ^= 0x80;
  CHECK(check_icrc_ipv4(kIp, bad.data(), bad.size()) == ParseError::bad_icrc);
  CHECK(check_icrc_ipv4(kIp, pkt.data(), kBthLen + kIcrcLen - 1) == ParseError::too_short);
  // Little-endian on the wire.
  uint8_t le[4];
  store_icrc(le, 0x11223344);
  CHECK((le[0] == 0x44 && le[1] == 0x33 && le[2] == 0x22 && le[3] == 0x11));
}

// The ICRC the slow, obvious way: copy the masked pseudo packet into one
// buffer and run zlib over it once (annex A17.3.3 as the rxe README states it).
uint32_t reference_icrc(const Ipv4Pseudo &ip, const std::vector<uint8_t> &udp_payload) {
  const size_t udp_len = 8 + udp_payload.size() + kIcrcLen, ip_len = 20 + udp_len;
  std::vector<uint8_t> b(8, 0xff);
  const uint8_t iph[20] = {0x45, 0xff, uint8_t(ip_len >> 8), uint8_t(ip_len),
                           uint8_t(ip.ip_id >> 8), uint8_t(ip.ip_id),
                           uint8_t(ip.dont_fragment ? 0x40 : 0), 0, 0xff, 17, 0xff, 0xff,
                           uint8_t(ip.src_ip >> 24), uint8_t(ip.src_ip >> 16),
                           uint8_t(ip.src_ip >> 8), uint8_t(ip.src_ip),
                           uint8_t(ip.dst_ip >> 24), uint8_t(ip.dst_ip >> 16),
                           uint8_t(ip.dst_ip >> 8), uint8_t(ip.dst_ip)};
  b.insert(b.end(), iph, iph + 20);
  const uint8_t udph[8] = {uint8_t(ip.src_port >> 8), uint8_t(ip.src_port),
                           uint8_t(ip.dst_port >> 8), uint8_t(ip.dst_port),
                           uint8_t(udp_len >> 8), uint8_t(udp_len), 0xff, 0xff};
  b.insert(b.end(), udph, udph + 8);
  const size_t bth = b.size();
  b.insert(b.end(), udp_payload.begin(), udp_payload.end());
  b[bth + 4] = 0xff;
  return uint32_t(crc32(0, b.data(), uInt(b.size())));
}

TEST_CASE("the ICRC equals a plain zlib CRC over the masked pseudo packet", "[wire]") {
  std::mt19937_64 rng(5);
  for (size_t len = kBthLen; len < 1200; len += (len < 600 ? 1 : 37)) {
    std::vector<uint8_t> pkt(len);
    for (auto &b : pkt) b = uint8_t(rng());
    const Ipv4Pseudo ip{uint32_t(rng()), uint32_t(rng()), uint16_t(rng()), kRoceV2Port,
                        uint16_t(rng()), bool(rng() & 1)};
    const size_t cut = kBthLen + rng() % (len - kBthLen + 1);
    iovec parts[2] = {{pkt.data(), cut}, {pkt.data() + cut, len - cut}};
    INFO("length " << len << " cut " << cut);
    CHECK(icrc_ipv4(ip, parts, 2) == reference_icrc(ip, pkt));
  }
}

// A receiver behind a UDP socket does not see the IP ID the ICRC covers:
// solve_ip_id finds it from the ICRC (any ID, any length), and finds none
// for a packet damaged elsewhere (but for 1 in 65536: the 16 bits left).
TEST_CASE("the IP ID an ICRC was computed with is solved for", "[wire]") {
  std::mt19937_64 rng(11);
  size_t refused = 0, damaged = 0;
  for (size_t len = kBthLen; len < 4200; len += 1 + rng() % 53) {
    std::vector<uint8_t> pkt(len);
    for (auto &b : pkt) b = uint8_t(rng());
    Ipv4Pseudo ip{uint32_t(rng()), uint32_t(rng()), uint16_t(rng()), kRoceV2Port, 0, true};
    iovec whole{pkt.data(), len};
    for (uint16_t want : {uint16_t(0), uint16_t(1), uint16_t(63), uint16_t(rng()), uint16_t(0xffff)}) {
      ip.ip_id = 0;
      const uint32_t icrc0 = icrc_ipv4(ip, &whole, 1);
      ip.ip_id = want;
      const uint32_t icrc = icrc_ipv4(ip, &whole, 1);
      uint16_t got = 0x5555;
      INFO("length " << len << " id " << want);
      REQUIRE(solve_ip_id(icrc0, icrc, len + kIcrcLen, &got));
      CHECK(got == want);
      // One bit flipped in the payload: no ID explains it (the packet
      // stays damaged: the next ID is tried on another packet).
      pkt[rng() % len] ^= uint8_t(1u << (rng() % 8));
      ip.ip_id = 0;
      damaged++;
      refused += !solve_ip_id(icrc_ipv4(ip, &whole, 1), icrc, len + kIcrcLen, &got);
    }
  }
  CHECK(refused == damaged);
}

TEST_CASE("parse survives random and mutated input", "[wire]") {
  std::mt19937_64 rng(7);
  // Well-formed packets of every opcode to mutate.
  std::vector<std::vector<uint8_t>> bases;
  for (int op = 0; op < 256; op++)
    if (const OpcodeInfo *info = opcode_info(uint8_t(op)))
      bases.push_back(make_packet(random_headers(rng, uint8_t(op)),
                                  std::vector<uint8_t>(info->mask & HAS_PAYLOAD ? 60 : 0, 3)));
  size_t ok = 0, errors[7] = {};
  std::unique_ptr<uint8_t[]> keep;
  for (int i = 0; i < 100000; i++) {
    std::vector<uint8_t> buf;
    if (i % 4 == 0) {
      buf.resize(rng() % 120);
      for (auto &b : buf) b = uint8_t(rng());
    } else {
      buf = bases[rng() % bases.size()];
      const int flips = 1 + int(rng() % 3);
      for (int k = 0; k < flips; k++) buf[rng() % buf.size()] ^= uint8_t(1u << (rng() % 8));
      if (rng() & 1) buf.resize(rng() % (buf.size() + 1));
    }
    Parsed p;
    const ParseError e = parse_copy(buf, buf.size(), p, keep);
    errors[int(e)]++;
    if (e == ParseError::ok) {
      ok++;
      REQUIRE(p.info == opcode_info(keep[0]));
      REQUIRE(p.payload == keep.get() + p.info->hdr_len);
      REQUIRE(p.payload + p.payload_len + p.h.bth.pad_cnt + kIcrcLen == keep.get() + buf.size());
    }
  }
  CHECK(ok > 1000);
  CHECK(errors[int(ParseError::too_short)] > 0);
  CHECK(errors[int(ParseError::bad_opcode)] > 0);
  CHECK(errors[int(ParseError::bad_tver)] > 0);
  CHECK(errors[int(ParseError::bad_pad)] > 0);
  CHECK(errors[int(ParseError::bad_length)] > 0);
}
