// 24-bit Packet Sequence Numbers (IBA 9.7.1): arithmetic is modulo 2^24 and
// comparisons are made within half the PSN space, so FFFFFFh is "before" 0.
#pragma once
#include <cstdint>

namespace usrc::rc {

constexpr uint32_t kPsnMask = 0xffffff;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Signed distance a - b in (-2^23, 2^23].
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}
constexpr bool psn_lt(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_le(uint32_t a, uint32_t b) { return psn_diff(a, b) <= 0; }

// MSN is also 24 bits (IBA 9.7.5.1.2).
constexpr uint32_t msn_add(uint32_t msn, uint32_t n) { return (msn + n) & kPsnMask; }

// Local ACK Timeout (IBA 9.7.6.1.3): 4.096 us * 2^timeout; 0 means infinite.
constexpr uint64_t local_ack_timeout_ns(uint8_t timeout) {
  return timeout == 0 ? 0 : (4096ull << timeout);
}

// RNR NAK timer field (IBA table 45), in microseconds; code 0 is 655.36 ms.
constexpr uint32_t kRnrTimerUs[32] = {
    655360, 10,    20,    30,    40,    60,    80,    120,   160,   240,   320,
    480,    640,   960,   1280,  1920,  2560,  3840,  5120,  7680,  10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
constexpr uint64_t rnr_timer_ns(uint8_t code) { return kRnrTimerUs[code & 31] * 1000ull; }

}  // namespace usrc::rc
