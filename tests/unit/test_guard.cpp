// The fault-guarded copy (common/guard.h): a copy like memcpy, a fault in
// it a false result, any other fault the previous handler's.
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "usrc/common/guard.h"

using namespace usrc;

TEST_CASE("guarded copy: every size to 2100 bytes, every alignment, as memcpy", "[guard]") {
  guard::install();
  std::mt19937 rng(7);
  std::vector<uint8_t> src(2200), a(2200), b(2200);
  for (auto &x : src) x = uint8_t(rng());
  for (size_t n = 0; n <= 2100; n++)
    for (size_t so = 0; so < 8; so += 3)
      for (size_t dof = 0; dof < 8; dof++) {
        std::fill(a.begin(), a.end(), 0x5a);
        std::fill(b.begin(), b.end(), 0x5a);
        REQUIRE(guard::copy(a.data() + dof, src.data() + so, n));
        std::memcpy(b.data() + dof, src.data() + so, n);
        REQUIRE(a == b);
      }
  // Beyond the vector loop: rep movsb.
  std::vector<uint8_t> big(100000), out(100000);
  for (auto &x : big) x = uint8_t(rng());
  REQUIRE(guard::copy(out.data() + 1, big.data() + 3, 99000));
  CHECK(std::memcmp(out.data() + 1, big.data() + 3, 99000) == 0);
}

TEST_CASE("guarded copy: a page that is gone gives false, not a signal", "[guard]") {
  guard::install();
  const size_t page = 4096;
  auto *p = static_cast<uint8_t *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(p != MAP_FAILED);
  REQUIRE(mprotect(p + page, page, PROT_NONE) == 0);   // (a hole nothing else takes)
  std::vector<uint8_t> buf(8192, 1);
  const uint64_t before = guard::faults();
  int faults = 0;
  for (size_t n : {1, 3, 7, 15, 31, 63, 100, 300, 1500, 3000, 6000}) {
    INFO(n << " bytes across the hole's edge");
    CHECK_FALSE(guard::copy(buf.data(), p + page - n / 2 - 1 + (n == 1), n));   // reading
    CHECK_FALSE(guard::copy(p + page - n / 2 - 1 + (n == 1), buf.data(), n));   // writing
    faults += 2;
  }
  CHECK(guard::copy(buf.data(), p, page));   // (the pages around it are fine)
  CHECK(guard::faults() - before == uint64_t(faults));
  CHECK(guard::readable(p, page));
  CHECK_FALSE(guard::readable(p, page + 1));
  CHECK_FALSE(guard::readable(p + 2 * page - 10, 20));
  uint64_t word = 0;
  CHECK_FALSE(guard::run([&] { word = __atomic_fetch_add(reinterpret_cast<uint64_t *>(p + page), 1, __ATOMIC_SEQ_CST); }));
  munmap(p, 3 * page);
}

namespace {
sigjmp_buf chained_jb;
volatile sig_atomic_t chained_calls = 0;
void chained(int) {
  chained_calls = chained_calls + 1;
  siglongjmp(chained_jb, 1);
}
}  // namespace

TEST_CASE("guarded copy: a fault outside it goes to the handler that was there before", "[guard]") {
  struct sigaction mine {}, old {};
  mine.sa_handler = chained;
  sigemptyset(&mine.sa_mask);
  mine.sa_flags = SA_NODEFER;
  REQUIRE(sigaction(SIGSEGV, &mine, &old) == 0);
  guard::install();   // in front of ours, chaining to it
  auto *p = static_cast<uint8_t *>(mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(p != MAP_FAILED);
  chained_calls = 0;
  if (sigsetjmp(chained_jb, 0) == 0) {
    *reinterpret_cast<volatile uint8_t *>(p) = 1;   // an unguarded fault
    FAIL("no fault");
  }
  CHECK(chained_calls == 1);
  uint8_t x = 0;
  CHECK_FALSE(guard::copy(&x, p, 1));   // a guarded one stays ours
  CHECK(chained_calls == 1);
  munmap(p, 4096);
  sigaction(SIGSEGV, &old, nullptr);
}
