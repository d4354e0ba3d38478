// The opcode table (IBA vol. 1 9.2.1 table 38, 9.3): for every BTH opcode
// its name, which headers it has, where each starts, and what the packet
// does. Built at compile time, so that a lookup with a constant opcode
// folds to constants (a fast path's header length, an offset). The
// second layer of header accessors is here too: the fields of a packet's
// headers found through the table (hdr.h has the raw layer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "usrc/wire/hdr.h"

namespace usrc::wire {

// IBA 9.2.1 table 38 (RC 000b, UC 001b, UD 011b, XRC 101b in the top three
// bits; an XRC opcode is its RC one with 0xa0 added).
enum class Opcode : uint8_t {
  RC_SEND_FIRST = 0x00, RC_SEND_MIDDLE = 0x01, RC_SEND_LAST = 0x02, RC_SEND_LAST_IMM = 0x03,
  RC_SEND_ONLY = 0x04, RC_SEND_ONLY_IMM = 0x05, RC_WRITE_FIRST = 0x06, RC_WRITE_MIDDLE = 0x07,
  RC_WRITE_LAST = 0x08, RC_WRITE_LAST_IMM = 0x09, RC_WRITE_ONLY = 0x0a,
  RC_WRITE_ONLY_IMM = 0x0b, RC_READ_REQUEST = 0x0c, RC_READ_RESPONSE_FIRST = 0x0d,
  RC_READ_RESPONSE_MIDDLE = 0x0e, RC_READ_RESPONSE_LAST = 0x0f, RC_READ_RESPONSE_ONLY = 0x10,
  RC_ACKNOWLEDGE = 0x11, RC_ATOMIC_ACKNOWLEDGE = 0x12, RC_COMPARE_SWAP = 0x13,
  RC_FETCH_ADD = 0x14, RC_SEND_LAST_INV = 0x16, RC_SEND_ONLY_INV = 0x17, RC_ATOMIC_WRITE = 0x1d,
  UC_SEND_FIRST = 0x20, UC_SEND_MIDDLE = 0x21, UC_SEND_LAST = 0x22, UC_SEND_LAST_IMM = 0x23,
  UC_SEND_ONLY = 0x24, UC_SEND_ONLY_IMM = 0x25, UC_WRITE_FIRST = 0x26, UC_WRITE_MIDDLE = 0x27,
  UC_WRITE_LAST = 0x28, UC_WRITE_LAST_IMM = 0x29, UC_WRITE_ONLY = 0x2a,
  UC_WRITE_ONLY_IMM = 0x2b,
  UD_SEND_ONLY = 0x64, UD_SEND_ONLY_IMM = 0x65,
  XRC_SEND_ONLY = 0xa4, XRC_ACKNOWLEDGE = 0xb1,
  // Manufacturer-specific opcode (IBA table 38, 110xxxxxb), ours: an RDMA
  // WRITE whose data the requester has already placed in the responder's
  // memory (same-host direct placement): BTH + RETH, no payload. The
  // responder only takes its PSN and acknowledges it; it accepts it only
  // through shared memory from this host (RxPacket::trusted).
  USRC_WRITE_PLACED = 0xc0,
};

enum HdrMask : uint32_t {
  HAS_RETH = 1u << 0, HAS_AETH = 1u << 1, HAS_ATOMICETH = 1u << 2, HAS_ATOMICACKETH = 1u << 3,
  HAS_IMMDT = 1u << 4, HAS_IETH = 1u << 5, HAS_DETH = 1u << 6, HAS_PAYLOAD = 1u << 7,
  IS_REQUEST = 1u << 8,    // requester to responder: SEND, WRITE, READ request, atomics
  IS_RESPONSE = 1u << 9,   // READ response, ACK, ATOMIC ACK: handled by the completer
  // Position in a message. An ONLY packet both starts and ends its message,
  // so it carries IS_FIRST | IS_LAST | IS_ONLY: test IS_FIRST for "starts a
  // message", IS_LAST for "ends one", IS_ONLY for "is the whole message".
  // Single-packet opcodes (READ request, ACK, atomics) are ONLY packets.
  IS_FIRST = 1u << 10,
  IS_MIDDLE = 1u << 11,
  IS_LAST = 1u << 12,
  IS_ONLY = 1u << 18,
  IS_SEND = 1u << 13, IS_WRITE = 1u << 14, IS_READ = 1u << 15, IS_ATOMIC = 1u << 16,
  CONSUMES_RWQE = 1u << 17,   // the responder takes a receive WQE (SEND, WRITE with immediate)
  // The transport service of the opcode (its top three bits, IBA 9.2.1);
  // USRC_WRITE_PLACED has none of them.
  IS_RC = 1u << 19, IS_UC = 1u << 20, IS_UD = 1u << 21, IS_XRC = 1u << 22,
  HAS_XRCETH = 1u << 23,   // an XRC request: the target's SRQ number
};
constexpr uint8_t kXrcOpcodeBase = 0xa0;   // XRC opcode = RC opcode + this

// The headers of a packet, in wire order (IBA 9.2: BTH, then DETH, XRCETH,
// RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH), and the payload after
// them.
enum Hdr : uint8_t { BTH, DETH, XRCETH, RETH, ATOMICETH, AETH, ATOMICACKETH, IMMDT, IETH, PAYLOAD, kNumHdr };

struct OpcodeInfo {
  const char *name;   // as IBA table 38 names it, e.g. "RC_RDMA_WRITE_FIRST"
  uint32_t mask;      // HdrMask bits
  uint8_t hdr_len;    // BTH + extended headers; the payload starts here
  // Where each header starts, from the BTH (rxe's offset[]): meaningful for
  // the headers the mask has (HAS_*), 0 for the others; offset[PAYLOAD] is
  // hdr_len.
  uint8_t offset[kNumHdr];
};

namespace detail {

constexpr uint32_t kHas[kNumHdr] = {0,         HAS_DETH,  HAS_XRCETH, HAS_RETH,  HAS_ATOMICETH, HAS_AETH,
                                    HAS_ATOMICACKETH, HAS_IMMDT, HAS_IETH, 0};
constexpr size_t kLen[kNumHdr] = {kBthLen,   kDethLen,  kXrcEthLen, kRethLen, kAtomicEthLen, kAethLen,
                                  kAtomicAckEthLen, kImmDtLen, kIethLen, 0};

constexpr OpcodeInfo make_info(const char *name, uint32_t mask) {
  OpcodeInfo info{name, mask, 0, {}};
  size_t at = 0;
  for (int h = BTH; h < kNumHdr; h++) {
    if (h != BTH && h != PAYLOAD && !(mask & kHas[h])) continue;
    info.offset[h] = static_cast<uint8_t>(at);
    at += kLen[h];
  }
  info.hdr_len = info.offset[PAYLOAD];
  return info;
}

struct Row { uint8_t op; const char *name; uint32_t mask; };

constexpr uint32_t kReq = IS_REQUEST, kResp = IS_RESPONSE, kPay = HAS_PAYLOAD;
constexpr uint32_t kF = IS_FIRST, kM = IS_MIDDLE, kL = IS_LAST, kO = IS_FIRST | IS_LAST | IS_ONLY;

// One row per opcode: its name and mask (the headers follow from the mask).
constexpr Row kRows[] = {
#define USRC_SENDS(base, P, extra)                                                             \
  {base + 0x00, P "SEND_FIRST", kReq | kPay | IS_SEND | kF | extra},                           \
  {base + 0x01, P "SEND_MIDDLE", kReq | kPay | IS_SEND | kM | extra},                          \
  {base + 0x02, P "SEND_LAST", kReq | kPay | IS_SEND | kL | CONSUMES_RWQE | extra},            \
  {base + 0x03, P "SEND_LAST_WITH_IMMEDIATE",                                                  \
   kReq | kPay | IS_SEND | kL | HAS_IMMDT | CONSUMES_RWQE | extra},                            \
  {base + 0x04, P "SEND_ONLY", kReq | kPay | IS_SEND | kO | CONSUMES_RWQE | extra},            \
  {base + 0x05, P "SEND_ONLY_WITH_IMMEDIATE",                                                  \
   kReq | kPay | IS_SEND | kO | HAS_IMMDT | CONSUMES_RWQE | extra},                            \
  {base + 0x06, P "RDMA_WRITE_FIRST", kReq | kPay | IS_WRITE | kF | HAS_RETH | extra},         \
  {base + 0x07, P "RDMA_WRITE_MIDDLE", kReq | kPay | IS_WRITE | kM | extra},                   \
  {base + 0x08, P "RDMA_WRITE_LAST", kReq | kPay | IS_WRITE | kL | extra},                     \
  {base + 0x09, P "RDMA_WRITE_LAST_WITH_IMMEDIATE",                                            \
   kReq | kPay | IS_WRITE | kL | HAS_IMMDT | CONSUMES_RWQE | extra},                           \
  {base + 0x0a, P "RDMA_WRITE_ONLY", kReq | kPay | IS_WRITE | kO | HAS_RETH | extra},          \
  {base + 0x0b, P "RDMA_WRITE_ONLY_WITH_IMMEDIATE",                                            \
   kReq | kPay | IS_WRITE | kO | HAS_RETH | HAS_IMMDT | CONSUMES_RWQE | extra}
#define USRC_RELIABLE(base, P, T, X)                                                           \
    USRC_SENDS(base, P, T | X),                                                                \
    {base + 0x0c, P "RDMA_READ_REQUEST", T | X | kReq | IS_READ | kO | HAS_RETH},               \
    {base + 0x0d, P "RDMA_READ_RESPONSE_FIRST", T | kResp | kPay | IS_READ | kF | HAS_AETH},   \
    {base + 0x0e, P "RDMA_READ_RESPONSE_MIDDLE", T | kResp | kPay | IS_READ | kM},             \
    {base + 0x0f, P "RDMA_READ_RESPONSE_LAST", T | kResp | kPay | IS_READ | kL | HAS_AETH},    \
    {base + 0x10, P "RDMA_READ_RESPONSE_ONLY", T | kResp | kPay | IS_READ | kO | HAS_AETH},    \
    {base + 0x11, P "ACKNOWLEDGE", T | kResp | kO | HAS_AETH},                                 \
    {base + 0x12, P "ATOMIC_ACKNOWLEDGE", T | kResp | kO | IS_ATOMIC | HAS_AETH | HAS_ATOMICACKETH}, \
    {base + 0x13, P "CMP_SWAP", T | X | kReq | kO | IS_ATOMIC | HAS_ATOMICETH},                 \
    {base + 0x14, P "FETCH_ADD", T | X | kReq | kO | IS_ATOMIC | HAS_ATOMICETH},                \
    {base + 0x16, P "SEND_LAST_WITH_INVALIDATE",                                               \
     T | X | kReq | kPay | IS_SEND | kL | HAS_IETH | CONSUMES_RWQE},                           \
    {base + 0x17, P "SEND_ONLY_WITH_INVALIDATE",                                               \
     T | X | kReq | kPay | IS_SEND | kO | HAS_IETH | CONSUMES_RWQE},                           \
    {base + 0x1d, P "RDMA_ATOMIC_WRITE", T | X | kReq | kPay | IS_WRITE | kO | HAS_RETH}
    // XRC: RC's rows, each request with the XRCETH (IBA 9.2.1, 9.3).
    USRC_RELIABLE(0x00, "RC_", IS_RC, 0u),
    USRC_RELIABLE(0xa0, "XRC_", IS_XRC, HAS_XRCETH),
    USRC_SENDS(0x20, "UC_", IS_UC),
    {0x64, "UD_SEND_ONLY", IS_UD | kReq | kPay | IS_SEND | kO | HAS_DETH | CONSUMES_RWQE},
    {0x65, "UD_SEND_ONLY_WITH_IMMEDIATE",
     IS_UD | kReq | kPay | IS_SEND | kO | HAS_DETH | HAS_IMMDT | CONSUMES_RWQE},
    // Manufacturer-specific (110b): an RDMA WRITE already placed.
    {0xc0, "USRC_RDMA_WRITE_PLACED", kReq | IS_WRITE | kO | HAS_RETH},
#undef USRC_RELIABLE
#undef USRC_SENDS
};

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  for (const Row &r : kRows) t[r.op] = make_info(r.name, r.mask);
  return t;
}

// Every row is well formed: one direction, one position in its message,
// the transport its opcode's top bits say, headers within kMaxHdrLen, each
// header after the one before it in wire order.
constexpr bool rows_ok() {
  for (const Row &r : kRows) {
    const uint32_t dir = r.mask & (IS_REQUEST | IS_RESPONSE);
    const uint32_t pos = r.mask & (IS_FIRST | IS_MIDDLE | IS_LAST | IS_ONLY);
    const uint32_t tr = r.mask & (IS_RC | IS_UC | IS_UD | IS_XRC);
    if (dir != IS_REQUEST && dir != IS_RESPONSE) return false;
    if (pos != kF && pos != kM && pos != kL && pos != kO) return false;
    if (tr != ((r.op >> 5) == 0 ? IS_RC : (r.op >> 5) == 1 ? IS_UC : (r.op >> 5) == 3 ? IS_UD
               : (r.op >> 5) == 5 ? IS_XRC : 0u))
      return false;
    // An XRC row is its RC row with the XRCETH on requests.
    if (tr == IS_XRC) {
      const Row *rc = nullptr;
      for (const Row &q : kRows)
        if (q.op == r.op - kXrcOpcodeBase) rc = &q;
      const uint32_t x = (r.mask & IS_REQUEST) ? HAS_XRCETH : 0u;
      if (!rc || r.mask != ((rc->mask & ~IS_RC) | IS_XRC | x)) return false;
    }
    const OpcodeInfo i = make_info(r.name, r.mask);
    if (i.hdr_len > kMaxHdrLen) return false;
    size_t at = kBthLen;
    for (int h = DETH; h < PAYLOAD; h++) {
      if (!(r.mask & kHas[h])) continue;
      if (i.offset[h] != at) return false;
      at += kLen[h];
    }
    if (i.offset[PAYLOAD] != at) return false;
  }
  return true;
}
static_assert(rows_ok());
static_assert(sizeof kRows / sizeof kRows[0] == 24 + 24 + 12 + 2 + 1, "RC, XRC, UC, UD, ours");

}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = detail::make_table();

