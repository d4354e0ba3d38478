// Counters files (include/usrc/device.h, CountersFile): a context's own
// file, taking over a gone context's, what readers skip, reset.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "usrc/device.h"

using namespace usrc;
namespace fs = std::filesystem;

namespace {

// A private USRC_ROOT with device "cnt"'s counters directory.
struct Root {
  std::string path;
  Root() {
    char t[] = "/tmp/usrc-unit-counters.XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
    setenv("USRC_ROOT", path.c_str(), 1);
    std::string err;
    REQUIRE(make_counters_dir("cnt", &err));
  }
  ~Root() {
    std::error_code ec;
    fs::remove_all(path, ec);
    unsetenv("USRC_ROOT");
  }
  size_t files() const {
    size_t n = 0;
    for (auto &e : fs::directory_iterator(counters_dir("cnt")))
      n += e.path().filename().string()[0] != '.';
    return n;
  }
};

uint64_t sum(Counter c) {
  uint64_t v[kNumCounters];
  std::string err;
  REQUIRE(read_counters("cnt", v, &err));
  return v[uint32_t(c)];
}

void plant(const std::string &name, const std::string &bytes) {
  std::ofstream(counters_dir("cnt") + "/" + name, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("counters: each context its own file; a gone context's is taken over", "[counters]") {
  Root r;
  struct stat st;
  REQUIRE(stat(counters_dir("cnt").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 01777);
  std::string err;
  {
    OwnCounters a, b;
    REQUIRE(a.open("cnt", &err));
    REQUIRE(b.open("cnt", &err));   // a holds its file: b makes another
    CHECK(r.files() == 2);
    a.values()[uint32_t(Counter::tx_packets)] = 5;
    b.values()[uint32_t(Counter::tx_packets)] = 7;
    CHECK(sum(Counter::tx_packets) == 12);   // read while both are open
  }
  CHECK(sum(Counter::tx_packets) == 12);     // and after
  OwnCounters c;
  REQUIRE(c.open("cnt", &err));
  CHECK(r.files() == 2);                     // taken over, not a third
  const uint64_t v = c.values()[uint32_t(Counter::tx_packets)];
  CHECK((v == 5 || v == 7));                 // it counts on from there
  c.values()[uint32_t(Counter::tx_packets)] += 1;
  CHECK(sum(Counter::tx_packets) == 13);
}

TEST_CASE("counters: files that are not counters files are skipped", "[counters]") {
  Root r;
  std::string err;
  {
    OwnCounters a;
    REQUIRE(a.open("cnt", &err));
    a.values()[0] = 3;
  }
  CountersFile f{};
  f.magic = CountersFile::kMagic;
  f.count = kNumCounters;
  f.value[0] = 1000;
  const std::string whole(reinterpret_cast<const char *>(&f), sizeof f);
  plant("short", whole.substr(0, sizeof f - 8));
  plant("long", whole + "x");
  plant("empty", "");
  std::string bad = whole;
  bad[0] ^= 1;
  plant("badmagic", bad);
  CountersFile huge = f;
  huge.count = 1u << 20;
  plant("hugecount", std::string(reinterpret_cast<const char *>(&huge), sizeof huge));
  REQUIRE(symlink((counters_dir("cnt") + "/short").c_str(), (counters_dir("cnt") + "/link").c_str()) == 0);
  REQUIRE(mkfifo((counters_dir("cnt") + "/fifo").c_str(), 0600) == 0);
  CHECK(sum(Counter(0)) == 3);
  // An older version's file, with fewer counters: those it has count.
  CountersFile old = f;
  old.count = 2;
  plant("older", std::string(reinterpret_cast<const char *>(&old), 16 + 2 * 8));
  CHECK(sum(Counter(0)) == 1003);
  // None of them is taken over: a context makes its own (or takes the one
  // a context of ours left).
  OwnCounters b;
  REQUIRE(b.open("cnt", &err));
  CHECK(b.values()[0] == 3);
}

TEST_CASE("counters: reset sets the sums aside", "[counters]") {
  Root r;
  std::string err;
  OwnCounters a;
  REQUIRE(a.open("cnt", &err));
  a.values()[uint32_t(Counter::acks_sent)] = 40;
  REQUIRE(reset_counters("cnt", &err));
  CHECK(sum(Counter::acks_sent) == 0);
  a.values()[uint32_t(Counter::acks_sent)] += 2;
  CHECK(sum(Counter::acks_sent) == 2);
}

TEST_CASE("counters: no directory, no counters; remove takes everything", "[counters]") {
  Root r;
  std::string err;
  fs::create_directories(counters_dir("cnt") + "/sub/deeper");
  plant("sub/deeper/f", "x");
  REQUIRE(remove_counters_dir("cnt", &err));
  CHECK(fs::is_empty(r.path + "/counters"));
  OwnCounters a;
  CHECK_FALSE(a.open("cnt", &err));
  CHECK(!err.empty());
  uint64_t v[kNumCounters];
  CHECK_FALSE(read_counters("cnt", v, &err));
}
