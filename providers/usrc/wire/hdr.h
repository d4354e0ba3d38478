// IBA header fields, the raw layer: each accessor takes a pointer to the
// start of its header (IBA vol. 1 9.2 and 9.3) and reads or writes one
// field in network byte order. Which headers a packet has, and where, is
// the opcode table's business (opcode.h: OpcodeInfo::offset, and the
// table-located accessors there). These are the only byte masks and
// field offsets in usrc: everything above wire/ goes through them.
#pragma once

#include <endian.h>

#include <cstddef>
#include <cstdint>

namespace usrc::wire {

constexpr uint16_t kRoceV2Port = 4791;
constexpr size_t kBthLen = 12, kRethLen = 16, kAethLen = 4, kAtomicEthLen = 28,
                 kAtomicAckEthLen = 8, kImmDtLen = 4, kIethLen = 4, kDethLen = 8, kIcrcLen = 4,
                 kXrcEthLen = 4;
constexpr size_t kMaxHdrLen = 64;
constexpr size_t kMinPacketLen = kBthLen + kIcrcLen;   // the shortest a packet can be
constexpr uint32_t kMask24 = 0xffffff;   // QPNs, PSNs, MSNs: 24 bits on the wire

// Big-endian loads and stores, a word at a time (the headers are on the
// per-packet path: byte by byte was most of build_headers and parse).
namespace be {
inline uint16_t get16(const uint8_t *p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return be16toh(v);
}
inline uint32_t get32(const uint8_t *p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return be32toh(v);
}
inline uint64_t get64(const uint8_t *p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return be64toh(v);
}
inline void put16(uint8_t *p, uint16_t v) {
  v = htobe16(v);
  __builtin_memcpy(p, &v, 2);
}
inline void put32(uint8_t *p, uint32_t v) {
  v = htobe32(v);
  __builtin_memcpy(p, &v, 4);
}
inline void put64(uint8_t *p, uint64_t v) {
  v = htobe64(v);
  __builtin_memcpy(p, &v, 8);
}
}  // namespace be

// Base transport header (IBA 9.2), three big-endian words:
//   0: OpCode(8) | SE M PadCnt(2) TVer(4) | P_Key(16)
//   1: F B resv6(6) | DestQP(24)
//   2: A resv7(7) | PSN(24)
namespace bth {
inline uint8_t opcode(const uint8_t *b) { return b[0]; }
inline bool se(const uint8_t *b) { return b[1] & 0x80; }
inline bool mig_req(const uint8_t *b) { return b[1] & 0x40; }
inline uint8_t pad(const uint8_t *b) { return (b[1] >> 4) & 3; }
inline uint8_t tver(const uint8_t *b) { return b[1] & 0xf; }
// Pad count and TVer together: zero for a packet without pad of TVer 0.
inline uint8_t pad_tver(const uint8_t *b) { return b[1] & 0x3f; }
inline uint16_t pkey(const uint8_t *b) { return be::get16(b + 2); }
inline bool fecn(const uint8_t *b) { return b[4] & 0x80; }
inline bool becn(const uint8_t *b) { return b[4] & 0x40; }
// Ours, the first of the resv6 bits (which receivers ignore, IBA 9.2, and
// the ICRC masks, A16.4.1): the sender's datagrams carry a UDP checksum and
// it takes datagrams that carry one without an ICRC (0) from its QP's peer.
constexpr uint8_t kIcrcOptional = 0x20;
inline bool icrc_optional(const uint8_t *b) { return b[4] & kIcrcOptional; }
// Ours too, the four low resv6 bits, read only beside kIcrcOptional: bytes
// of fill behind the packet (after its ICRC), in units of 4, that make it
// as long as the packets before it in the same segmented (GSO) send, one
// segment size for all of a message's packets although its first carries
// a RETH or an AETH the others do not. Sent only to a peer that set the
// second resv6 bit, kTakesFill, beside kIcrcOptional (builds that set only
// the first take no fill).
constexpr uint8_t kTakesFill = 0x10;
constexpr uint8_t kFillMask = 0x0f;
constexpr uint32_t kMaxFill = 4 * kFillMask;
inline uint32_t fill(const uint8_t *b) { return 4u * (b[4] & kFillMask); }
inline uint32_t qpn(const uint8_t *b) { return be::get32(b + 4) & kMask24; }
inline bool ack_req(const uint8_t *b) { return b[8] & 0x80; }
// Ours, resv7 (which receivers ignore; the ICRC covers it) of a PSN
// sequence NAK to a usrc peer (Qp::peer_icrc_optional): how many PSNs from
// the NAK's on are missing, as far as the responder knows (it has the one
// after them, kept), up to kMaxHole; 0: not known, as in the IBA. The
// requester resends them at once (Engine::resend_one), not one a round trip.
constexpr uint32_t kMaxHole = 0x7f;
inline uint32_t hole(const uint8_t *b) { return b[8] & kMaxHole; }
inline void set_hole(uint8_t *b, uint32_t n) {
  b[8] = static_cast<uint8_t>((b[8] & ~kMaxHole) | (n < kMaxHole ? n : kMaxHole));
}
inline uint32_t psn(const uint8_t *b) { return be::get32(b + 8) & kMask24; }

// The three words, for a builder that computes some of them ahead (a WQE
// keeps word 0 from post to send).
constexpr uint32_t word0(uint8_t opcode, bool se, uint8_t pad, bool mig_req = false,
                         uint8_t tver = 0, uint16_t pkey = 0xffff) {
  return uint32_t(opcode) << 24 |
         uint32_t((se ? 0x80 : 0) | (mig_req ? 0x40 : 0) | (pad & 3) << 4 | (tver & 0xf)) << 16 |
         pkey;
}
constexpr uint32_t word1(uint32_t qpn, bool fecn = false, bool becn = false) {
  return uint32_t((fecn ? 0x80 : 0) | (becn ? 0x40 : 0)) << 24 | (qpn & kMask24);
}
constexpr uint32_t word2(uint32_t psn, bool ack_req) {
  return (ack_req ? 0x80000000u : 0) | (psn & kMask24);
}
inline void put_words(uint8_t *b, uint32_t w0, uint32_t w1, uint32_t w2) {
  be::put32(b, w0);
  be::put32(b + 4, w1);
  be::put32(b + 8, w2);
}
// The BTH of a packet usrc sends: P_Key 0xffff; M, TVer, F, B and the
// reserved bits 0.
inline void put(uint8_t *b, uint8_t opcode, bool se, uint8_t pad, uint32_t qpn, bool ack_req,
                uint32_t psn) {
  put_words(b, word0(opcode, se, pad), word1(qpn), word2(psn, ack_req));
}
}  // namespace bth

// RDMA extended transport header (IBA 9.3.3): VA(64) R_Key(32) DMA length(32).
namespace reth {
inline uint64_t va(const uint8_t *r) { return be::get64(r); }
inline uint32_t rkey(const uint8_t *r) { return be::get32(r + 8); }
inline uint32_t len(const uint8_t *r) { return be::get32(r + 12); }
inline void put(uint8_t *r, uint64_t va, uint32_t rkey, uint32_t len) {
  be::put64(r, va);
  be::put32(r + 8, rkey);
  be::put32(r + 12, len);
}
}  // namespace reth

// Atomic extended transport header (IBA 9.3.4): VA(64) R_Key(32)
// Swap or Add data(64) Compare data(64).
namespace atomiceth {
inline uint64_t va(const uint8_t *a) { return be::get64(a); }
inline uint32_t rkey(const uint8_t *a) { return be::get32(a + 8); }
inline uint64_t swap_add(const uint8_t *a) { return be::get64(a + 12); }
inline uint64_t compare(const uint8_t *a) { return be::get64(a + 20); }
inline void put(uint8_t *a, uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
  be::put64(a, va);
  be::put32(a + 8, rkey);
  be::put64(a + 12, swap_add);
  be::put64(a + 20, compare);
}
}  // namespace atomiceth

// ACK extended transport header (IBA 9.3.5): Syndrome(8) MSN(24).
namespace aeth {
inline uint8_t syndrome(const uint8_t *a) { return a[0]; }
inline uint32_t msn(const uint8_t *a) { return be::get32(a) & kMask24; }
inline void put(uint8_t *a, uint8_t syndrome, uint32_t msn) {
  be::put32(a, uint32_t(syndrome) << 24 | (msn & kMask24));
}
}  // namespace aeth

// Atomic acknowledge extended transport header (IBA 9.3.6): the original
// remote data (64).
namespace atomicacketh {
inline uint64_t orig(const uint8_t *a) { return be::get64(a); }
inline void put(uint8_t *a, uint64_t orig) { be::put64(a, orig); }
}  // namespace atomicacketh

// Immediate data (IBA 9.3.7): kept in network byte order, as ibv_send_wr
// and ibv_wc carry it.
namespace immdt {
inline uint32_t get_be(const uint8_t *i) {
  uint32_t v;
  __builtin_memcpy(&v, i, 4);
  return v;
}
inline void put_be(uint8_t *i, uint32_t imm_be) { __builtin_memcpy(i, &imm_be, 4); }
}  // namespace immdt

// Invalidate extended transport header (IBA 9.3.8): the R_Key to invalidate.
namespace ieth {
inline uint32_t rkey(const uint8_t *i) { return be::get32(i); }
inline void put(uint8_t *i, uint32_t rkey) { be::put32(i, rkey); }
}  // namespace ieth

// Datagram extended transport header (IBA 9.3.2): Q_Key(32) resv(8) SrcQP(24).
namespace deth {
inline uint32_t qkey(const uint8_t *d) { return be::get32(d); }
inline uint32_t src_qp(const uint8_t *d) { return be::get32(d + 4) & kMask24; }
inline void put(uint8_t *d, uint32_t qkey, uint32_t src_qp) {
  be::put32(d, qkey);
  be::put32(d + 4, src_qp & kMask24);
}
}  // namespace deth

// XRC extended transport header (IBA 9.3.? XRCETH): resv(8) XRCSRQ(24), the
// SRQ of the target's XRC domain that a request's message is for.
namespace xrceth {
inline uint32_t srqn(const uint8_t *x) { return be::get32(x) & kMask24; }
inline void put(uint8_t *x, uint32_t srqn) { be::put32(x, srqn & kMask24); }
}  // namespace xrceth

// The ICRC (IBA 9.8.2.1, annex A17), the packet's last 4 bytes, stored
// little-endian (icrc.h computes it); 0 from a sender on this host.
namespace icrc {
inline uint32_t get(const uint8_t *i) {
  uint32_t v;
  __builtin_memcpy(&v, i, 4);
  return le32toh(v);
}
inline void put(uint8_t *i, uint32_t icrc) {
  icrc = htole32(icrc);
  __builtin_memcpy(i, &icrc, 4);
}
}  // namespace icrc

}  // namespace usrc::wire