// nullptr if not a valid opcode.
constexpr const OpcodeInfo *opcode_info(uint8_t opcode) {
  return kOpcodeTable[opcode].name ? &kOpcodeTable[opcode] : nullptr;
}
// A valid opcode's row (a constant for a constant opcode).
constexpr const OpcodeInfo &info_of(Opcode op) { return kOpcodeTable[static_cast<uint8_t>(op)]; }

// The offsets IBA 9.2 and 9.3 give, spelled out for a few rows.
static_assert(info_of(Opcode::RC_WRITE_ONLY_IMM).offset[RETH] == 12 &&
              info_of(Opcode::RC_WRITE_ONLY_IMM).offset[IMMDT] == 28 &&
              info_of(Opcode::RC_WRITE_ONLY_IMM).hdr_len == 32);
static_assert(info_of(Opcode::RC_SEND_ONLY_IMM).offset[IMMDT] == 12 &&
              info_of(Opcode::RC_SEND_ONLY_IMM).hdr_len == 16);
static_assert(info_of(Opcode::RC_ACKNOWLEDGE).offset[AETH] == 12 &&
              info_of(Opcode::RC_ACKNOWLEDGE).hdr_len == 16);
static_assert(info_of(Opcode::RC_ATOMIC_ACKNOWLEDGE).offset[ATOMICACKETH] == 16 &&
              info_of(Opcode::RC_ATOMIC_ACKNOWLEDGE).hdr_len == 24);
