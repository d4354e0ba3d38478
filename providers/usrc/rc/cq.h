// A completion queue: a bounded ring filled by the transport (under the
// engine lock) and drained by poll_cq (which may not hold it), so it has a
// small lock of its own. Arming for notification is IBA "request completion
// notification": the next completion (or the next solicited one) fires once.
#pragma once

#include <mutex>
#include <vector>

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
  void resize(uint32_t depth);  // fails silently if current entries do not fit

 private:
  mutable std::mutex mu_;
  std::vector<Completion> ring_;
  size_t head_ = 0, tail_ = 0;
  Arm arm_ = Arm::none;
  bool overflowed_ = false;
  Hooks *hooks_;
};

}  // namespace usrc::rc
