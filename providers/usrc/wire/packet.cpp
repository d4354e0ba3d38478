#include "usrc/wire/packet.h"

#include <endian.h>

#include <array>

namespace usrc::wire {

namespace {

constexpr uint8_t hdr_len(uint32_t m) {
  return static_cast<uint8_t>(
      kBthLen + ((m & HAS_RETH) ? kRethLen : 0) + ((m & HAS_AETH) ? kAethLen : 0) +
      ((m & HAS_ATOMICETH) ? kAtomicEthLen : 0) + ((m & HAS_ATOMICACKETH) ? kAtomicAckEthLen : 0) +
      ((m & HAS_IMMDT) ? kImmDtLen : 0) + ((m & HAS_IETH) ? kIethLen : 0) +
      ((m & HAS_DETH) ? kDethLen : 0));
}

constexpr uint32_t kReq = IS_REQUEST, kResp = IS_RESPONSE, kPay = HAS_PAYLOAD;
constexpr uint32_t kF = IS_FIRST, kM = IS_MIDDLE, kL = IS_LAST, kO = IS_FIRST | IS_LAST | IS_ONLY;

struct Row { uint8_t op; const char *name; uint32_t mask; };

// The opcode table: headers in wire order are BTH, then (DETH), RETH,
// AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, as IBA 9.2 lays them out.
constexpr Row kRows[] = {
#define SENDS(base, P, extra)                                                                  \
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
    SENDS(0x00, "RC_", 0u),
    {0x0c, "RC_RDMA_READ_REQUEST", kReq | IS_READ | kO | HAS_RETH},
    {0x0d, "RC_RDMA_READ_RESPONSE_FIRST", kResp | kPay | IS_READ | kF | HAS_AETH},
    {0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", kResp | kPay | IS_READ | kM},
    {0x0f, "RC_RDMA_READ_RESPONSE_LAST", kResp | kPay | IS_READ | kL | HAS_AETH},
    {0x10, "RC_RDMA_READ_RESPONSE_ONLY", kResp | kPay | IS_READ | kO | HAS_AETH},
    {0x11, "RC_ACKNOWLEDGE", kResp | kO | HAS_AETH},
    {0x12, "RC_ATOMIC_ACKNOWLEDGE", kResp | kO | IS_ATOMIC | HAS_AETH | HAS_ATOMICACKETH},
    {0x13, "RC_CMP_SWAP", kReq | kO | IS_ATOMIC | HAS_ATOMICETH},
    {0x14, "RC_FETCH_ADD", kReq | kO | IS_ATOMIC | HAS_ATOMICETH},
    {0x16, "RC_SEND_LAST_WITH_INVALIDATE",
     kReq | kPay | IS_SEND | kL | HAS_IETH | CONSUMES_RWQE},
    {0x17, "RC_SEND_ONLY_WITH_INVALIDATE",
     kReq | kPay | IS_SEND | kO | HAS_IETH | CONSUMES_RWQE},
    SENDS(0x20, "UC_", 0u),
    {0x64, "UD_SEND_ONLY", kReq | kPay | IS_SEND | kO | HAS_DETH | CONSUMES_RWQE},
    {0x65, "UD_SEND_ONLY_WITH_IMMEDIATE",
     kReq | kPay | IS_SEND | kO | HAS_DETH | HAS_IMMDT | CONSUMES_RWQE},
    // Manufacturer-specific (110b): an RDMA WRITE already placed.
    {0xc0, "USRC_RDMA_WRITE_PLACED", kReq | IS_WRITE | kO | HAS_RETH},
#undef SENDS
};

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  for (const Row &r : kRows) t[r.op] = {r.name, r.mask, hdr_len(r.mask)};
  return t;
}
constexpr std::array<OpcodeInfo, 256> kTable = make_table();

// Every row is well formed: one direction, one position in its message.
constexpr bool rows_ok() {
  for (const Row &r : kRows) {
    const uint32_t dir = r.mask & (IS_REQUEST | IS_RESPONSE);
    const uint32_t pos = r.mask & (IS_FIRST | IS_MIDDLE | IS_LAST | IS_ONLY);
    if (dir != IS_REQUEST && dir != IS_RESPONSE) return false;
    if (pos != kF && pos != kM && pos != kL && pos != kO) return false;
    if (hdr_len(r.mask) > kMaxHdrLen) return false;
  }
  return true;
}
static_assert(rows_ok());
static_assert(sizeof kRows / sizeof kRows[0] == 23 + 12 + 2 + 1, "RC, UC, UD, ours");

// Big-endian field access, a word at a time (the headers are on the
// per-packet path: byte by byte was most of build_headers and parse).
inline uint16_t get16(const uint8_t *p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t get32(const uint8_t *p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return be32toh(v);
}
inline uint32_t get24(const uint8_t *p) { return uint32_t(p[0]) << 16 | get16(p + 1); }
inline uint64_t get64(const uint8_t *p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return be64toh(v);
}
inline void put32(uint8_t *p, uint32_t v) {
  v = htobe32(v);
  __builtin_memcpy(p, &v, 4);
}
inline void put24(uint8_t *p, uint32_t v) { p[0] = uint8_t(v >> 16); p[1] = uint8_t(v >> 8); p[2] = uint8_t(v); }
inline void put64(uint8_t *p, uint64_t v) {
  v = htobe64(v);
  __builtin_memcpy(p, &v, 8);
}

}  // namespace

const OpcodeInfo *opcode_info(uint8_t opcode) {
  return kTable[opcode].name ? &kTable[opcode] : nullptr;
}

const char *to_string(ParseError e) {
  switch (e) {
    case ParseError::ok: return "ok";
    case ParseError::too_short: return "too short";
    case ParseError::bad_opcode: return "unknown opcode";
    case ParseError::bad_tver: return "unsupported transport header version";
    case ParseError::bad_pad: return "pad count not allowed (larger than the payload, or on a packet without one or not ending a message)";
    case ParseError::bad_length: return "payload length not allowed (not 4-byte aligned with its pad, or on an opcode without payload)";
    case ParseError::bad_icrc: return "bad ICRC";
  }
  return "?";
}

size_t build_headers(const Headers &h, size_t payload_len, uint8_t *out) {
  const OpcodeInfo *info = opcode_info(h.bth.opcode);
  if (!info) return 0;
  const uint32_t m = info->mask;
  // BTH (IBA 9.2): opcode | SE M Pad(2) TVer(4) | P_Key | F B resv6 | DestQP
  //               | A resv7 | PSN
  uint8_t *p = out;
  put32(p, uint32_t(h.bth.opcode) << 24 |
               uint32_t((h.bth.se ? 0x80 : 0) | (h.bth.mig_req ? 0x40 : 0) |
                        (pad_for(payload_len) << 4) | (h.bth.tver & 0xf)) << 16 |
               h.bth.pkey);
  put32(p + 4, uint32_t((h.bth.fecn ? 0x80 : 0) | (h.bth.becn ? 0x40 : 0) | (h.bth.seg & 0x3f)) << 24 |
                   (h.bth.dest_qp & 0xffffff));
  put32(p + 8, (h.bth.ack_req ? 0x80000000u : 0) | (h.bth.psn & 0xffffff));
  p += kBthLen;
  if (m & HAS_DETH) {
    put32(p, h.deth.qkey);
    p[4] = 0;
    put24(p + 5, h.deth.src_qp);
    p += kDethLen;
  }
  if (m & HAS_RETH) {
    put_reth(p, h.reth.va, h.reth.rkey, h.reth.dma_len);
    p += kRethLen;
  }
  if (m & HAS_ATOMICETH) {
    put64(p, h.atomic.va);
    put32(p + 8, h.atomic.rkey);
    put64(p + 12, h.atomic.swap_add);
    put64(p + 20, h.atomic.compare);
    p += kAtomicEthLen;
  }
  if (m & HAS_AETH) {
    p[0] = h.aeth.syndrome;
    put24(p + 1, h.aeth.msn);
    p += kAethLen;
  }
  if (m & HAS_ATOMICACKETH) {
    put64(p, h.atomic_ack);
    p += kAtomicAckEthLen;
  }
  if (m & HAS_IMMDT) {
    __builtin_memcpy(p, &h.imm_be, 4);
    p += kImmDtLen;
  }
  if (m & HAS_IETH) {
    put32(p, h.ieth);
    p += kIethLen;
  }
  return static_cast<size_t>(p - out);
}

ParseError parse(const uint8_t *buf, size_t len, Parsed &out) {
  if (len < kBthLen + kIcrcLen) return ParseError::too_short;
  const OpcodeInfo *info = opcode_info(buf[0]);
  if (!info) return ParseError::bad_opcode;
  const uint32_t m = info->mask;
  if (len < info->hdr_len + kIcrcLen) return ParseError::too_short;
  Headers &h = out.h;   // (every field is written below: absent headers as zero)
  const uint32_t w0 = get32(buf), w1 = get32(buf + 4), w2 = get32(buf + 8);
  h.bth.opcode = buf[0];
  h.bth.se = w0 & 0x800000;
  h.bth.mig_req = w0 & 0x400000;
  h.bth.pad_cnt = (w0 >> 20) & 3;
  h.bth.tver = (w0 >> 16) & 0xf;
  if (h.bth.tver != 0) return ParseError::bad_tver;
  h.bth.pkey = uint16_t(w0);
  h.bth.fecn = w1 & 0x80000000u;
  h.bth.becn = w1 & 0x40000000u;
  h.bth.seg = (w1 >> 24) & 0x3f;
  h.bth.dest_qp = w1 & 0xffffff;
  h.bth.ack_req = w2 & 0x80000000u;
  h.bth.psn = w2 & 0xffffff;
  const uint8_t *p = buf + kBthLen;
  if (m & HAS_DETH) {
    h.deth.qkey = get32(p);
    h.deth.src_qp = get24(p + 5);
    p += kDethLen;
  } else {
    h.deth = {};
  }
  if (m & HAS_RETH) {
    h.reth.va = get64(p);
    h.reth.rkey = get32(p + 8);
    h.reth.dma_len = get32(p + 12);
    p += kRethLen;
  } else {
    h.reth = {};
  }
  if (m & HAS_ATOMICETH) {
    h.atomic.va = get64(p);
    h.atomic.rkey = get32(p + 8);
    h.atomic.swap_add = get64(p + 12);
    h.atomic.compare = get64(p + 20);
    p += kAtomicEthLen;
  } else {
    h.atomic = {};
  }
  if (m & HAS_AETH) {
    h.aeth.syndrome = p[0];
    h.aeth.msn = get24(p + 1);
    p += kAethLen;
  } else {
    h.aeth = {};
  }
  if (m & HAS_ATOMICACKETH) {
    h.atomic_ack = get64(p);
    p += kAtomicAckEthLen;
  } else {
    h.atomic_ack = 0;
  }
  if (m & HAS_IMMDT) {
    __builtin_memcpy(&h.imm_be, p, 4);
    p += kImmDtLen;
  } else {
    h.imm_be = 0;
  }
  if (m & HAS_IETH) {
    h.ieth = get32(p);
    p += kIethLen;
  } else {
    h.ieth = 0;
  }
  size_t body = len - info->hdr_len - kIcrcLen;   // payload + pad
  if (!(m & HAS_PAYLOAD)) {
    // ACKs, READ requests and atomics carry no payload and no pad.
    if (body != 0) return ParseError::bad_length;
    if (h.bth.pad_cnt) return ParseError::bad_pad;
  } else {
    if (body < h.bth.pad_cnt) return ParseError::bad_pad;
    if ((body & 3) != 0) return ParseError::bad_length;   // payload + pad is 4-byte aligned
    // FIRST and MIDDLE packets carry exactly one PMTU (IBA ch. 9, packet
    // sequencing), a multiple of 4, so only a packet ending its message pads.
    if (h.bth.pad_cnt && !(m & IS_LAST)) return ParseError::bad_pad;
  }
  out.info = info;
  out.payload = p;
  out.payload_len = body - h.bth.pad_cnt;
  const uint8_t *ic = buf + len - kIcrcLen;
  out.icrc = uint32_t(ic[0]) | uint32_t(ic[1]) << 8 | uint32_t(ic[2]) << 16 | uint32_t(ic[3]) << 24;
  return ParseError::ok;
}

}  // namespace usrc::wire
