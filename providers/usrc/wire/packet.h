// RoCE v2 packets: the IBA base transport header and extended headers in a
// UDP payload, with the ICRC at the end (IBA vol. 1 ch. 9, annex A17).
// One table describes every opcode (which headers, in which order, what the
// packet does); build and parse both follow it. parse() never trusts input.
#pragma once

#include <cstddef>
#include <cstdint>

namespace usrc::wire {

constexpr uint16_t kRoceV2Port = 4791;
constexpr size_t kBthLen = 12, kRethLen = 16, kAethLen = 4, kAtomicEthLen = 28,
                 kAtomicAckEthLen = 8, kImmDtLen = 4, kIethLen = 4, kDethLen = 8, kIcrcLen = 4;
constexpr size_t kMaxHdrLen = 64;

// IBA 9.2.1 table 38 (RC 000b, UC 001b, UD 011b in the top three bits).
enum class Opcode : uint8_t {
  RC_SEND_FIRST = 0x00, RC_SEND_MIDDLE = 0x01, RC_SEND_LAST = 0x02, RC_SEND_LAST_IMM = 0x03,
  RC_SEND_ONLY = 0x04, RC_SEND_ONLY_IMM = 0x05, RC_WRITE_FIRST = 0x06, RC_WRITE_MIDDLE = 0x07,
  RC_WRITE_LAST = 0x08, RC_WRITE_LAST_IMM = 0x09, RC_WRITE_ONLY = 0x0a,
  RC_WRITE_ONLY_IMM = 0x0b, RC_READ_REQUEST = 0x0c, RC_READ_RESPONSE_FIRST = 0x0d,
  RC_READ_RESPONSE_MIDDLE = 0x0e, RC_READ_RESPONSE_LAST = 0x0f, RC_READ_RESPONSE_ONLY = 0x10,
  RC_ACKNOWLEDGE = 0x11, RC_ATOMIC_ACKNOWLEDGE = 0x12, RC_COMPARE_SWAP = 0x13,
  RC_FETCH_ADD = 0x14, RC_SEND_LAST_INV = 0x16, RC_SEND_ONLY_INV = 0x17,
  UC_SEND_FIRST = 0x20, UC_SEND_MIDDLE = 0x21, UC_SEND_LAST = 0x22, UC_SEND_LAST_IMM = 0x23,
  UC_SEND_ONLY = 0x24, UC_SEND_ONLY_IMM = 0x25, UC_WRITE_FIRST = 0x26, UC_WRITE_MIDDLE = 0x27,
  UC_WRITE_LAST = 0x28, UC_WRITE_LAST_IMM = 0x29, UC_WRITE_ONLY = 0x2a,
  UC_WRITE_ONLY_IMM = 0x2b,
  UD_SEND_ONLY = 0x64, UD_SEND_ONLY_IMM = 0x65,
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
};

struct OpcodeInfo {
  const char *name;  // as IBA table 38 names it, e.g. "RC_RDMA_WRITE_FIRST"
  uint32_t mask;     // HdrMask bits
  uint8_t hdr_len;   // BTH + extended headers; the payload starts here
};
const OpcodeInfo *opcode_info(uint8_t opcode);   // nullptr if not a valid opcode

struct Bth {
  uint8_t opcode = 0;
  bool se = false, mig_req = false;
  uint8_t pad_cnt = 0, tver = 0;
  uint16_t pkey = 0xffff;
  bool fecn = false, becn = false;
  uint32_t dest_qp = 0;   // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;       // 24 bits
  // The 6 reserved bits after FECN/BECN (resv6a). The ICRC masks this byte,
  // so usrc carries a packet's index within a UDP GSO send here: the kernel
  // gives segment i of a send IP ID i, which the ICRC covers, and a receiver
  // that cannot see the IP header takes the ID from this field. Others
  // send 0 here and ignore it (IBA 9.2: reserved).
  uint8_t seg = 0;
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
// We send 0x1f, the "invalid" credit count: we do not use end-to-end credits.
constexpr uint8_t aeth_ack(uint8_t credits = 0x1f) { return credits & 0x1f; }
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
// length, 0 for an invalid opcode.
// Sets the BTH's segment index (Bth::seg) in a built header.
inline void set_seg(uint8_t *bth, uint8_t seg) { bth[4] = uint8_t((bth[4] & 0xc0) | (seg & 0x3f)); }
size_t build_headers(const Headers &h, size_t payload_len, uint8_t *out);

// The pieces of build_headers for the per-packet path, which builds a
// request's headers without a Headers struct: the BTH (IBA 9.2: opcode |
// SE M Pad(2) TVer(4) | P_Key | F B resv6 | DestQP | A resv7 | PSN), with
// P_Key 0xffff, M, TVer, F, B and the segment index 0; and the RETH.
inline void put_be32(uint8_t *p, uint32_t v) {
  v = __builtin_bswap32(v);
  __builtin_memcpy(p, &v, 4);
}
inline uint32_t get_be32(const uint8_t *p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return __builtin_bswap32(v);
}
constexpr uint32_t bth_word0(uint8_t opcode, bool se, uint8_t pad) {
  return uint32_t(opcode) << 24 | uint32_t((se ? 0x80 : 0) | pad << 4) << 16 | 0xffff;
}
inline void put_bth(uint8_t *p, uint8_t opcode, bool se, uint8_t pad, uint32_t dest_qp,
                    bool ack_req, uint32_t psn) {
  put_be32(p, bth_word0(opcode, se, pad));
  put_be32(p + 4, dest_qp & 0xffffff);
  put_be32(p + 8, (ack_req ? 0x80000000u : 0) | (psn & 0xffffff));
}
inline void put_reth(uint8_t *p, uint64_t va, uint32_t rkey, uint32_t dma_len) {
  va = __builtin_bswap64(va);
  __builtin_memcpy(p, &va, 8);
  put_be32(p + 8, rkey);
  put_be32(p + 12, dma_len);
}

}  // namespace usrc::wire
