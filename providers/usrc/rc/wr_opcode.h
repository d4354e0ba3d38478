// The work-request opcode table (as rxe's rxe_wr_opcode_info): for each
// WR opcode the request packets of its message by position, the packets
// that answer it, the completion it makes, and what it means. The
// requester, the responder's READ responses, the completer and the verbs
// glue's checks read it instead of switching on the opcode or relying on
// the enum's order.
#pragma once

#include <array>
#include <cstdint>

#include "usrc/rc/types.h"
#include "usrc/wire/opcode.h"

namespace usrc::rc {

enum WrMask : uint16_t {
  WR_SEND = 1u << 0, WR_WRITE = 1u << 1, WR_READ = 1u << 2, WR_ATOMIC = 1u << 3,
  WR_IMM = 1u << 4,            // carries immediate data (in its last packet)
  WR_INLINE_OK = 1u << 5,      // may carry inline data: it only reads local memory
  WR_RETH = 1u << 6,           // its first packet names the remote memory (RETH)
  WR_CONSUMES_RWQE = 1u << 7,  // the responder takes a receive WQE for it
  WR_INV = 1u << 8,            // its last packet names an R_Key for the responder to invalidate (IETH)
  // No packets: an operation on this side's memory windows, made at post
  // time, that completes in send queue order (Engine::post_local).
  WR_LOCAL = 1u << 9,
  // One packet of exactly 8 bytes, stored at the responder with one atomic
  // 8-byte store (an ATOMIC WRITE, IBA 1.5 9.4.7): a WRITE otherwise.
  WR_SINGLE = 1u << 10,
  // One request answered with data (IBA 9.4.3, 9.4.5): these count against
  // the initiator depth and the responder resources, and are ordered by
  // the fence.
  WR_READ_OR_ATOMIC = WR_READ | WR_ATOMIC,
};

struct WrOpcodeInfo {
  WrOpcode op;                    // its index in the table
  const char *name;               // as libibverbs names it
  uint16_t mask;                  // WrMask bits
  WcOpcode wc_opcode;             // of the requester's completion
  wire::Opcode request[4];        // its request packets, by wire::Pos
  wire::Opcode response[4];       // the packets answering it, by wire::Pos
};

namespace detail {

using O = wire::Opcode;
constexpr size_t kNumWrOpcodes = 16;
constexpr O kNone[4] = {};   // (a local operation's: no packets)
constexpr O kAck[4] = {O::RC_ACKNOWLEDGE, O::RC_ACKNOWLEDGE, O::RC_ACKNOWLEDGE, O::RC_ACKNOWLEDGE};

// A verbs opcode usrc does not carry (TSO, the driver's own, FLUSH): no row.
#define USRC_NO_WR(n) {static_cast<WrOpcode>(n), nullptr, 0, WcOpcode::send, {}, {}}

// Indexed by WrOpcode (= enum ibv_wr_opcode).
inline constexpr std::array<WrOpcodeInfo, kNumWrOpcodes> kWrOpcodes = {{
    {WrOpcode::rdma_write, "IBV_WR_RDMA_WRITE", WR_WRITE | WR_INLINE_OK | WR_RETH, WcOpcode::rdma_write,
     {O::RC_WRITE_MIDDLE, O::RC_WRITE_FIRST, O::RC_WRITE_LAST, O::RC_WRITE_ONLY},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
    {WrOpcode::rdma_write_imm, "IBV_WR_RDMA_WRITE_WITH_IMM", WR_WRITE | WR_IMM | WR_INLINE_OK | WR_RETH | WR_CONSUMES_RWQE,
     WcOpcode::rdma_write,
     {O::RC_WRITE_MIDDLE, O::RC_WRITE_FIRST, O::RC_WRITE_LAST_IMM, O::RC_WRITE_ONLY_IMM},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
    {WrOpcode::send, "IBV_WR_SEND", WR_SEND | WR_INLINE_OK | WR_CONSUMES_RWQE, WcOpcode::send,
     {O::RC_SEND_MIDDLE, O::RC_SEND_FIRST, O::RC_SEND_LAST, O::RC_SEND_ONLY},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
    {WrOpcode::send_imm, "IBV_WR_SEND_WITH_IMM", WR_SEND | WR_IMM | WR_INLINE_OK | WR_CONSUMES_RWQE, WcOpcode::send,
     {O::RC_SEND_MIDDLE, O::RC_SEND_FIRST, O::RC_SEND_LAST_IMM, O::RC_SEND_ONLY_IMM},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
    // One request packet however long the READ (IBA 9.7.1.2); a READ asked
    // for in pieces sends one request per piece.
    {WrOpcode::rdma_read, "IBV_WR_RDMA_READ", WR_READ | WR_RETH, WcOpcode::rdma_read,
     {O::RC_READ_REQUEST, O::RC_READ_REQUEST, O::RC_READ_REQUEST, O::RC_READ_REQUEST},
     {O::RC_READ_RESPONSE_MIDDLE, O::RC_READ_RESPONSE_FIRST, O::RC_READ_RESPONSE_LAST,
      O::RC_READ_RESPONSE_ONLY}},
    {WrOpcode::atomic_cmp_swp, "IBV_WR_ATOMIC_CMP_AND_SWP", WR_ATOMIC, WcOpcode::comp_swap,
     {O::RC_COMPARE_SWAP, O::RC_COMPARE_SWAP, O::RC_COMPARE_SWAP, O::RC_COMPARE_SWAP},
     {O::RC_ATOMIC_ACKNOWLEDGE, O::RC_ATOMIC_ACKNOWLEDGE, O::RC_ATOMIC_ACKNOWLEDGE,
      O::RC_ATOMIC_ACKNOWLEDGE}},
    {WrOpcode::atomic_fetch_add, "IBV_WR_ATOMIC_FETCH_AND_ADD", WR_ATOMIC, WcOpcode::fetch_add,
     {O::RC_FETCH_ADD, O::RC_FETCH_ADD, O::RC_FETCH_ADD, O::RC_FETCH_ADD},
     {O::RC_ATOMIC_ACKNOWLEDGE, O::RC_ATOMIC_ACKNOWLEDGE, O::RC_ATOMIC_ACKNOWLEDGE,
      O::RC_ATOMIC_ACKNOWLEDGE}},
    {WrOpcode::local_inv, "IBV_WR_LOCAL_INV", WR_LOCAL, WcOpcode::local_inv,
     {kNone[0], kNone[1], kNone[2], kNone[3]}, {kNone[0], kNone[1], kNone[2], kNone[3]}},
    {WrOpcode::bind_mw, "IBV_WR_BIND_MW", WR_LOCAL, WcOpcode::bind_mw,
     {kNone[0], kNone[1], kNone[2], kNone[3]}, {kNone[0], kNone[1], kNone[2], kNone[3]}},
    {WrOpcode::send_inv, "IBV_WR_SEND_WITH_INV", WR_SEND | WR_INV | WR_INLINE_OK | WR_CONSUMES_RWQE, WcOpcode::send,
     {O::RC_SEND_MIDDLE, O::RC_SEND_FIRST, O::RC_SEND_LAST_INV, O::RC_SEND_ONLY_INV},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
    USRC_NO_WR(10), USRC_NO_WR(11), USRC_NO_WR(12), USRC_NO_WR(13), USRC_NO_WR(14),
    {WrOpcode::atomic_write, "IBV_WR_ATOMIC_WRITE", WR_WRITE | WR_INLINE_OK | WR_RETH | WR_SINGLE,
     WcOpcode::atomic_write,
     {O::RC_ATOMIC_WRITE, O::RC_ATOMIC_WRITE, O::RC_ATOMIC_WRITE, O::RC_ATOMIC_WRITE},
     {kAck[0], kAck[1], kAck[2], kAck[3]}},
}};
#undef USRC_NO_WR

// Every row agrees with the packet opcode table: its request packets are
// RC requests of its kind in their positions (a single-packet kind's are
// all ONLY), carry the RETH and the immediate data where the row says and
// take a receive WQE when it says; its answers are responses.
constexpr bool wr_rows_ok() {
  for (size_t i = 0; i < kWrOpcodes.size(); i++) {
    const WrOpcodeInfo &w = kWrOpcodes[i];
    if (static_cast<size_t>(w.op) != i) return false;   // in WrOpcode order
    const uint16_t m = w.mask;
    if (!w.name) {   // (a row usrc does not carry)
      if (m) return false;
      continue;
    }
    if (m & WR_LOCAL) {
      if (m != WR_LOCAL) return false;
      continue;
    }
    const uint32_t kind = (m & WR_SEND ? wire::IS_SEND : 0u) | (m & WR_WRITE ? wire::IS_WRITE : 0u) |
                          (m & WR_READ ? wire::IS_READ : 0u) | (m & WR_ATOMIC ? wire::IS_ATOMIC : 0u);
    if (__builtin_popcount(kind) != 1) return false;
    const bool one = m & (WR_READ_OR_ATOMIC | WR_SINGLE);
    constexpr uint32_t kPosBits = wire::IS_FIRST | wire::IS_MIDDLE | wire::IS_LAST | wire::IS_ONLY;
    constexpr uint32_t kPos[4] = {wire::IS_MIDDLE, wire::IS_FIRST, wire::IS_LAST,
                                  wire::IS_FIRST | wire::IS_LAST | wire::IS_ONLY};
    for (int pos = 0; pos < 4; pos++) {
      // (Rows by reference, present if named: under the sanitizers GCC does
      // not fold a static row's address compared with null.)
      const wire::OpcodeInfo *q = &wire::kOpcodeTable[static_cast<uint8_t>(w.request[pos])];
      const wire::OpcodeInfo *r = &wire::kOpcodeTable[static_cast<uint8_t>(w.response[pos])];
      if (!q->name || !r->name) return false;
      const uint32_t qm = q->mask;
      if ((qm & (wire::IS_REQUEST | wire::IS_RC)) != (wire::IS_REQUEST | wire::IS_RC)) return false;
      if ((qm & (wire::IS_SEND | wire::IS_WRITE | wire::IS_READ | wire::IS_ATOMIC)) != kind) return false;
      if ((qm & kPosBits) != (one ? kPos[wire::POS_ONLY] : kPos[pos])) return false;
      const bool starts = one || (pos & wire::POS_FIRST), ends = one || (pos & wire::POS_LAST);
      if (bool(qm & wire::HAS_RETH) != (bool(m & WR_RETH) && starts)) return false;
      if (bool(qm & wire::HAS_IMMDT) != (bool(m & WR_IMM) && ends)) return false;
      if (bool(qm & wire::HAS_IETH) != (bool(m & WR_INV) && ends)) return false;
      if (bool(qm & wire::CONSUMES_RWQE) != (bool(m & WR_CONSUMES_RWQE) && ends)) return false;
      if (!(r->mask & wire::IS_RESPONSE) || !(r->mask & wire::IS_RC)) return false;
    }
  }
  return true;
}
static_assert(wr_rows_ok());
}  // namespace detail

constexpr const WrOpcodeInfo &wr_info(WrOpcode op) { return detail::kWrOpcodes[static_cast<size_t>(op)]; }
// A verbs WR opcode's row; nullptr if usrc does not support it.
constexpr const WrOpcodeInfo *wr_opcode_info(unsigned verbs_opcode) {
  return verbs_opcode < detail::kNumWrOpcodes && detail::kWrOpcodes[verbs_opcode].name
             ? &detail::kWrOpcodes[verbs_opcode] : nullptr;
}
// READ and ATOMIC: one request, answered with data (IBA 9.4.3, 9.4.5).
constexpr bool is_rd_atomic(WrOpcode op) { return wr_info(op).mask & WR_READ_OR_ATOMIC; }
// The BTH opcode of packet k of a message of npkts packets of opcode op.
constexpr uint8_t request_opcode(const WrOpcodeInfo &w, uint32_t k, uint32_t npkts) {
  return static_cast<uint8_t>(w.request[wire::position(k == 0, k + 1 == npkts)]);
}

}  // namespace usrc::rc
