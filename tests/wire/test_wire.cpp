// The wire codec: build/parse round trips for every opcode, rejection of
// malformed packets, and a fuzz loop (parse must never read out of bounds;
// run under ASan/valgrind to see it).
#include <catch2/catch.hpp>

#include <random>

#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc::wire;

namespace {

std::vector<uint8_t> make_packet(const Headers &h, const std::vector<uint8_t> &payload) {
  std::vector<uint8_t> pkt(kMaxHdrLen);
  size_t hl = build_headers(h, payload.size(), pkt.data());
  REQUIRE(hl > 0);
  pkt.resize(hl);
  pkt.insert(pkt.end(), payload.begin(), payload.end());
  pkt.insert(pkt.end(), pad_for(payload.size()), 0);
  iovec iov{pkt.data(), pkt.size()};
  uint32_t crc = icrc_ipv4({0x0a000001, 0x0a000002, 20001, 20002}, &iov, 1);
  pkt.resize(pkt.size() + 4);
  store_icrc(pkt.data() + pkt.size() - 4, crc);
  return pkt;
}

}  // namespace

TEST_CASE("every opcode round-trips through build and parse", "[wire]") {
  std::mt19937_64 rng(1);
  int opcodes = 0;
  for (int op = 0; op < 256; op++) {
    const OpcodeInfo *info = opcode_info(static_cast<uint8_t>(op));
    if (!info) continue;
    opcodes++;
    for (int iter = 0; iter < 50; iter++) {
      Headers h;
      h.bth.opcode = static_cast<uint8_t>(op);
      h.bth.se = rng() & 1;
      h.bth.mig_req = rng() & 1;
      h.bth.pkey = static_cast<uint16_t>(rng());
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
      std::vector<uint8_t> payload;
      if (info->mask & HAS_PAYLOAD) payload.resize(rng() % 4097);
      for (auto &b : payload) b = uint8_t(rng());
      auto pkt = make_packet(h, payload);
      Parsed p;
      REQUIRE(parse(pkt.data(), pkt.size(), p) == ParseError::ok);
      CHECK(p.info == info);
      CHECK(p.h.bth.opcode == op);
      CHECK(p.h.bth.psn == h.bth.psn);
      CHECK(p.h.bth.dest_qp == h.bth.dest_qp);
      CHECK(p.h.bth.ack_req == h.bth.ack_req);
      CHECK(p.h.bth.se == h.bth.se);
      CHECK(p.h.bth.pkey == h.bth.pkey);
      CHECK(p.h.bth.pad_cnt == pad_for(payload.size()));
      if (info->mask & HAS_RETH) {
        CHECK(p.h.reth.va == h.reth.va);
        CHECK(p.h.reth.rkey == h.reth.rkey);
        CHECK(p.h.reth.dma_len == h.reth.dma_len);
      }
      if (info->mask & HAS_AETH) {
        CHECK(p.h.aeth.syndrome == h.aeth.syndrome);
        CHECK(p.h.aeth.msn == h.aeth.msn);
      }
      if (info->mask & HAS_ATOMICETH) {
        CHECK(p.h.atomic.va == h.atomic.va);
        CHECK(p.h.atomic.swap_add == h.atomic.swap_add);
        CHECK(p.h.atomic.compare == h.atomic.compare);
      }
      if (info->mask & HAS_ATOMICACKETH) CHECK(p.h.atomic_ack == h.atomic_ack);
      if (info->mask & HAS_IMMDT) CHECK(p.h.imm_be == h.imm_be);
      if (info->mask & HAS_IETH) CHECK(p.h.ieth == h.ieth);
      if (info->mask & HAS_DETH) CHECK(p.h.deth.src_qp == h.deth.src_qp);
      REQUIRE(p.payload_len == payload.size());
      CHECK(std::equal(payload.begin(), payload.end(), p.payload));
      iovec iov{pkt.data(), pkt.size() - 4};
      CHECK(icrc_ipv4({0x0a000001, 0x0a000002, 20001, 20002}, &iov, 1) == p.icrc);
    }
  }
  CHECK(opcodes == 23 + 12 + 2);   // RC, UC, UD
}

TEST_CASE("the ICRC is the same over a gathered packet", "[wire]") {
  Headers h;
  h.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
  std::vector<uint8_t> payload(1000, 7);
  auto pkt = make_packet(h, payload);
  size_t hl = opcode_info(h.bth.opcode)->hdr_len;
  iovec whole{pkt.data(), pkt.size() - 4};
  iovec parts[3] = {{pkt.data(), hl}, {pkt.data() + hl, 300}, {pkt.data() + hl + 300, 700}};
  Ipv4Pseudo ip{1, 2, 3, 4};
  CHECK(icrc_ipv4(ip, &whole, 1) == icrc_ipv4(ip, parts, 3));
  // Every field of the pseudo header matters.
  Ipv4Pseudo ip2 = ip;
  ip2.ip_id = 1;
  CHECK(icrc_ipv4(ip, &whole, 1) != icrc_ipv4(ip2, &whole, 1));
  ip2 = ip;
  ip2.dst_port = 5;
  CHECK(icrc_ipv4(ip, &whole, 1) != icrc_ipv4(ip2, &whole, 1));
}

