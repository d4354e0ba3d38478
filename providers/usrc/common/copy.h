// Memory helpers of the per-message path: a copy for small payloads, and
// asking for a range's cache lines ahead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace usrc {

// Copies n bytes (a small message's payload, a few hundred at most) with
// unaligned 16-byte moves, 64 B in four and no loop: a memcpy of a size
// the compiler knows to be small may become `rep movs`, whose start-up
// costs more than the whole copy, and a libc call costs as much again.
[[gnu::always_inline]] inline void copy_small(uint8_t *d, const uint8_t *s, size_t n) {
  auto mv = [&](size_t at, size_t k) { __builtin_memcpy(d + at, s + at, k); };
  if (n > 64) {
    size_t i = 0;
    for (; i + 64 < n; i += 64) mv(i, 16), mv(i + 16, 16), mv(i + 32, 16), mv(i + 48, 16);
    mv(n - 64, 16), mv(n - 48, 16), mv(n - 32, 16), mv(n - 16, 16);
  } else if (n > 32) {
    mv(0, 16), mv(16, 16), mv(n - 32, 16), mv(n - 16, 16);
  } else if (n >= 16) {
    mv(0, 16), mv(n - 16, 16);
  } else if (n >= 8) {
    mv(0, 8), mv(n - 8, 8);
  } else if (n >= 4) {
    mv(0, 4), mv(n - 4, 4);
  } else {
    for (size_t i = 0; i < n; i++) d[i] = s[i];
  }
}

// Whether the CPU has PREFETCHW (x86): a line fetched with it comes
// exclusive, ready for the store, where a plain prefetch brings it shared
// and the store then asks the other core for it once more. A ring slot the
// consumer read last is fetched for writing at about two thirds of the cost
// per slot that way.
#if defined(__x86_64__)
inline const bool has_prefetchw = (__builtin_cpu_init(), __builtin_cpu_supports("prfchw") != 0);
#else
inline const bool has_prefetchw = false;
#endif

// Asks for the cache lines of [p, p + n) all at once (for writing if
// Write), so that the accesses that follow do not miss one after another.
template <bool Write = false>
inline void prefetch_lines(const void *p, size_t n) {
  const auto *b = static_cast<const uint8_t *>(p);
#if defined(__x86_64__)
  if (Write && has_prefetchw) {
    for (size_t off = 0; off < n; off += 64) asm volatile("prefetchw %0" ::"m"(b[off]));
    return;
  }
#endif
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(b + off, Write);
}

}  // namespace usrc
