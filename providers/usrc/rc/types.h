// Work requests and completions as the transport sees them. No libibverbs
// types here; the numeric values of the enums equal the verbs ones (the glue
// static_asserts this) so the glue converts by cast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace usrc::rc {

constexpr uint32_t kMaxSge = 8;          // per work request, send and receive
constexpr uint32_t kMaxInline = 256;     // bytes of inline data per send WR
constexpr uint32_t kMaxWr = 16384;       // per queue
constexpr uint32_t kMaxMsgSize = 1u << 31;
constexpr uint64_t kMinRtoNs = 2'000'000;    // the adaptive retransmission timeout's floor
constexpr uint64_t kMinProbeNs = 200'000;    // the probe's (CompState::probed)
constexpr uint32_t kMaxWindow = 2048;       // packets in flight per context, at most
constexpr uint32_t kSharedWindow = 256;     // a QP's window, at least, however many share (Engine::share_window)
constexpr uint32_t kMinWindow = 8;          // packets in flight after a timeout (ReqState::cwnd)
// Packets in flight after a loss that later packets revealed (a NAK), at
// least: kLossWindow, or half the QP's window if that is less. A random loss
// of 1% would otherwise hold the window near 14 packets, where the sender
// stalls more than it resends: ib_write_bw 64 KB across a veth at MTU 9000
// kept 0.42 of its loss-free figure at 32, 0.65 at 64, and 0.79 at 256 (as many
// as a receiver keeps beyond a gap by default, USRC_RX_HOLD) with the NAK
// saying how many are missing (wire::bth::hole). A QP keeps 256 packets of a
// shared window anyway (kSharedWindow). The Local ACK Timeout, and a second
// retransmission-timer expiry without progress, go down to kMinWindow.
constexpr uint32_t kLossWindow = 256;
constexpr uint32_t kMaxGsoBytes = 65507;     // UDP payload of one IPv4 datagram (GSO send)
// Send WQEs placed directly in a same-host peer's memory (Engine::post_send)
// and completed, but not yet acknowledged, held beyond the SQ's capacity.
constexpr uint32_t kPlacedSlack = 8;

// = enum ibv_qp_state. An RC QP never enters sqe (only unreliable QPs do;
// an RC send queue error takes the QP to err): check_modify_qp has no
// transition into it and the engine sets err only.
enum class QpState : uint8_t { reset = 0, init, rtr, rts, sqd, sqe, err };

// A QP receives from RTR on (IBA 10.3.1): in RESET, INIT and ERROR its
// peer's packets are dropped, and it sends no response.
constexpr bool receives(QpState s) { return s != QpState::reset && s != QpState::init && s != QpState::err; }

enum class WcStatus : uint8_t {   // = enum ibv_wc_status
  success = 0, loc_len_err = 1, loc_qp_op_err = 2, loc_prot_err = 4, wr_flush_err = 5, mw_bind_err = 6,
  rem_inv_req_err = 9, rem_access_err = 10, rem_op_err = 11, retry_exc_err = 12,
  rnr_retry_exc_err = 13, fatal_err = 19, general_err = 21,
  tm_err = 22, tm_rndv_incomplete = 23,   // tag matching (tm.h)
};

enum class WcOpcode : uint8_t {   // = enum ibv_wc_opcode
  send = 0, rdma_write = 1, rdma_read = 2, comp_swap = 3, fetch_add = 4, bind_mw = 5, local_inv = 6,
  atomic_write = 9,
  recv = 128, recv_rdma_with_imm = 129,
  tm_add = 130, tm_del = 131, tm_sync = 132, tm_recv = 133, tm_no_tag = 134,   // tag matching (tm.h)
};

enum class WrOpcode : uint8_t {   // = enum ibv_wr_opcode (the supported subset)
  rdma_write = 0, rdma_write_imm = 1, send = 2, send_imm = 3, rdma_read = 4,
  atomic_cmp_swp = 5, atomic_fetch_add = 6, local_inv = 7, bind_mw = 8, send_inv = 9,
  atomic_write = 15,
};

// What each WR opcode means, and the packets it is made of: the WR
// opcode table (wr_opcode.h).

