#include "usrc/rc/cq.h"

#include <mutex>

namespace usrc::rc {

bool Cq::push(const Completion &c) {
  bool fire = false, over = false, stored = false;
  {
    std::lock_guard g(mu_);
    size_t next = (tail_ + 1) % ring_.size();
    if (next == head_) {
      over = !overflowed_;
      overflowed_ = true;
    } else {
      ring_[tail_] = c;
      tail_ = next;
      entries_.fetch_add(1, std::memory_order_release);
      stored = true;
      // A solicited-only arm fires on a solicited or an error completion.
      if (arm_ == Arm::next || (arm_ == Arm::solicited &&
                                (c.solicited || c.status != WcStatus::success))) {
        last_fired_ = arm_;
        arm_ = Arm::none;
        fire_seq_.fetch_add(1, std::memory_order_release);
        fire = true;
      }
    }
  }
  if (over && hooks_) hooks_->overflow(*this);
  if (fire) {
    if (hooks_) hooks_->notify(*this);
    sent_seq_.fetch_add(1, std::memory_order_release);
  }
  return stored;
}

size_t Cq::poll(Completion *out, size_t max) {
  if (entries_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard g(mu_);
  size_t n = 0;
  while (n < max && head_ != tail_) {
    out[n++] = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
  }
  entries_.fetch_sub(n, std::memory_order_relaxed);
  return n;
}

bool Cq::empty() const { return entries_.load(std::memory_order_acquire) == 0; }

void Cq::arm(bool solicited_only) {
  std::lock_guard g(mu_);
  // Arming "next" is never weakened to "solicited" by a later call.
  if (!solicited_only) arm_ = Arm::next;
  else if (arm_ == Arm::none) arm_ = Arm::solicited;
}

bool Cq::rearm_if_empty() {
  std::lock_guard g(mu_);
  if (head_ != tail_) return false;
  if (last_fired_ == Arm::next || arm_ == Arm::none) arm_ = last_fired_;
  return true;
}

void Cq::resize(uint32_t depth) {
  std::lock_guard g(mu_);
  size_t used = (tail_ + ring_.size() - head_) % ring_.size();
  if (used > depth) return;
  std::vector<Completion> r(depth + 1);
  for (size_t i = 0; i < used; i++) r[i] = ring_[(head_ + i) % ring_.size()];
  ring_.swap(r);
  head_ = 0;
  tail_ = used;
}

}  // namespace usrc::rc
