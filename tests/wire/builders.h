// Every opcode through every header builder usrc has: the general one
// (build_headers) and the per-packet ones the transport's short paths use
// (put_request, which finds the RETH and ImmDt through the opcode table;
// the BTH words a WQE precomputes with put_request_ext from the opcode's
// HAS_RETH/HAS_IMMDT bits; put_ack). Each case holds what each builder wrote for the same headers;
// test_wire compares them byte for byte with build_headers(), test_tshark
// has Wireshark dissect all of them.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "usrc/wire/packet.h"

namespace usrc::test {

struct Built {
  std::string builder;
  std::vector<uint8_t> hdr;   // the header bytes it wrote (hdr_len of them)
};

struct BuildCase {
  wire::Headers h;
  size_t payload_len = 0;
  std::vector<Built> built;   // built[0]: build_headers()
};

// Payload lengths: a packet that ends its message pads; FIRST/MIDDLE carry
// a whole PMTU.
inline size_t payload_for(const wire::OpcodeInfo &info, uint32_t salt) {
  if (!(info.mask & wire::HAS_PAYLOAD)) return 0;
  if (!(info.mask & wire::IS_LAST)) return 1024;
  return 61 + salt % 4;   // every pad count over the cases
}

// The headers usrc sends: P_Key 0xffff; M, TVer, F, B and the reserved
// bits 0. Every other field varies.
inline wire::Headers sent_headers(std::mt19937 &rng_, uint8_t op) {
  auto rng = [&] { return uint32_t(rng_()); };
  wire::Headers h;
  h.bth.opcode = op;
  h.bth.se = rng() & 1;
  h.bth.dest_qp = rng() & wire::kMask24;
  h.bth.ack_req = rng() & 1;
  h.bth.psn = rng() & wire::kMask24;
  h.reth = {uint64_t(rng()) << 32 | rng(), uint32_t(rng()), uint32_t(rng())};
  h.aeth = {uint8_t(rng() & 0x7f), rng() & wire::kMask24};
  h.atomic = {uint64_t(rng()) << 32 | rng(), uint32_t(rng()), uint64_t(rng()) << 32 | rng(),
              uint64_t(rng()) << 32 | rng()};
  h.atomic_ack = uint64_t(rng()) << 32 | rng();
  h.imm_be = uint32_t(rng());
  h.ieth = uint32_t(rng());
  h.deth = {uint32_t(rng()), rng() & wire::kMask24};
  h.xrc_srqn = rng() & wire::kMask24;
  return h;
}

// Runs one builder into a buffer of garbage (so a byte it leaves unwritten
// shows), keeping hdr_len bytes.
template <class F>
Built run_builder(const char *name, size_t hdr_len, F build) {
  std::vector<uint8_t> buf(wire::kMaxHdrLen, 0xa5);
  build(buf.data());
  buf.resize(hdr_len);
  return {name, buf};
}

inline std::vector<BuildCase> every_opcode_every_builder(uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::vector<BuildCase> cases;
  for (int op = 0; op < 256; op++) {
    const wire::OpcodeInfo *info = wire::opcode_info(uint8_t(op));
    if (!info) continue;
    const int variants = op == int(wire::Opcode::RC_ACKNOWLEDGE) ? 4 : 1;
    for (int var = 0; var < variants; var++) {
      BuildCase c;
      c.h = sent_headers(rng, uint8_t(op));
      if (op == int(wire::Opcode::RC_ACKNOWLEDGE)) {   // ACK, RNR NAK, NAKs
        const uint8_t syn[4] = {wire::aeth_ack(), wire::aeth_rnr_nak(14),
                                wire::aeth_nak(wire::NAK_PSN_SEQ), wire::aeth_nak(wire::NAK_REMOTE_ACCESS)};
        c.h.aeth.syndrome = syn[var];
        c.h.bth.se = c.h.bth.ack_req = false;   // (an ACK asks for nothing)
      }
      c.payload_len = payload_for(*info, uint32_t(cases.size()));
      const wire::Headers &h = c.h;
      const size_t len = c.payload_len;
      c.built.push_back(run_builder("build_headers", info->hdr_len,
                                    [&](uint8_t *p) { wire::build_headers(h, len, p); }));
      const uint32_t m = info->mask;
      // SEND, WRITE and READ requests and our placed WRITE: what
      // put_request writes (the requester's per-packet path).
      // (SEND with Invalidate passes its R_Key where the immediate data
      // goes, the XRCETH's SRQ number last.)
      const bool request_ext_only = (m & wire::IS_REQUEST) && !(m & (wire::HAS_DETH | wire::HAS_ATOMICETH));
      if (request_ext_only) {
        c.built.push_back(run_builder("put_request", info->hdr_len, [&](uint8_t *p) {
          uint8_t *pay = wire::put_request(p, h.bth.opcode, h.bth.se, len, h.bth.dest_qp, h.bth.ack_req,
                                           h.bth.psn, h.reth.va, h.reth.rkey, h.reth.dma_len,
                                           (m & wire::HAS_IETH) ? h.ieth : h.imm_be, h.xrc_srqn);
          if (pay != p + info->hdr_len) std::memset(p, 0, wire::kMaxHdrLen);   // (shows as a mismatch)
        }));
      }
      // The in-place path (RC and UC SENDs and WRITEs without invalidate):
      // BTH word 0 computed at post time, words 1 and 2 at send time.
      if (request_ext_only && !(m & (wire::HAS_IETH | wire::HAS_XRCETH))) {
        c.built.push_back(run_builder("bth words + put_request_ext", info->hdr_len, [&](uint8_t *p) {
          const uint32_t w0 = wire::bth::word0(h.bth.opcode, h.bth.se, wire::pad_for(len));
          wire::bth::put_words(p, w0, wire::bth::word1(h.bth.dest_qp),
                               wire::bth::word2(h.bth.psn, h.bth.ack_req));
          const uint32_t ext = info->mask & (wire::HAS_RETH | wire::HAS_IMMDT);   // (what a WQE keeps)
          uint8_t *pay = wire::put_request_ext(p, ext, h.reth.va, h.reth.rkey, h.reth.dma_len, h.imm_be);
          if (pay != p + info->hdr_len) std::memset(p, 0, wire::kMaxHdrLen);
        }));
      }
      if (op == int(wire::Opcode::RC_ACKNOWLEDGE)) {
        c.built.push_back(run_builder("put_ack", info->hdr_len, [&](uint8_t *p) {
          if (wire::put_ack(p, h.aeth.syndrome, h.aeth.msn, h.bth.dest_qp, h.bth.psn) != info->hdr_len)
            std::memset(p, 0, wire::kMaxHdrLen);
        }));
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace usrc::test