static_assert(info_of(Opcode::RC_FETCH_ADD).offset[ATOMICETH] == 12 &&
              info_of(Opcode::RC_FETCH_ADD).hdr_len == 40);
static_assert(info_of(Opcode::RC_READ_RESPONSE_FIRST).offset[AETH] == 12 &&
              info_of(Opcode::RC_READ_RESPONSE_MIDDLE).hdr_len == 12);
static_assert(info_of(Opcode::RC_SEND_ONLY_INV).offset[IETH] == 12);
static_assert(info_of(Opcode::UD_SEND_ONLY_IMM).offset[DETH] == 12 &&
              info_of(Opcode::UD_SEND_ONLY_IMM).offset[IMMDT] == 20 &&
              info_of(Opcode::UD_SEND_ONLY_IMM).hdr_len == 24);
static_assert(info_of(Opcode::XRC_SEND_ONLY).offset[XRCETH] == 12 && info_of(Opcode::XRC_SEND_ONLY).hdr_len == 16 &&
              info_of(Opcode(0xaa)).offset[RETH] == 16 && info_of(Opcode::XRC_ACKNOWLEDGE).hdr_len == 16);
static_assert(info_of(Opcode::USRC_WRITE_PLACED).offset[RETH] == 12 &&
              info_of(Opcode::USRC_WRITE_PLACED).hdr_len == 28);

