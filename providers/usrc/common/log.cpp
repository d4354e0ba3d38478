#include "usrc/common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace usrc {

spdlog::logger &log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>(
        "usrc", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("usrc[%P] %l: %v");
    const char *lvl = std::getenv("USRC_LOG_LEVEL");
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::off);
    return l;
  }();
  return *logger;
}

}  // namespace usrc
