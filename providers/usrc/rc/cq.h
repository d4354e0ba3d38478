// A completion queue: a bounded ring with one producer, the transport (it
// pushes under the engine lock), and any number of pollers, which take the
// CQ's own small lock between them but never the engine's. The producer
// takes no lock and makes no atomic read-modify-write: a completion costs
// two plain stores and an index. Arming for notification is IBA "request
// completion notification": the next completion (or the next solicited
// one) fires once.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "usrc/common/lock.h"
#include "usrc/rc/buffer.h"
#include "usrc/rc/types.h"

namespace usrc::rc {

class Cq {
 public:
  enum class Arm : uint8_t { none, next, solicited };
  struct Hooks {
    virtual void notify(Cq &) = 0;      // a completion event fires
    virtual void overflow(Cq &) = 0;    // the ring was full: IBV_EVENT_CQ_ERR
   protected:
    ~Hooks() = default;
  };

  // src: where the ring's array comes from (nullptr: the heap).
  Cq(uint32_t depth, Hooks *hooks, BufferSource *src = nullptr)
      : ring_(depth + 1, src, BufferKind::cq), size_(depth + 1), hooks_(hooks) {}
  uint32_t depth() const { return static_cast<uint32_t>(size_ - 1); }

  // The producer's side and the arm, under the engine lock (arm_ is the
  // producer's to read when it fires, without a fence). push returns false
  // (and reports overflow) if the ring is full. (Always inlined: as a call
  // it cost as much as the rest of a received message.)
  [[gnu::always_inline]] bool push(const Completion &c) {
    const size_t t = tail_.load(std::memory_order_relaxed), n = next(t);
    if (n == head_.load(std::memory_order_acquire)) return overflow();   // (pollers read up to head first)
    ring_[t] = c;
    tail_.store(n, std::memory_order_release);
    // A solicited-only arm fires on a solicited or an error completion.
    if (arm_ == Arm::next ||
        (arm_ == Arm::solicited && (c.solicited || c.status != WcStatus::success)))
      fire();
    return true;
  }
  // A push now would find the ring full (the producer's side).
  bool full() const { return next(tail_.load(std::memory_order_relaxed)) == head_.load(std::memory_order_acquire); }
  void arm(bool solicited_only);
  // Any thread: up to max completions, oldest first, each handed to
  // f(const Completion &) as it is taken (no copy in between); returns how
  // many.
  template <class F>
  size_t poll_each(size_t max, F f) {
    if (head_.load(std::memory_order_relaxed) == tail_.load(std::memory_order_acquire))
      return 0;   // (the common empty poll: no lock)
    std::lock_guard g(mu_);
    size_t h = head_.load(std::memory_order_relaxed);
    const size_t t = tail_.load(std::memory_order_acquire);
    size_t n = 0;
    for (; n < max && h != t; n++, h = next(h)) f(ring_[h]);
    head_.store(h, std::memory_order_release);
    return n;
  }
  size_t poll(Completion *out, size_t max) {
    return poll_each(max, [&](const Completion &c) { *out++ = c; });
  }
  // Nothing waits in the ring and no arm is set (under the engine lock): a
  // completion made now may skip the ring for a poller's array
  // (Engine::DirectWc) without passing an older one or an event.
  bool idle() const { return arm_ == Arm::none && empty(); }
  // A push found the ring full (once set, for good: the CQ is in error).
  bool overflowed() const { return overflowed_; }
  bool empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }
  // Completion events fired (counted with the completion that fired them),
  // sent (counted once the event is out), and dealt with by a poller that
  // found the ring empty: see rearm_if_empty.
  uint32_t fire_seq() const { return fire_seq_.load(std::memory_order_acquire); }
  bool sent(uint32_t seq) const {
    return int32_t(sent_seq_.load(std::memory_order_acquire) - seq) >= 0;
  }
  bool fired() const { return fire_seq() != handled_seq_.load(std::memory_order_relaxed); }
  void handled(uint32_t seq) { handled_seq_.store(seq, std::memory_order_relaxed); }
  // A poller found the ring empty and took an unread event of this CQ back
  // from the channel: restore the arm that fired, if the ring is still
  // empty. False means new completions came: the event must stand. Under
  // the engine lock.
  bool rearm_if_empty();
  // Under the engine lock; fails silently if current entries do not fit.
  void resize(uint32_t depth);
  // An array for depth entries, from the ring's source (any thread).
  Buffer<Completion> storage(uint32_t depth) const { return Buffer<Completion>(depth + 1, ring_.source(), BufferKind::cq); }
  // The same with that array (from storage()): false if the current
  // entries do not fit it. True: b has the old array, to be freed.
  bool resize(Buffer<Completion> &b);
  // Drops the completions of QP qpn not yet polled, the others kept in
  // order: the QP went back to RESET (as the kernel's drivers clean the
  // CQ then). Under the engine lock.
  void clean(uint32_t qpn);

 private:
  size_t next(size_t i) const { return i + 1 == size_ ? 0 : i + 1; }
  bool overflow();   // push() found the ring full: reports it once, false
  void fire();       // push() met the arm: the event fires
  Buffer<Completion> ring_;   // one slot always empty: full is tail + 1 == head
  size_t size_;                    // ring_.size(), kept (size() divides by sizeof)
  Hooks *hooks_;
  Arm arm_ = Arm::none;
  Arm last_fired_ = Arm::none;
  bool overflowed_ = false;
  std::atomic<uint32_t> fire_seq_{0}, sent_seq_{0}, handled_seq_{0};
  alignas(64) std::atomic<size_t> tail_{0};   // the producer's: the next slot it fills
  alignas(64) std::atomic<size_t> head_{0};   // the pollers': the next slot to read
  usrc::Lock mu_;                             // between pollers (and resize)
};

}  // namespace usrc::rc
