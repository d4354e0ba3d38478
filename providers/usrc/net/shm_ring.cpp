// The shared-memory ring (shm.h): producers claim a slot, fill it and
// publish it; the owner's engine consumes in order; doorbells wake an
// owner asleep on its socket; what finds a ring full waits in a backlog.
#include <signal.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "usrc/common/copy.h"
#include "usrc/common/guard.h"
#include "usrc/net/shm_layout.h"

namespace usrc::net {

namespace {

constexpr uint64_t kMask = ShmNic::kSlots - 1;
static_assert((ShmNic::kSlots & kMask) == 0, "a power of two");
// The doorbell: a UDP datagram too short to be an IBA packet.
constexpr uint8_t kDoorbell[4] = {'u', 's', 'd', 'b'};
constexpr uint64_t kStuckNs = 1'000'000'000;
// Datagrams that found a peer's ring full, waiting for room (bytes).
constexpr size_t kBacklogMax = 8u << 20;

}  // namespace

// Claims the next free slot of r, or nullptr if the ring is full. (Bounded:
// a ring whose numbers make no sense drops rather than spins.)
ShmSlot *ShmNic::claim(ShmRing &r, uint64_t *pos_out) {
  uint64_t pos = r.tail.load(std::memory_order_relaxed);
  for (int tries = 0; tries < 4096; tries++) {
    const uint64_t idx = pos & kMask;
    ShmSlot *s = &r.slots[idx];
    const auto d = static_cast<int64_t>(seq_of(*s, idx) - pos);
    if (d == 0) {
      // (Sequentially consistent: ring_if_asleep's look at `sleeping`
      // after it is what keeps a sleeping consumer from missing the slot.)
      if (r.tail.compare_exchange_weak(pos, pos + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) {
        if (s->pid.load(std::memory_order_relaxed) != pid_) s->pid.store(pid_, std::memory_order_relaxed);
        *pos_out = pos;
        return s;
      }
    } else if (d < 0) {
      return nullptr;   // full
    } else {
      pos = r.tail.load(std::memory_order_relaxed);
    }
  }
  return nullptr;
}

// Hands a filled slot to the consumer: len bytes, as datagrams of seg bytes
// (seg >= len: one datagram).
void ShmNic::publish(ShmSlot &s, uint64_t pos, Endpoint src, size_t len, size_t seg) {
  s.len = static_cast<uint32_t>(len);
  s.src_ip = src.ip;
  s.src_port = src.port;
  s.seg = static_cast<uint16_t>(seg < len ? seg : 0);
  set_seq(s, pos & kMask, pos + 1);
}

// Hands the next len bytes at the iovec cursor, datagrams of seg bytes
// (seg >= len: one), to pe's ring r: into a claimed slot, or, if r is full
// or `wait` (datagrams to pe wait already), behind them in pe's backlog,
// which takes them on to the ring in order (drain()). After the first
// one that waits, `wait` is set. False: dropped (larger than a slot, a
// backlog full up, or a source the application unmapped, guard.h: its
// slot then holds an empty datagram, dropped by the receiver). The
// cursor moves past them.
bool ShmNic::push(Peer &pe, ShmRing &r, Endpoint src, const iovec *&iov, size_t &off, size_t len,
                  size_t seg, bool &wait) {
  if (len > kSlotData) return fill(nullptr, iov, off, len), false;
  uint64_t pos = 0;
  ShmSlot *s = wait ? nullptr : claim(r, &pos);
  if (!s) {
    wait = true;
    return enqueue(pe, src, iov, off, len, seg);
  }
  if (!fill(s->data, iov, off, len)) {
    publish(*s, pos, src, 0, 0);
    return false;
  }
  publish(*s, pos, src, len, seg);
  prefetch_next(r, pos, len);
  return true;
}

// Copies the next len bytes at the iovec cursor to dst (nullptr: skips
// them); the cursor moves past them. False if a source was no longer
// mapped (guard.h; the rest is skipped).
bool ShmNic::fill(uint8_t *dst, const iovec *&iov, size_t &off, size_t len) {
  bool ok = true;
  for (size_t need = len; need;) {
    const size_t take = std::min(iov->iov_len - off, need);
    if (dst && !guard::copy(dst, static_cast<const uint8_t *>(iov->iov_base) + off, take)) {
      dst = nullptr;
      ok = false;
    }
    if (dst) dst += take;
    need -= take;
    off += take;
    if (off == iov->iov_len) iov++, off = 0;
  }
  return ok;
}

// The backlog of datagrams to a peer whose ring was full: records of a
// header and the datagrams, 8-byte aligned, taken from q_off on.
namespace {
struct BacklogRec {
  uint32_t len;
  uint16_t seg;        // as ShmSlot::seg
  uint16_t src_port;
};
constexpr size_t rec_size(size_t len) { return sizeof(BacklogRec) + ((len + 7) & ~size_t(7)); }
}  // namespace

bool ShmNic::enqueue(Peer &pe, Endpoint src, const iovec *&iov, size_t &off, size_t len, size_t seg) {
  if (pe.q.size() - pe.q_off + rec_size(len) > kBacklogMax) return fill(nullptr, iov, off, len), false;
  if (pe.q.empty()) backlog_peers_++;
  const size_t at = pe.q.size();
  pe.q.resize(at + rec_size(len));
  const BacklogRec h{static_cast<uint32_t>(len), static_cast<uint16_t>(seg < len ? seg : 0), src.port};
  std::memcpy(&pe.q[at], &h, sizeof h);
  if (!fill(&pe.q[at + sizeof h], iov, off, len)) {   // (its source unmapped: not kept)
    if (at == 0) backlog_clear(pe);
    else pe.q.resize(at);
    return false;
  }
  return true;
}

// Moves pe's backlog into its ring r, as far as there is room. True if
// nothing waits any more.
bool ShmNic::drain(Peer &pe, ShmRing &r) {
  const uint32_t ip = inner_->local().ip;
  while (pe.q_off < pe.q.size()) {
    BacklogRec h;
    std::memcpy(&h, &pe.q[pe.q_off], sizeof h);
    uint64_t pos = 0;
    ShmSlot *s = claim(r, &pos);
    if (!s) return false;
    std::memcpy(s->data, &pe.q[pe.q_off + sizeof h], h.len);
    publish(*s, pos, {ip, h.src_port}, h.len, h.seg ? h.seg : h.len);
    pe.q_off += rec_size(h.len);
  }
  backlog_clear(pe);
  return true;
}

void ShmNic::drain_all() {
  for (Peer &p : peers_) {
    if (p.q.empty()) continue;
    if (ShmRing *r = ring_of(&p)) {   // (a ring gone drops what waited for it)
      drain(p, *r);
      ring_if_asleep(*r, p.ep);
    }
  }
}

void ShmNic::backlog_clear(Peer &pe) {
  if (!pe.q.empty()) backlog_peers_--;
  pe.q.clear();
  pe.q_off = 0;
  if (pe.q.capacity() > (1u << 20)) pe.q.shrink_to_fit();
}

bool ShmNic::tx_blocked(Endpoint dst) {
  if (!backlog_peers_) return false;
  const Peer *p = find_peer(dst);
  return p && !p->q.empty();
}

// After filling the slot at pos with len bytes: the next slot's header,
// which the consumer wrote when it freed it, is what the next claim reads
// first, and a stream's next slot takes about as many lines as this one
// did. Both are fetched for writing now, while the application goes on,
// so that neither the next copy nor the fences after it (the publish, the
// engine lock) wait for them one by one.
void ShmNic::prefetch_next(ShmRing &r, uint64_t pos, size_t len) {
  ShmSlot &next = r.slots[(pos + 1) & kMask];
  prefetch_lines<true>(&next, std::min<size_t>(len + offsetof(ShmSlot, data), 2048));
}

uint8_t *ShmNic::tx_begin(Endpoint dst, uint16_t src_port, size_t *room) {
  Peer *pe = find_peer(dst);
  ShmRing *r = ring_of(pe);
  uint64_t pos = 0;
  // (Behind a backlog: send() queues it.)
  ShmSlot *s = r && pe->q.empty() ? claim(*r, &pos) : nullptr;
  if (!s) return nullptr;
  const Endpoint me = inner_->local();
  open_ = {r, s, pos, dst, {me.ip, src_port ? src_port : me.port}};
  *room = kSlotData;
  return s->data;
}

void ShmNic::tx_end(size_t len, size_t seg) {
  publish(*open_.slot, open_.pos, open_.src, len, seg);
  ring_if_asleep(*open_.ring, open_.dst);
  prefetch_next(*open_.ring, open_.pos, len);
  open_.slot = nullptr;
}

// After a run of datagrams published to r: a consumer about to sleep
// raises `sleeping`, fences, and looks at the ring's tail a last time; we
// claimed our slots from that tail (claim()) before we look at the flag.
// The claim and this look are sequentially consistent and the consumer's
// fence is too, so one of the two sees the other: the consumer the claim
// (it stays awake until the slot is published), or we the flag. No fence
// of our own (on x86 the claim's locked compare-and-swap orders it; a
// fence here waited for every line of the slot to reach the other core,
// once per slot). The flag stays up until the consumer wakes: a doorbell
// lost (a full socket buffer) is rung again by the next send, a
// retransmission at the latest.
void ShmNic::ring_if_asleep(ShmRing &r, Endpoint dst) {
  if (!r.sleeping.load(std::memory_order_seq_cst)) return;
  iovec iov{const_cast<uint8_t *>(kDoorbell), sizeof kDoorbell};
  TxPacket t{dst, &iov, 1};
  inner_->send({&t, 1});
}

size_t ShmNic::send(std::span<const TxPacket> pkts) {
  size_t sent = 0;
  udp_tx_.clear();
  const Endpoint me = inner_->local();
  ShmRing *run = nullptr;   // the ring the last datagrams went to
  Endpoint run_dst{};
  for (const TxPacket &p : pkts) {
    Peer *pe = find_peer(p.dst);
    ShmRing *r = ring_of(pe);
    if (r != run && run) ring_if_asleep(*run, run_dst);
    run = r;
    run_dst = p.dst;
    if (!r) {
      udp_tx_.push_back(p);
      continue;
    }
    const Endpoint src{me.ip, p.src_port ? p.src_port : me.port};
    size_t total = 0;
    for (size_t i = 0; i < p.iovcnt; i++) total += p.iov[i].iov_len;
    if (!total) continue;   // (no such datagram: nothing to copy)
    const size_t seg = p.segs > 1 && p.gso_size ? p.gso_size : total;
    const iovec *iov = p.iov;
    size_t off = 0;
    // Datagrams wait for room in this ring: those go first.
    bool wait = !pe->q.empty() && !drain(*pe, *r);
    if (total <= kSlotData) {   // (the common case: one slot, no divisions)
      if (push(*pe, *r, src, iov, off, total, seg, wait)) sent += p.segs;
      continue;
    }
    // As many whole segments per slot as fit.
    const size_t chunk = seg <= kSlotData ? kSlotData / seg * seg : seg;
    for (size_t left = total; left;) {
      const size_t len = std::min(chunk, left);
      if (push(*pe, *r, src, iov, off, len, seg, wait)) sent += (len + seg - 1) / seg;
      left -= len;
    }
  }
  if (run) ring_if_asleep(*run, run_dst);
  if (!udp_tx_.empty()) sent += inner_->send(udp_tx_);
  return sent;
}

size_t ShmNic::recv(std::span<RxPacket> out) {
  ShmRing &r = *own_;
  uint64_t head = head_.load(std::memory_order_relaxed);
  // What the last call handed out is done with: free it, in order.
  for (; released_ != head; released_++) {
    set_seq(r.slots[released_ & kMask], released_ & kMask, released_ + kSlots);
  }
  if (backlog_peers_) drain_all();   // (room in peers' rings since the last pass?)
  // The socket's turn: every call while it carries traffic (a peer off
  // this host), else every 64th, with room kept for it in a full batch so
  // that a busy ring does not starve it.
  const bool woken = udp_now_.load(std::memory_order_relaxed);
  const bool udp = woken || udp_hot_ || inner_->rx_pending() || ++udp_skip_ >= 64;
  const size_t ring_max = udp && out.size() > 1 ? out.size() / 2 : out.size();
  size_t k = 0;
  while (k < ring_max) {
    const uint64_t idx = head & kMask;
    ShmSlot &s = r.slots[idx];
    if (seq_of(s, idx) != head + 1) {
      // Not published: mostly an empty ring, or a writer in the middle of
      // its copy. Looked into only after many looks: the tail's cache line
      // is the writers' (reading it on every empty poll made each claim
      // fetch it back from us).
      if (++stuck_polls_ < 1024) break;
      stuck_polls_ = 0;
      if (r.tail.load(std::memory_order_relaxed) == head) {   // empty
        stuck_since_ = 0;
        break;
      }
      // Claimed by a producer that died before publishing (its process
      // gone for a second): skip it, or the ring stops here.
      const uint64_t now = coarse_ns();
      if (!stuck_since_) stuck_since_ = now;
      if (now - stuck_since_ < kStuckNs) break;
      const int32_t pid = s.pid.load(std::memory_order_relaxed);
      if (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH)) break;   // alive: wait
      stuck_since_ = 0;
      head++;
      out[k++] = {{0, 0}, s.data, 0, true};   // an empty datagram: dropped and counted as malformed
      continue;
    }
    stuck_since_ = stuck_polls_ = 0;
    const uint32_t len = s.len, seg = s.seg;
    // The header line is ours to write next (the free): asked for now, so
    // that the store does not wait for the producer's core then.
    prefetch_lines<true>(&s, 1);
    if (len > kSlotData) {   // not from one of us: handed out empty (malformed_drops)
      head++;
      out[k++] = {{s.src_ip, s.src_port}, s.data, 0, true};
      continue;
    }
    if (seg == 0) {
      head++;
      out[k++] = {{s.src_ip, s.src_port}, s.data, len, true};
      continue;
    }
    // Several datagrams: as many as the batch takes; the slot stays at the
    // head (not freed) until its last one is handed out. The producer's
    // core wrote them: their lines are asked for all at once on the first
    // look (up to 2 KB), not missed one after another as they are read.
    if (!seg_off_) prefetch_lines(s.data, std::min<size_t>(len, 2048));
    // (In locals: each store into out[] could otherwise change the slot's
    // fields as far as the compiler knows, and they were read again.)
    const Endpoint src{s.src_ip, s.src_port};
    const uint8_t *const data = s.data;
    uint32_t off = seg_off_;
    for (; off < len && k < ring_max; off += seg) out[k++] = {src, data + off, std::min(seg, len - off), true};
    seg_off_ = off;
    if (off < len) break;
    seg_off_ = 0;
    head++;
  }
  head_.store(head, std::memory_order_relaxed);
  if (udp && (maint_now_ || coarse_ns() >= maint_at_)) maintain();
  if (!udp || k == out.size()) return k;
  if (woken) udp_now_.store(false, std::memory_order_relaxed);
  udp_skip_ = 0;
  const size_t n = inner_->recv(out.subspan(k));
  size_t w = k;
  for (size_t i = k; i < k + n; i++) {
    if (out[i].len == sizeof kDoorbell && std::memcmp(out[i].data, kDoorbell, sizeof kDoorbell) == 0)
      continue;
    if (out[i].len == sizeof kHsBell && std::memcmp(out[i].data, kHsBell, sizeof kHsBell) == 0) {
      maint_now_ = true;   // a writer connected or answered
      continue;
    }
    out[w++] = out[i];
  }
  if (maint_now_) maintain();
  if (w > k) udp_hot_ = 1024;
  else if (udp_hot_) udp_hot_--;
  return w;
}

bool ShmNic::rx_pending() const {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  return seq_of(own_->slots[head & kMask], head & kMask) == head + 1 || inner_->rx_pending();
}

bool ShmNic::prepare_wait() {
  own_->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);   // (see ring_if_asleep)
  const uint64_t head = head_.load(std::memory_order_relaxed);
  // Sleep only on an empty ring: nothing claimed since the last datagram
  // taken. A slot claimed and not yet published keeps us awake: its writer
  // would ring once it publishes, but one that died never will, and only
  // looking again finds its slot stuck (and skips it).
  if (own_->tail.load(std::memory_order_relaxed) == head) return true;
  own_->sleeping.store(0, std::memory_order_relaxed);
  return false;
}

void ShmNic::end_wait() {
  own_->sleeping.store(0, std::memory_order_relaxed);
  udp_now_.store(true, std::memory_order_relaxed);   // the wake may have been the socket's
}

}  // namespace usrc::net
