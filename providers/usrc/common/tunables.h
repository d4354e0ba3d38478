// Every tunable of usrc, in one place. Each is read once from the
// environment variable named in the table; usrc(7) is generated from it
// (man/mangen.cpp), so the doc string is what users read.
#pragma once
#include <cstdint>

namespace usrc {

#define USRC_TUNABLES(X)                                                                   \
  X(uint32_t, tx_window, "USRC_TX_WINDOW", 0,                                              \
    "Max request packets in flight per context, shared by its QPs, each QP at least 256 or"  \
    " this (0: derived from the socket receive buffer)")    \
  X(uint32_t, ack_every, "USRC_ACK_EVERY", 16,                                             \
    "The requester asks for an ACK (AckReq) at least every this many packets")             \
  X(uint32_t, sock_buf, "USRC_SOCK_BUF", 8u << 20,                                         \
    "UDP socket send/receive buffer in bytes, the ofi udp provider's too (root may exceed"    \
    " net.core.rmem_max)")                                                                   \
  X(uint32_t, rx_batch, "USRC_RX_BATCH", 32, "Datagrams received per recvmmsg call")       \
  X(uint32_t, gso, "USRC_GSO", 64,                                                         \
    "UDP backend: the most packets sent as one UDP GSO send, up to 64 (0 or 1: no GSO and"  \
    " no GRO)")                                                                            \
  X(uint32_t, retransmit_cap, "USRC_RETRANSMIT_CAP", 256,                                  \
    "Max packets one QP (re)transmits per progress pass")                                  \
  X(uint32_t, rx_hold, "USRC_RX_HOLD", 256,                                                \
    "Request packets a context keeps when they arrive beyond a lost one, to take in order"  \
    " once it is resent (0: none; they are dropped and resent, go-back-N; at most 1024)")  \
  X(uint32_t, busy_poll_us, "USRC_BUSY_POLL_US", 50,                                       \
    "Progress thread keeps polling this long after the last packet it received before"    \
    " sleeping, on an otherwise idle core (0: sleep at once; ignored with"                 \
    " USRC_PROGRESS_RT)")                                                                  \
  X(uint32_t, app_quiet_us, "USRC_APP_QUIET_US", 1000,                                    \
    "The progress thread leaves the engine (socket, timers) to the application while it"  \
    " polled within this many microseconds (0: the progress thread always receives too)")  \
  X(uint32_t, progress_rt, "USRC_PROGRESS_RT", 0,                                         \
    "Run the progress thread at real-time priority where permitted")                       \
  X(uint32_t, progress_slice_us, "USRC_PROGRESS_SLICE_US", 100,                            \
    "The progress thread's time slice (Linux 6.12 and later; 100 to 100000, 0: the"        \
    " kernel's default): a short slice lets it preempt a CPU-bound thread as soon as a"     \
    " packet wakes it, instead of after that thread's slice")                             \
  X(uint32_t, shm, "USRC_SHM", 1,                                                         \
    "UDP backend: datagrams to contexts on this host (same user and network namespace) go"  \
    " through their shared-memory ring instead of the socket (0: always the socket)")      \
  X(uint32_t, direct_write, "USRC_DIRECT_WRITE", 65536,                                    \
    "RDMA WRITEs up to this many bytes to a context on this host that exposes the memory"   \
    " (through its shared-memory ring: USRC_SHM) are written straight into the target"      \
    " process's memory and complete at once (0: never)")                                   \
  X(uint32_t, icrc_check, "USRC_ICRC_CHECK", 1,                                           \
    "Verify the ICRC of received packets (an ICRC of 0 from this host means none: see"    \
    " USRC_ICRC_LOCAL)")                                                                   \
  X(uint32_t, icrc_local, "USRC_ICRC_LOCAL", 0,                                            \
    "Compute every packet's ICRC and set no reserved BTH bit (0: packets that never leave" \
    " the host carry an ICRC of 0, as the kernel computes no checksum on loopback, and so" \
    " do those between two udp-backend peers, whose UDP checksum stands for it)")          \
  X(uint32_t, vendor_part_id, "USRC_VENDOR_PART_ID", 0x5553,                                \
    "vendor_part_id reported by query_device (a testing aid: tools that choose code paths"  \
    " by device id, e.g. perftest's ibv_wr_* path, can be steered onto generic paths)")

struct Tunables {
#define USRC_X(type, name, env, def, doc) type name = def;
  USRC_TUNABLES(USRC_X)
#undef USRC_X
  static const Tunables &get();   // read from the environment on first use
};

}  // namespace usrc