// A message's packets by position (rxe's next_opcode): which of a
// FIRST/MIDDLE/LAST/ONLY opcode quadruple a packet takes.
enum Pos : uint8_t { POS_MIDDLE = 0, POS_FIRST = 1, POS_LAST = 2, POS_ONLY = 3 };
constexpr Pos position(bool first, bool last) {
  return static_cast<Pos>((first ? POS_FIRST : 0) | (last ? POS_LAST : 0));
}
// The READ response packets (IBA 9.7.5.1.3), by position.
inline constexpr Opcode kReadResponse[4] = {
    Opcode::RC_READ_RESPONSE_MIDDLE, Opcode::RC_READ_RESPONSE_FIRST, Opcode::RC_READ_RESPONSE_LAST,
    Opcode::RC_READ_RESPONSE_ONLY};

// The second layer: a packet's header fields found through the opcode
// table (rxe's bth_psn(pkt) beside __bth_psn(hdr)). b points at the BTH,
// info is the row of its opcode. Hdrs<const uint8_t> (HdrView) reads a
// received packet; Hdrs<uint8_t> (HdrOut) locates the headers to write with
// the raw layer's put()s. A field of a header the opcode does not have is
// not there: test has() first.
template <class B>
struct Hdrs {
  B *b;
  const OpcodeInfo *info;

