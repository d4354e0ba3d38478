// `usrc exec -- CMD`: run a stock verbs program with usrc devices visible:
// SYSFS_PATH points libibverbs at our device tree, and the provider is
// preloaded (it registers itself and supplies completion channels).
#include <unistd.h>

#include <climits>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli.h"
#include "usrc/device.h"

namespace fs = std::filesystem;

namespace usrc::cli {

static std::string find_provider(std::vector<std::string> &tried) {
  if (const char *p = getenv("USRC_PROVIDER"); p && *p) {
    tried.push_back(p);
    return fs::exists(p) ? p : "";
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    fs::path p = fs::path(self).parent_path() / USRC_PROVIDER_RELDIR / "libusrc-rdmav34.so";
    tried.push_back(p.lexically_normal());
    if (fs::exists(p)) return fs::canonical(p);
  }
  tried.push_back(USRC_BUILD_PROVIDER);
  if (fs::exists(USRC_BUILD_PROVIDER)) return USRC_BUILD_PROVIDER;
  return "";
}

int exec_cmd(const std::vector<std::string> &argv) {
  if (argv.empty()) {
    fprintf(stderr, "usrc: exec needs a command: usrc exec -- CMD [ARGS...]\n");
    return 2;
  }
  std::vector<std::string> tried;
  std::string provider = find_provider(tried);
  if (provider.empty()) {
    fprintf(stderr, "usrc: cannot find libusrc-rdmav34.so; looked at:\n");
    for (auto &t : tried) fprintf(stderr, "  %s\n", t.c_str());
    fprintf(stderr, "set USRC_PROVIDER to its path\n");
    return 127;
  }
  if (device_names().empty())
    fprintf(stderr, "usrc: warning: no usrc devices in %s (usrc link add ...)\n",
            root_dir().c_str());
  setenv("SYSFS_PATH", sysfs_dir().c_str(), 1);
  std::string preload = provider;
  if (const char *old = getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  std::vector<char *> args;
  for (auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  fprintf(stderr, "usrc: cannot run %s: %s\n", args[0], strerror(errno));
  return 127;
}

}  // namespace usrc::cli
