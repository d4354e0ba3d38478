// Logging: spdlog, silent by default. USRC_LOG_LEVEL=trace|debug|info|warn|
// error selects the level; messages go to stderr. Protocol events are
// counters (usrc stats), not log lines.
#pragma once
#include <spdlog/spdlog.h>

namespace usrc {
spdlog::logger &log();
}
