// Unpredictable numbers for identifiers another process should not guess
// (QPNs, process slots, memory keys): from the kernel's generator.
#pragma once

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

namespace usrc {

inline uint32_t random_u32() {
  uint32_t v;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == sizeof v) return v;
  // (Only before the kernel's pool is ready, early at boot: not secret,
  // but still different from one process and moment to the next.)
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  uint64_t x = uint64_t(t.tv_nsec) ^ (uint64_t(t.tv_sec) << 32) ^ (uint64_t(getpid()) << 20) ^
               reinterpret_cast<uintptr_t>(&v);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

}  // namespace usrc
