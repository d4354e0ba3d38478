#include "usrc/rc/cq.h"

#include <mutex>

namespace usrc::rc {

bool Cq::overflow() {
  if (!overflowed_ && hooks_) hooks_->overflow(*this);
  overflowed_ = true;
  return false;
}

void Cq::fire() {
  last_fired_ = arm_;
  arm_ = Arm::none;
  fire_seq_.fetch_add(1, std::memory_order_release);
  if (hooks_) hooks_->notify(*this);
  sent_seq_.fetch_add(1, std::memory_order_release);
}

void Cq::arm(bool solicited_only) {
  // Arming "next" is never weakened to "solicited" by a later call.
  if (!solicited_only) arm_ = Arm::next;
  else if (arm_ == Arm::none) arm_ = Arm::solicited;
}

bool Cq::rearm_if_empty() {
  if (!empty()) return false;
  if (last_fired_ == Arm::next || arm_ == Arm::none) arm_ = last_fired_;
  return true;
}

void Cq::resize(uint32_t depth) {
  Buffer<Completion> b = storage(depth);
  resize(b);
}

bool Cq::resize(Buffer<Completion> &r) {
  std::lock_guard g(mu_);   // (the producer is ours: the engine lock)
  const size_t h = head_.load(std::memory_order_relaxed), t = tail_.load(std::memory_order_relaxed);
  const size_t used = (t + size_ - h) % size_;
  if (used + 1 > r.size()) return false;
  for (size_t i = 0, k = h; i < used; i++, k = next(k)) r[i] = ring_[k];
  ring_.swap(r);
  size_ = ring_.size();
  head_.store(0, std::memory_order_relaxed);
  tail_.store(used, std::memory_order_release);
  return true;
}

void Cq::clean(uint32_t qpn) {
  std::lock_guard g(mu_);   // (pollers out; the producer is the caller)
  const size_t h = head_.load(std::memory_order_relaxed), t = tail_.load(std::memory_order_relaxed);
  size_t w = h;
  for (size_t r = h; r != t; r = next(r)) {
    if (ring_[r].qp_num == qpn) continue;
    if (w != r) ring_[w] = ring_[r];
    w = next(w);
  }
  tail_.store(w, std::memory_order_release);
}

}  // namespace usrc::rc
