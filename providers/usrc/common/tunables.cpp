#include "usrc/common/tunables.h"

#include <cstdlib>
#include <string>

namespace usrc {

static void read_env(uint32_t &v, const char *env) {
  if (const char *s = std::getenv(env); s && *s) {
    char *end = nullptr;
    unsigned long x = std::strtoul(s, &end, 0);
    if (end && *end == '\0') v = static_cast<uint32_t>(x);
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