// Initiator depth and responder resources: rxe's 128, since perftest
// gives its client the server's responder resources as initiator depth.
constexpr uint32_t kMaxRdAtomic = 128;

enum WrFlags : uint32_t {         // = enum ibv_send_flags
  kFence = 1, kSignaled = 2, kSolicited = 4, kInline = 8,
  // (Not a verbs flag: a WQE the engine posted itself for tag matching's
  // rendezvous, Engine::tm_wqe_done.)
  kTmInternal = 1u << 31,
};

struct Sge {
  uint8_t *addr;
  uint32_t length;
  uint32_t lkey = 0;   // the MR it was mapped through (Engine::invalidate_lkey)
};
static_assert(sizeof(Sge) == 16);

// The pieces of bytes [off, off + len) of a scatter/gather list, in order:
// f(address, length) for each, until f returns false (then false).
template <class F>
inline bool for_each_piece(const Sge *sge, uint32_t num_sge, uint32_t off, uint32_t len, F f) {
  for (uint32_t i = 0; i < num_sge && len; i++) {
    const Sge &g = sge[i];
    if (off >= g.length) {
      off -= g.length;
      continue;
    }
    const uint32_t n = g.length - off < len ? g.length - off : len;
    if (!f(g.addr + off, n)) return false;
    len -= n;
    off = 0;
  }
  return true;
}

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::send;
  uint32_t flags = 0;
  // Network byte order, as in ibv_send_wr; SEND_WITH_INV: the R_Key to
  // invalidate, in host order (ibv_send_wr's invalidate_rkey, its union).
  uint32_t imm_be = 0;
  uint64_t remote_va = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;       // atomics: compare (CMP_SWP) or add (FETCH_ADD)
  uint64_t swap = 0;
  uint32_t xrc_srqn = 0;          // XRC: the target's SRQ (the XRCETH)
  uint32_t num_sge = 0;
  Sge sge[kMaxSge];               // validated by the glue (lkey, bounds, access)
};

struct RecvWr {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  Sge sge[kMaxSge];
};

// A WR into its queue slot: the SGEs in use only (most WRs have one of
// kMaxSge; the whole struct was a fifth of a small send's copying).
template <class Wr>
inline void copy_wr(Wr &to, const Wr &from) {
  static_assert(std::is_trivially_copyable_v<Wr> && std::is_standard_layout_v<Wr>);
  std::memcpy(static_cast<void *>(&to), &from, offsetof(Wr, sge));
  for (uint32_t i = 0; i < from.num_sge; i++) to.sge[i] = from.sge[i];
}

struct Completion {
  uint64_t wr_id;
  WcStatus status;
  WcOpcode opcode;
  bool with_imm;
  bool solicited;
  uint32_t byte_len;
  uint32_t imm_be;
  uint32_t qp_num;
  uint32_t src_qp;
  uint16_t slid;
  uint64_t timestamp_ns;
  bool grh = false;     // a UD receive whose buffer starts with the GRH (IBV_WC_GRH)
  bool with_inv = false;   // a SEND_WITH_INV's: imm_be holds the invalidated R_Key (host order)
  // Tag matching (tm.h): kWcTm* flags, and the TMH's app context and tag
  // (ibv_wc_tm_info).
  uint8_t tm_flags = 0;
  uint32_t tm_priv = 0;
  uint64_t tm_tag = 0;
};
constexpr uint8_t kWcTmSyncReq = 1u << 4, kWcTmMatch = 1u << 5, kWcTmDataValid = 1u << 6;   // = IBV_WC_TM_*

// A work completion laid out as libibverbs' struct ibv_wc (its ABI, which
// the verbs glue checks field by field): what the transport writes
// straight into a poller's array (Engine::DirectWc) instead of a CQ ring.
struct Wc {
  uint64_t wr_id;
  uint32_t status;       // WcStatus
  uint32_t opcode;       // WcOpcode
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_be;       // network byte order
  uint32_t qp_num;
  uint32_t src_qp;
  uint32_t wc_flags;     // kWcWithImm
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};
constexpr uint32_t kWcWithImm = 1u << 1;   // = IBV_WC_WITH_IMM
constexpr uint32_t kWcWithInv = 1u << 3;   // = IBV_WC_WITH_INV

}  // namespace usrc::rc
