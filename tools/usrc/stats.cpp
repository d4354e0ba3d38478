// `usrc stats`: the per-device counters, summed over the files of the
// processes using the device (include/usrc/device.h, CountersFile).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "usrc/device.h"

namespace usrc::cli {

int stats_show(const std::string &name, bool json) {
  std::vector<std::string> names = name.empty() ? device_names() : std::vector<std::string>{name};
  auto out = nlohmann::ordered_json::array();
  for (auto &n : names) {
    uint64_t v[kNumCounters];
    std::string err;
    if (!read_counters(n, v, &err)) {
      fprintf(stderr, "usrc: no counters for device %s (%s)\n", n.c_str(), err.c_str());
      return 1;
    }
    if (json) {
      nlohmann::ordered_json o = {{"ifname", n}, {"port", 1}};
      for (uint32_t i = 0; i < kNumCounters; i++) o[counter_name(static_cast<Counter>(i))] = v[i];
      out.push_back(std::move(o));
      continue;
    }
    printf("link %s/1", n.c_str());
    for (uint32_t i = 0; i < kNumCounters; i++)
      printf(" %s %llu", counter_name(static_cast<Counter>(i)), static_cast<unsigned long long>(v[i]));
    printf("\n");
  }
  if (json) printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int stats_reset(const std::string &name) {
  std::string err;
  if (name.empty()) {
    fprintf(stderr, "usrc: usage: usrc stats reset NAME\n");
    return 2;
  }
  if (!reset_counters(name, &err)) {
    fprintf(stderr, "usrc: cannot reset the counters of %s: %s\n", name.c_str(), err.c_str());
    return 1;
  }
  return 0;
}

}  // namespace usrc::cli
