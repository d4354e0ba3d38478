// RoCE v2 packets: the IBA base transport header and extended headers in a
// UDP payload, with the ICRC at the end (IBA vol. 1 ch. 9, annex A17).
// The opcode table (opcode.h) describes every opcode (which headers, where,
// what the packet does); the builders and the parser below all follow it
// and write and read the fields through hdr.h's accessors. parse() never
// trusts input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "usrc/wire/hdr.h"
#include "usrc/wire/opcode.h"

namespace usrc::wire {

struct Bth {
  uint8_t opcode = 0;
  bool se = false, mig_req = false;
  uint8_t pad_cnt = 0, tver = 0;
  uint16_t pkey = 0xffff;
  bool fecn = false, becn = false;
  uint32_t dest_qp = 0;   // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;       // 24 bits
};
struct Reth { uint64_t va = 0; uint32_t rkey = 0; uint32_t dma_len = 0; };
struct Aeth { uint8_t syndrome = 0; uint32_t msn = 0; };
struct AtomicEth { uint64_t va = 0; uint32_t rkey = 0; uint64_t swap_add = 0, compare = 0; };
struct Deth { uint32_t qkey = 0; uint32_t src_qp = 0; };

// AETH syndrome (IBA 9.7.5.1, table 44): bit 7 reserved, bits 6:5 say what
// the packet is, bits 4:0 carry a value: 00 ACK (value: credit count; 0x1f
// means the end-to-end credits are not used), 01 RNR NAK (value: RNR timer
// code), 11 NAK (value: NakCode), 10 reserved.
enum class AckType { ack, rnr_nak, nak, reserved };
enum NakCode : uint8_t {
  NAK_PSN_SEQ = 0, NAK_INVALID_REQUEST = 1, NAK_REMOTE_ACCESS = 2, NAK_REMOTE_OP = 3,
  NAK_INVALID_RD = 4,
};
constexpr AckType aeth_type(uint8_t syndrome) {
  switch (syndrome >> 5) {   // bit 7 set (reserved): not a valid syndrome either
    case 0: return AckType::ack;
    case 1: return AckType::rnr_nak;
    case 3: return AckType::nak;
    default: return AckType::reserved;
  }
}
constexpr uint8_t aeth_value(uint8_t syndrome) { return syndrome & 0x1f; }
// An ACK's credit count (IBA 9.7.7.2, end-to-end flow control): the receive
// WQEs the responder has beyond the message the MSN names, coded as the
// largest of 0, 1, 2, 3, 4, 6, 8, 12, 16, ... 24576, 32768 (codes 0 to 30)
// not above it. kNoCredits (0x1f, "invalid"): the responder gives none (an
// SRQ's, or one that does not count them, as rxe).
constexpr uint8_t kNoCredits = 0x1f;
constexpr uint32_t credit_count(uint8_t code) {
  return code < 4 ? code : (code & 1) ? 3u << ((code - 3) / 2) : 1u << (code / 2);
}
constexpr uint8_t credit_code(uint64_t wqes) {
  uint8_t c = 0;
  while (c < 30 && credit_count(c + 1) <= wqes) c++;
  return c;
}
static_assert(credit_count(5) == 6 && credit_count(13) == 96 && credit_count(30) == 32768);
static_assert(credit_code(0) == 0 && credit_code(5) == 4 && credit_code(512) == 18 && credit_code(1u << 20) == 30);
constexpr uint8_t aeth_ack(uint8_t credits = kNoCredits) { return credits & 0x1f; }
constexpr uint8_t aeth_rnr_nak(uint8_t timer) { return 0x20 | (timer & 0x1f); }
constexpr uint8_t aeth_nak(uint8_t code) { return 0x60 | (code & 0x1f); }

// All headers of a packet in host byte order, except imm_be which stays in
// network order as ibv_wc/ibv_send_wr carry it.
struct Headers {
  Bth bth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic;
  uint64_t atomic_ack = 0;
  uint32_t imm_be = 0;
  uint32_t ieth = 0;
  uint32_t xrc_srqn = 0;   // XRCETH
  Deth deth;
};

enum class ParseError {
  ok,
  too_short,    // shorter than BTH + the opcode's extended headers + ICRC
  bad_opcode,   // not in the opcode table
  bad_tver,     // BTH TVer other than 0, the only version (IBA 9.2)
  bad_pad,      // pad count larger than what follows the headers, pad on a
                // packet without payload, or on a FIRST/MIDDLE packet
  bad_length,   // payload + pad not a multiple of 4, or payload on an
                // opcode that carries none
  bad_icrc,     // only from check_icrc_ipv4() (icrc.h)
};
const char *to_string(ParseError e);

struct Parsed {
  Headers h;
  const OpcodeInfo *info = nullptr;
  const uint8_t *bth = nullptr;   // the packet: its BTH, then the headers view() finds
  HdrView view() const { return {bth, info}; }
  const uint8_t *payload = nullptr;
  size_t payload_len = 0;   // without pad and ICRC
  uint32_t icrc = 0;        // as on the wire (stored little-endian)
};

constexpr uint8_t pad_for(size_t payload_len) {
  return static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
}

// buf/len: the whole UDP payload, ICRC included. Reads only buf[0, len);
// does not check the ICRC (that needs the IP header: see icrc.h). On error
// `out` holds nothing useful.
ParseError parse(const uint8_t *buf, size_t len, Parsed &out);
// Writes the BTH and the extended headers of h.bth.opcode into out (at least
// kMaxHdrLen bytes); pad_cnt comes from payload_len. Returns the header
// length, 0 for an invalid opcode. The general builder: the others below
// write the same bytes for what they cover (tests/wire checks it).
size_t build_headers(const Headers &h, size_t payload_len, uint8_t *out);

// The per-packet builders, for paths that build without a Headers struct.
// Both write what build_headers() writes for a packet usrc sends (P_Key
// 0xffff; M, TVer, F, B and the reserved bits 0).
//
// A SEND or RDMA WRITE request's extended headers after the BTH at b: the
// RETH (va, rkey, dma_len) and the immediate data, or the IETH (the R_Key
// to invalidate, passed in host order as imm_be), as the opcode's row has
// them (others are not written). Returns where the payload goes.
[[gnu::always_inline]] inline uint8_t *put_request_ext(uint8_t *b, const OpcodeInfo &info, uint64_t va,
                                                       uint32_t rkey, uint32_t dma_len, uint32_t imm_be,
                                                       uint32_t xrc_srqn = 0) {
  const HdrOut o{b, &info};
  if (o.has(HAS_XRCETH)) xrceth::put(o.at(XRCETH), xrc_srqn);
  if (o.has(HAS_RETH)) reth::put(o.at(RETH), va, rkey, dma_len);
  if (o.has(HAS_IMMDT)) immdt::put_be(o.at(IMMDT), imm_be);
  if (o.has(HAS_IETH)) ieth::put(o.at(IETH), imm_be);
  return o.payload();
}
// The same for a caller that kept only the opcode's HAS_RETH and HAS_IMMDT
// bits (the in-place path, which reads no table row per packet): in every
// SEND and WRITE request the RETH follows the BTH and the ImmDt follows
// that (checked against the table below).
[[gnu::always_inline]] inline uint8_t *put_request_ext(uint8_t *b, uint32_t reth_immdt, uint64_t va, uint32_t rkey,
                                                       uint32_t dma_len, uint32_t imm_be) {
  uint8_t *p = b + kBthLen;
  if (reth_immdt & HAS_RETH) {
    reth::put(p, va, rkey, dma_len);
    p += kRethLen;
  }
  if (reth_immdt & HAS_IMMDT) {
    immdt::put_be(p, imm_be);
    p += kImmDtLen;
  }
  return p;
}
namespace detail {
constexpr bool send_write_ext_ok() {
  for (const OpcodeInfo &i : kOpcodeTable) {
    if (!i.name || !(i.mask & IS_REQUEST) || !(i.mask & (IS_SEND | IS_WRITE))) continue;
    if (i.mask & (HAS_DETH | HAS_IETH | HAS_XRCETH)) continue;   // (not built this way)
    const size_t reth = i.mask & HAS_RETH ? kRethLen : 0, imm = i.mask & HAS_IMMDT ? kImmDtLen : 0;
    if ((reth && i.offset[RETH] != kBthLen) || (imm && i.offset[IMMDT] != kBthLen + reth) ||
        i.hdr_len != kBthLen + reth + imm)
      return false;
  }
  return true;
}
static_assert(send_write_ext_ok());
}  // namespace detail
// A whole SEND or RDMA WRITE request header: BTH (a payload of payload_len
// bytes) and put_request_ext()'s. Returns where the payload goes.
[[gnu::always_inline]] inline uint8_t *put_request(uint8_t *b, uint8_t opcode, bool se, size_t payload_len,
                                                   uint32_t dest_qp, bool ack_req, uint32_t psn, uint64_t va,
                                                   uint32_t rkey, uint32_t dma_len, uint32_t imm_be,
                                                   uint32_t xrc_srqn = 0) {
  bth::put(b, opcode, se, pad_for(payload_len), dest_qp, ack_req, psn);
  return put_request_ext(b, kOpcodeTable[opcode], va, rkey, dma_len, imm_be, xrc_srqn);
}
// An ACKNOWLEDGE (ACK or NAK, the AETH's syndrome says): BTH and AETH.
// Returns the header length.
constexpr size_t kAckHdrLen = kBthLen + kAethLen;
static_assert(info_of(Opcode::RC_ACKNOWLEDGE).hdr_len == kAckHdrLen);
inline size_t put_ack(uint8_t *b, uint8_t syndrome, uint32_t msn, uint32_t dest_qp, uint32_t psn) {
  bth::put(b, static_cast<uint8_t>(Opcode::RC_ACKNOWLEDGE), false, 0, dest_qp, false, psn);
  aeth::put(b + info_of(Opcode::RC_ACKNOWLEDGE).offset[AETH], syndrome, msn);
  return kAckHdrLen;
}

}  // namespace usrc::wire
