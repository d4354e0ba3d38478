#include <catch2/catch.hpp>

#include "usrc/rc/psn.h"

using namespace usrc::rc;

TEST_CASE("PSN arithmetic wraps at 2^24", "[psn]") {
  CHECK(psn_add(0xffffff, 1) == 0);
  CHECK(psn_add(0xfffffe, 5) == 3);
  CHECK(psn_add(5, 0) == 5);
}

TEST_CASE("PSN comparison is modular over half the space", "[psn]") {
  CHECK(psn_diff(0, 0xffffff) == 1);
  CHECK(psn_diff(0xffffff, 0) == -1);
  CHECK(psn_lt(0xfffff0, 0x10));
  CHECK_FALSE(psn_lt(0x10, 0xfffff0));
  CHECK(psn_le(7, 7));
  CHECK(psn_diff(0x800000, 0) == -0x800000);   // the ambiguous half point
  CHECK(psn_diff(0x7fffff, 0) == 0x7fffff);
  for (uint32_t base : {0u, 1u, 0x7fffffu, 0x800000u, 0xfffff0u, 0xffffffu})
    for (uint32_t n : {0u, 1u, 100u, 0x7ffffeu}) {
      CHECK(psn_diff(psn_add(base, n), base) == static_cast<int32_t>(n));
      CHECK(psn_diff(base, psn_add(base, n)) == -static_cast<int32_t>(n));
    }
}

TEST_CASE("Local ACK Timeout and RNR timer follow the IBA formulas", "[psn]") {
  CHECK(local_ack_timeout_ns(0) == 0);            // infinite
  CHECK(local_ack_timeout_ns(1) == 8192);         // 4.096 us * 2
  CHECK(local_ack_timeout_ns(14) == 67108864);    // ~67 ms
  CHECK(rnr_timer_ns(0) == 655360000ull);         // 655.36 ms
  CHECK(rnr_timer_ns(1) == 10000);                // 0.01 ms
  CHECK(rnr_timer_ns(12) == 640000);              // 0.64 ms (ibv_rc_pingpong's)
  CHECK(rnr_timer_ns(31) == 491520000ull);
}
