// The lock of the datapath (an engine, a CQ): held for short stretches,
// taken and released once or more per message by the application's posts
// and polls. Unlike a pthread mutex it releases with a plain store, not an
// atomic read-modify-write (a pthread mutex must look for sleepers to wake,
// which was a tenth of a receiver's time at small-message rates). Waiters
// spin briefly, then yield the core, then sleep in short naps: a holder
// that lost its core gets it back, and one that waits long (an owner whose
// writer is stopped, see net/shm.h) costs next to nothing.
// Meets the Lockable requirements (std::lock_guard, std::unique_lock).
#pragma once

#include <atomic>
#include <cstdint>

namespace usrc {

// A spin-wait's pause: the core's hint that this is one.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Lock {
 public:
  void lock() {
    if (!v_.exchange(1, std::memory_order_acquire)) return;
    wait();
  }
  bool try_lock() {
    return !v_.load(std::memory_order_relaxed) && !v_.exchange(1, std::memory_order_acquire);
  }
  void unlock() { v_.store(0, std::memory_order_release); }
  // Whether some thread holds it now (a hint: it may change at once).
  bool held() const { return v_.load(std::memory_order_relaxed) != 0; }

 private:
  void wait();
  std::atomic<uint32_t> v_{0};
};

}  // namespace usrc