  B *at(Hdr h) const { return b + info->offset[h]; }
  B *payload() const { return b + info->hdr_len; }
  bool has(uint32_t mask_bits) const { return (info->mask & mask_bits) != 0; }

  uint8_t opcode() const { return bth::opcode(b); }
  bool se() const { return bth::se(b); }
  uint8_t pad() const { return bth::pad(b); }
  uint32_t qpn() const { return bth::qpn(b); }
  bool ack_req() const { return bth::ack_req(b); }
  uint32_t psn() const { return bth::psn(b); }
  uint64_t reth_va() const { return reth::va(at(RETH)); }
  uint32_t reth_rkey() const { return reth::rkey(at(RETH)); }
  uint32_t reth_len() const { return reth::len(at(RETH)); }
  uint64_t atomic_va() const { return atomiceth::va(at(ATOMICETH)); }
  uint32_t atomic_rkey() const { return atomiceth::rkey(at(ATOMICETH)); }
  uint64_t atomic_swap_add() const { return atomiceth::swap_add(at(ATOMICETH)); }
  uint64_t atomic_compare() const { return atomiceth::compare(at(ATOMICETH)); }
  uint8_t syndrome() const { return aeth::syndrome(at(AETH)); }
  uint32_t msn() const { return aeth::msn(at(AETH)); }
  uint64_t atomic_orig() const { return atomicacketh::orig(at(ATOMICACKETH)); }
  uint32_t imm_be() const { return immdt::get_be(at(IMMDT)); }
  uint32_t ieth_rkey() const { return ieth::rkey(at(IETH)); }
  uint32_t xrc_srqn() const { return xrceth::srqn(at(XRCETH)); }
  uint32_t qkey() const { return deth::qkey(at(DETH)); }
  uint32_t src_qp() const { return deth::src_qp(at(DETH)); }
};
using HdrView = Hdrs<const uint8_t>;
using HdrOut = Hdrs<uint8_t>;

}  // namespace usrc::wire
