// Tag matching (the verbs' TM offload: ibv_create_srq_ex with IBV_SRQT_TM,
// ibv_post_srq_ops; not in the IBA). A TM SRQ keeps, besides its receive
// WQEs, a list of tagged buffers. A SEND to an RC QP on it that starts
// with a tag matching header (TMH: opcode, app context, tag, big-endian)
// is matched against the list in the order it was posted (TMH.tag & mask
// == tag): an EAGER message's payload, less its TMH, goes into the
// buffer; a rendezvous request (RNDV: TMH and RVH, the sender's address,
// R_Key and length) has the responder READ the data from the sender into
// it, then send the sender a FIN (Engine::tm_complete). A message that
// matches nothing is unexpected: it goes, TMH and all, into an ordinary
// receive WQE, and counts towards the phase synchronization (TagList).
#pragma once

#include <cstdint>
#include <vector>

#include "usrc/rc/qp.h"

namespace usrc::rc {

constexpr uint32_t kTmhLen = 16, kRvhLen = 16;   // struct ibv_tmh, struct ibv_rvh
enum TmhOp : uint8_t { kTmhNoTag = 0, kTmhRndv = 1, kTmhFin = 2, kTmhEager = 3 };   // = enum ibv_tmh_op
// The limits the device reports (ibv_tm_caps): a rendezvous request is one
// packet of at most kTmMaxRndvHdr bytes (a longer one is unexpected).
constexpr uint32_t kTmMaxRndvHdr = 64, kTmMaxTags = 1024, kTmMaxOps = 1024;
// A QP on a TM SRQ has room in its send queue for this many WQEs of its
// own (a READ and a FIN per rendezvous), beyond the application's.
constexpr uint32_t kTmWqes = 16;

// A TM SRQ's list of tagged buffers, by handle (the index), in posted
// order, under the engine's lock. Phase synchronization (man
// ibv_post_srq_ops): the device counts the unexpected messages it
// delivered (unexp_hw), the application reports how many it has handled
// (unexp_sw, with IBV_OPS_TM_SYNC). A tag added while the two differ may
// be one that an unexpected message the application has not seen yet
// should have taken: it matches nothing (ready false) until an operation
// makes them equal; its ADD completes with IBV_WC_TM_SYNC_REQ.
struct TagList {
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    RecvWqe wqe;                        // the buffer: recv_wr_id, SGEs, length, bad
    uint64_t tag = 0, mask = 0;
    uint32_t prev = kNone, next = kNone;   // the list (or the free list: next)
    bool posted = false;
    bool ready = false;
  };
  std::vector<Entry> e;
  uint32_t head = kNone, tail = kNone, free = kNone;
  uint32_t waiting = 0;                 // posted, not ready
  uint32_t unexp_hw = 0, unexp_sw = 0;
  uint32_t max_ops = 1;                 // list operations per ibv_post_srq_ops
  Cq *cq = nullptr;                     // where their completions go

  explicit TagList(uint32_t n) : e(n) {
    for (uint32_t i = n; i-- > 0;) e[i].next = free, free = i;
  }
  bool in_sync() const { return unexp_hw == unexp_sw; }
  // A free entry, posted at the end of the list (nullptr: the list is full).
  Entry *add() {
    if (free == kNone) return nullptr;
    const uint32_t h = free;
    Entry &x = e[h];
    free = x.next;
    x.prev = tail, x.next = kNone;
    (tail == kNone ? head : e[tail].next) = h;
    tail = h;
    x.posted = true;
    x.ready = in_sync();
    waiting += !x.ready;
    return &x;
  }
  void remove(uint32_t h) {
    Entry &x = e[h];
    (x.prev == kNone ? head : e[x.prev].next) = x.next;
    (x.next == kNone ? tail : e[x.next].prev) = x.prev;
    waiting -= !x.ready;
    x.posted = x.ready = false;
    x.next = free, free = h;
  }
  // The application has handled n unexpected messages.
  void sync(uint32_t n) {
    unexp_sw = n;
    if (!in_sync() || !waiting) return;
    for (uint32_t h = head; h != kNone; h = e[h].next) e[h].ready = true;
    waiting = 0;
  }
  // The first ready entry that takes tag, or kNone.
  uint32_t match(uint64_t tag) const {
    for (uint32_t h = head; h != kNone; h = e[h].next)
      if (e[h].ready && (tag & e[h].mask) == e[h].tag) return h;
    return kNone;
  }
};

}  // namespace usrc::rc
