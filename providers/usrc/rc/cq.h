// A completion queue: a bounded ring filled by the transport (under the
// engine lock) and drained by poll_cq (which may not hold it), so it has a
// small lock of its own. Arming for notification is IBA "request completion
// notification": the next completion (or the next solicited one) fires once.
#pragma once

#include <atomic>
#include <vector>

#include "usrc/common/lock.h"
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

  Cq(uint32_t depth, Hooks *hooks) : ring_(depth + 1), hooks_(hooks) {}
  uint32_t depth() const { return static_cast<uint32_t>(ring_.size() - 1); }

  // Returns false (and reports overflow) if the ring is full.
  bool push(const Completion &c);
  size_t poll(Completion *out, size_t max);
  bool empty() const;
  void arm(bool solicited_only);
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
  // empty. False means new completions came: the event must stand.
  bool rearm_if_empty();
  void resize(uint32_t depth);  // fails silently if current entries do not fit

 private:
  mutable usrc::Lock mu_;
  std::vector<Completion> ring_;
  size_t head_ = 0, tail_ = 0;
  Arm arm_ = Arm::none;
  Arm last_fired_ = Arm::none;
  std::atomic<uint32_t> fire_seq_{0}, sent_seq_{0}, handled_seq_{0};
  // Entries in the ring, kept with it under mu_: a poll of an empty CQ (a
  // polling application's common case) and empty() read it without the
  // lock.
  std::atomic<size_t> entries_{0};
  bool overflowed_ = false;
  Hooks *hooks_;
};

}  // namespace usrc::rc