TEST_CASE("malformed packets are rejected", "[wire]") {
  Headers h;
  h.bth.opcode = uint8_t(Opcode::RC_WRITE_FIRST);
  auto good = make_packet(h, std::vector<uint8_t>(1024, 1));
  Parsed p;
  REQUIRE(parse(good.data(), good.size(), p) == ParseError::ok);

  SECTION("truncated at every length of the headers") {
    for (size_t n = 0; n < kBthLen + kRethLen + kIcrcLen; n++)
      CHECK(parse(good.data(), n, p) != ParseError::ok);
  }
  SECTION("unknown opcode") {
    for (uint8_t op : {0x15, 0x18, 0x1f, 0x2c, 0x40, 0x63, 0x66, 0xff}) {
      auto bad = good;
      bad[0] = op;
      CHECK(parse(bad.data(), bad.size(), p) == ParseError::bad_opcode);
    }
  }
  SECTION("transport header version other than 0") {
    auto bad = good;
    bad[1] |= 0x01;
    CHECK(parse(bad.data(), bad.size(), p) == ParseError::bad_tver);
  }
  SECTION("payload not a multiple of 4 with its pad") {
    auto bad = good;
    bad.insert(bad.end() - 4, 0);
    CHECK(parse(bad.data(), bad.size(), p) == ParseError::bad_length);
  }
  SECTION("an ACK with a payload or a pad count") {
    Headers a;
    a.bth.opcode = uint8_t(Opcode::RC_ACKNOWLEDGE);
    auto ack = make_packet(a, {});
    REQUIRE(parse(ack.data(), ack.size(), p) == ParseError::ok);
    auto bad = ack;
    bad.insert(bad.end() - 4, 4, 0);
    CHECK(parse(bad.data(), bad.size(), p) == ParseError::bad_length);
    bad = ack;
    bad[1] |= 0x30;
    CHECK(parse(bad.data(), bad.size(), p) == ParseError::bad_pad);
  }
  SECTION("pad count larger than the payload") {
    Headers s;
    s.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY);
    auto pkt = make_packet(s, {});
    pkt[1] |= 0x30;   // pad 3 with no payload bytes at all
    CHECK(parse(pkt.data(), pkt.size(), p) == ParseError::bad_pad);
  }
}

TEST_CASE("AETH syndromes (IBA 9.7.5.1)", "[wire]") {
  CHECK(aeth_type(aeth_ack()) == AckType::ack);
  CHECK(aeth_ack() == 0x1f);
  CHECK(aeth_type(aeth_rnr_nak(12)) == AckType::rnr_nak);
  CHECK(aeth_value(aeth_rnr_nak(12)) == 12);
  CHECK(aeth_nak(NAK_PSN_SEQ) == 0x60);
  CHECK(aeth_nak(NAK_REMOTE_ACCESS) == 0x62);   // what rxe sends for a bad rkey
  CHECK(aeth_type(0x3a) == AckType::rnr_nak);   // rxe's RNR NAK in the traces
  CHECK(aeth_type(0x40) == AckType::reserved);
}

TEST_CASE("parse survives random and mutated input", "[wire]") {
  std::mt19937_64 rng(7);
  Headers h;
  h.bth.opcode = uint8_t(Opcode::RC_SEND_ONLY_IMM);
  auto base = make_packet(h, std::vector<uint8_t>(100, 3));
  size_t ok = 0;
  for (int i = 0; i < 100000; i++) {
    std::vector<uint8_t> buf;
    if (i & 1) {
      buf.resize(rng() % 200);
      for (auto &b : buf) b = uint8_t(rng());
    } else {
      buf = base;
      for (int k = 0; k < 3; k++) buf[rng() % buf.size()] = uint8_t(rng());
      buf.resize(rng() % (buf.size() + 1));
    }
    // Exactly-sized heap copy so that an overread is caught by ASan/valgrind.
    std::unique_ptr<uint8_t[]> copy(new uint8_t[buf.size() + 1]);
    std::copy(buf.begin(), buf.end(), copy.get());
    Parsed p;
    if (parse(copy.get(), buf.size(), p) == ParseError::ok) {
      ok++;
      REQUIRE(p.payload >= copy.get());
      REQUIRE(p.payload + p.payload_len + p.h.bth.pad_cnt + kIcrcLen == copy.get() + buf.size());
    }
  }
  CHECK(ok > 0);
}
