#include "usrc/common/lock.h"

#include <sched.h>
#include <time.h>

namespace usrc {

void Lock::wait() {
  for (uint32_t i = 0;; i++) {
    if (!v_.load(std::memory_order_relaxed) && !v_.exchange(1, std::memory_order_acquire)) return;
    if (i < 64) {
      cpu_relax();
    } else if (i < 64 + 256) {
      sched_yield();
    } else {
      const timespec nap{0, 50'000};
      nanosleep(&nap, nullptr);
    }
  }
}

}  // namespace usrc
