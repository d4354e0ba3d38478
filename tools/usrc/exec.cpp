// `usrc exec -- CMD`: run a stock verbs program with usrc devices visible:
// SYSFS_PATH points libibverbs at our device tree, and the provider is
// preloaded (it registers itself and supplies completion channels). As
// root, the devices are also where tools look without SYSFS_PATH
// (sys_view).
#include <linux/magic.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>

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

// Programs that look for RDMA devices in /sys/class/infiniband itself, not
// in the tree SYSFS_PATH names (rdma-core's pyverbs tests, UCX), find them
// there too: the command runs in a mount namespace of its own in which
// /sys/class is an overlay of the tree's class directory on the real one,
// and /sys/class/infiniband and infiniband_verbs hold links to the devices
// of this network namespace only (sysfs's are links too), as the kernel
// lists its RDMA devices in its exclusive netns mode. A snapshot: devices
// added later are seen through SYSFS_PATH only. Where that is not
// permitted (not root), or /sys/class is an overlay already (a usrc exec
// inside another), the command runs as it is.
static void sys_view() {
  const fs::path ours = fs::path(sysfs_dir()) / "class";
  struct statfs sf;
  std::error_code ec;
  if (!fs::is_directory(ours, ec) || ours.native().find_first_of(":,\\") != std::string::npos) return;
  if (statfs("/sys/class", &sf) == 0 && sf.f_type == OVERLAYFS_SUPER_MAGIC) return;
  if (unshare(CLONE_NEWNS) != 0) return;
  // (Mounts made outside still reach this namespace; ours stay in it.)
  const unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  const std::string lower = "lowerdir=" + ours.native() + ":/sys/class";
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0 ||
      mount("overlay", "/sys/class", "overlay", ro, lower.c_str()) != 0)
    return;
  const uint64_t here = net_namespace();
  std::vector<std::string> mine;
  for (const std::string &n : device_names())
    if (auto c = DeviceConfig::load(n); c && c->offered_in(here)) mine.push_back(n);
  // Each directory: a tmpfs of links, then read-only.
  auto links = [&](const fs::path &dir, auto &&wanted) {
    if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755") != 0) return;
    for (const auto &e : fs::directory_iterator(ours / dir.filename(), ec))
      if (wanted(e.path())) fs::create_symlink(e.path(), dir / e.path().filename(), ec);
    (void)mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | ro, nullptr);
  };
  auto is_mine = [&](const std::string &name) { return std::find(mine.begin(), mine.end(), name) != mine.end(); };
  links("/sys/class/infiniband", [&](const fs::path &p) { return is_mine(p.filename()); });
  links("/sys/class/infiniband_verbs", [&](const fs::path &p) {
    std::ifstream f(p / "ibdev");
    std::string ibdev;
    return !fs::is_directory(p, ec) || (std::getline(f, ibdev) && is_mine(ibdev));
  });
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
  sys_view();
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
