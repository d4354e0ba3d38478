#include "usrc/common/tunables.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace usrc {

// A value that is not a whole number of 32 bits is ignored, and said so
// (on stderr: the logger is off unless asked for, and a setting that
// silently does nothing is worse than a line of output).
static void read_env(uint32_t &v, const char *env) {
  if (const char *s = std::getenv(env); s && *s) {
    char *end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(s, &end, 0);
    if (errno == 0 && end && *end == '\0' && *s != '-' && x <= UINT32_MAX)
      v = static_cast<uint32_t>(x);
    else
      std::fprintf(stderr, "usrc: %s=%s is not a number from 0 to %u: ignored (default %u)\n", env, s,
                   UINT32_MAX, v);
  }
}

const Tunables &Tunables::get() {
  static const Tunables t = [] {
    Tunables r;
#define USRC_X(type, name, env, def, doc) read_env(r.name, env);
    USRC_TUNABLES(USRC_X)
#undef USRC_X
    return r;
  }();
  return t;
}

}  // namespace usrc
