// `usrc stats`: the per-device counters every process using it adds to.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "cli.h"
#include "usrc/device.h"

namespace usrc::cli {

namespace {
CountersFile *map_counters(const std::string &name) {
  int fd = open(counters_path(name).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fd = open(counters_path(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void *p = mmap(nullptr, sizeof(CountersFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) p = mmap(nullptr, sizeof(CountersFile), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  auto *c = static_cast<CountersFile *>(p);
  if (c->magic != CountersFile::kMagic) {
    munmap(p, sizeof(CountersFile));
    return nullptr;
  }
  return c;
}
}  // namespace

int stats_show(const std::string &name, bool json) {
  std::vector<std::string> names = name.empty() ? device_names() : std::vector<std::string>{name};
  if (json) printf("[");
  bool first = true;
  for (auto &n : names) {
    CountersFile *c = map_counters(n);
    if (!c) {
      fprintf(stderr, "usrc: no counters for device %s\n", n.c_str());
      return 1;
    }
    if (json) printf("%s{\"ifname\":\"%s\",\"port\":1", first ? "" : ",", n.c_str());
    else printf("link %s/1", n.c_str());
    uint64_t count = std::min<uint64_t>(c->count, kNumCounters);
    for (uint32_t i = 0; i < count; i++) {
      uint64_t v = std::atomic_ref<uint64_t>(c->value[i]).load(std::memory_order_relaxed);
      const char *k = counter_name(static_cast<Counter>(i));
      if (json) printf(",\"%s\":%llu", k, static_cast<unsigned long long>(v));
      else printf(" %s %llu", k, static_cast<unsigned long long>(v));
    }
    printf(json ? "}" : "\n");
    munmap(c, sizeof(CountersFile));
    first = false;
  }
  if (json) printf("]\n");
  return 0;
}

int stats_reset(const std::string &name) {
  CountersFile *c = map_counters(name);
  if (!c) {
    fprintf(stderr, "usrc: no counters for device %s\n", name.c_str());
    return 1;
  }
  for (uint32_t i = 0; i < kNumCounters; i++)
    std::atomic_ref<uint64_t>(c->value[i]).store(0, std::memory_order_relaxed);
  munmap(c, sizeof(CountersFile));
  return 0;
}

}  // namespace usrc::cli
