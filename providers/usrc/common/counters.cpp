// Counters files (include/usrc/device.h, CountersFile): a context's own
// file, the sum `usrc stats` shows, reset, and the directory's lifecycle.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "usrc/device.h"

namespace usrc {

namespace {

constexpr size_t kHeader = offsetof(CountersFile, value);
constexpr size_t file_size(uint64_t count) { return kHeader + count * sizeof(uint64_t); }
static_assert(sizeof(CountersFile) == file_size(kNumCounters));

// A file left by a context that died before it was complete (between its
// creation and its header) is removed by a later context of the same user
// once it is this old.
constexpr time_t kStaleIncompleteS = 60;

std::string sys_err(const std::string &what) { return what + ": " + strerror(errno); }

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  int release() { return std::exchange(fd, -1); }
};

int open_dir(const std::string &path) {
  return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// The entry names of directory dfd (dfd itself stays open).
std::vector<std::string> entries(int dfd) {
  std::vector<std::string> out;
  int d2 = dup(dfd);
  if (d2 < 0) return out;
  DIR *d = fdopendir(d2);
  if (!d) {
    ::close(d2);
    return out;
  }
  rewinddir(d);
  while (dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
  closedir(d);
  return out;
}

// Reads a counters file: its count and first min(count, kNumCounters)
// values into f. false if fd is not one: not a regular file, a size that
// does not match its header, another magic.
bool read_file(int fd, const struct stat &st, CountersFile &f) {
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_size < off_t(kHeader) ||
      st.st_size > off_t(file_size(CountersFile::kMaxCount)))
    return false;
  if (pread(fd, &f, kHeader, 0) != ssize_t(kHeader)) return false;
  if (f.magic != CountersFile::kMagic || f.count == 0 || f.count > CountersFile::kMaxCount ||
      st.st_size != off_t(file_size(f.count)))
    return false;
  const size_t n = std::min<uint64_t>(f.count, kNumCounters) * sizeof(uint64_t);
  memset(f.value, 0, sizeof f.value);
  return pread(fd, f.value, n, kHeader) == ssize_t(n);
}

// A file this context may map: ours, written by nobody else, complete.
bool mappable(int fd) {
  struct stat st;
  CountersFile f;
  return fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 022) &&
         read_file(fd, st, f) && f.count == kNumCounters;
}

std::string random_name() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = uint64_t(ts.tv_nsec) * 0x9e3779b97f4a7c15ull ^ uint64_t(getpid()) << 32;
  }
  char b[48];
  snprintf(b, sizeof b, "%d.%016llx", int(getpid()), static_cast<unsigned long long>(r));
  return b;
}

// Removes everything under directory dfd without following links (users
// may have put anything there), then closes dfd. depth bounds the descent.
void remove_under(int dfd, int depth) {
  for (int pass = 0; pass < 4; pass++) {
    bool left = false;
    for (auto &n : entries(dfd)) {
      if (unlinkat(dfd, n.c_str(), 0) == 0) continue;
      if (errno != EISDIR && errno != EPERM) continue;
      int sub = depth > 0 ? openat(dfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
      if (sub >= 0) remove_under(sub, depth - 1);
      if (unlinkat(dfd, n.c_str(), AT_REMOVEDIR) != 0) left = true;
    }
    if (!left) break;
  }
  ::close(dfd);
}

// Raw sums (no reset applied) of the files in dfd; false on an unreadable
// directory.
void sum_files(int dfd, uint64_t *out) {
  for (auto &n : entries(dfd)) {
    if (n[0] == '.') continue;   // .reset, and no process file starts so
    // (O_NONBLOCK: a FIFO someone put here must not block the open.)
    Fd fd(openat(dfd, n.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    struct stat st;
    CountersFile f;
    if (fd.fd < 0 || fstat(fd.fd, &st) != 0 || !read_file(fd.fd, st, f)) continue;
    for (uint32_t i = 0; i < std::min<uint64_t>(f.count, kNumCounters); i++) out[i] += f.value[i];
  }
}

constexpr const char *kResetFile = ".reset";

}  // namespace

OwnCounters::~OwnCounters() {
  if (file_) munmap(file_, sizeof(CountersFile));
  if (fd_ >= 0) ::close(fd_);   // (and with it the lock)
}

bool OwnCounters::open(const std::string &name, std::string *err) {
  const std::string dir = counters_dir(name);
  Fd dfd(open_dir(dir));
  if (dfd.fd < 0) {
    *err = sys_err(dir) + " (a device made by an older usrc: remove and add it again)";
    return false;
  }
  const uid_t me = geteuid();
  int fd = -1;
  // A file of ours no context holds: take it over.
  for (auto &n : entries(dfd.fd)) {
    struct stat st;
    if (n[0] == '.' || fstatat(dfd.fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != me)
      continue;
    Fd f(openat(dfd.fd, n.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (f.fd < 0 || flock(f.fd, LOCK_EX | LOCK_NB) != 0) continue;
    if (mappable(f.fd)) {
      fd = f.release();
      break;
    }
    // Ours, not held, not a counters file: a context died making it, long
    // ago. (One of another version stays: `usrc stats` counts it.)
    CountersFile h;
    if (fstat(f.fd, &st) == 0 && st.st_uid == me && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
        !read_file(f.fd, st, h) && st.st_ctime + kStaleIncompleteS < time(nullptr))
      unlinkat(dfd.fd, n.c_str(), 0);
  }
  // Else a new one: nobody else may open it before it is complete and
  // locked (0600 until then).
  for (int tries = 0; fd < 0 && tries < 16; tries++) {
    const std::string n = random_name();
    Fd f(openat(dfd.fd, n.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (f.fd < 0) {
      if (errno == EEXIST) continue;
      *err = sys_err("cannot create a counters file in " + dir);
      return false;
    }
    // (Only a context of ours looking for a file to take over may hold the
    // lock, for as long as it looks at this one.)
    CountersFile h{};
    h.magic = CountersFile::kMagic;
    h.count = kNumCounters;
    struct stat st;
    if (flock(f.fd, LOCK_EX) != 0 || pwrite(f.fd, &h, sizeof h, 0) != ssize_t(sizeof h) ||
        fchmod(f.fd, 0644) != 0 || fstat(f.fd, &st) != 0 || st.st_nlink != 1) {
      *err = sys_err("cannot write a counters file in " + dir);
      unlinkat(dfd.fd, n.c_str(), 0);
      return false;
    }
    fd = f.release();
  }
  if (fd < 0) {
    *err = "no free counters file name in " + dir;
    return false;
  }
  // Checked once more on the descriptor we map: a short file would fault.
  void *p = MAP_FAILED;
  if (mappable(fd))
    p = mmap(nullptr, sizeof(CountersFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *err = sys_err("cannot map a counters file in " + dir);
    ::close(fd);
    return false;
  }
  file_ = static_cast<CountersFile *>(p);
  fd_ = fd;
  return true;
}

bool read_counters(const std::string &name, uint64_t *out, std::string *err) {
  const std::string dir = counters_dir(name);
  Fd dfd(open_dir(dir));
  struct stat dst;
  if (dfd.fd < 0 || fstat(dfd.fd, &dst) != 0) {
    *err = sys_err(dir);
    return false;
  }
  std::fill(out, out + kNumCounters, 0);
  sum_files(dfd.fd, out);
  // What a reset set aside, if root or the directory's owner wrote it.
  Fd fd(openat(dfd.fd, kResetFile, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  struct stat st;
  CountersFile base;
  if (fd.fd >= 0 && fstat(fd.fd, &st) == 0 && (st.st_uid == 0 || st.st_uid == dst.st_uid) &&
      read_file(fd.fd, st, base)) {
    // (Sums only grow: a file taken over keeps its values. One its owner
    // removed may leave a sum below its base: 0 then.)
    for (uint32_t i = 0; i < std::min<uint64_t>(base.count, kNumCounters); i++)
      out[i] = out[i] > base.value[i] ? out[i] - base.value[i] : 0;
  }
  return true;
}

bool reset_counters(const std::string &name, std::string *err) {
  const std::string dir = counters_dir(name);
  Fd dfd(open_dir(dir));
  struct stat dst;
  if (dfd.fd < 0 || fstat(dfd.fd, &dst) != 0) {
    *err = sys_err(dir);
    return false;
  }
  if (geteuid() != 0 && geteuid() != dst.st_uid) {
    *err = "only root can reset the counters of " + name;
    return false;
  }
  CountersFile base{};
  base.magic = CountersFile::kMagic;
  base.count = kNumCounters;
  sum_files(dfd.fd, base.value);
  const std::string tmp = "." + random_name();
  Fd fd(openat(dfd.fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  bool ok = fd.fd >= 0 && pwrite(fd.fd, &base, sizeof base, 0) == ssize_t(sizeof base) &&
            fchmod(fd.fd, 0644) == 0 && renameat(dfd.fd, tmp.c_str(), dfd.fd, kResetFile) == 0;
  if (!ok) {
    *err = sys_err("cannot write " + dir + "/" + kResetFile);
    if (fd.fd >= 0) unlinkat(dfd.fd, tmp.c_str(), 0);
  }
  return ok;
}

bool make_counters_dir(const std::string &name, std::string *err) {
  const std::string top = root_dir() + "/counters";
  std::error_code ec;
  std::filesystem::create_directories(top, ec);
  if (ec || chmod(top.c_str(), 0755) != 0) {
    *err = "cannot create " + top + ": " + (ec ? ec.message() : strerror(errno));
    return false;
  }
  if (!remove_counters_dir(name, err)) return false;   // (one left by a crash)
  // The single file, writable by all, that older versions had: nothing
  // opens it any more, nobody else shall.
  unlink((top + "/" + name).c_str());
  const std::string dir = counters_dir(name);
  if (mkdir(dir.c_str(), 0700) != 0 || chmod(dir.c_str(), 01777) != 0) {
    *err = sys_err("cannot create " + dir);
    return false;
  }
  return true;
}

bool remove_counters_dir(const std::string &name, std::string *err) {
  const std::string top = root_dir() + "/counters";
  const std::string leaf = name + ".d";
  Fd tfd(open_dir(top));
  if (tfd.fd < 0) return true;
  // Out of the way first (a new device of that name starts empty even if
  // this removal stops short), then emptied.
  const std::string gone = "." + leaf + "." + random_name();
  if (renameat(tfd.fd, leaf.c_str(), tfd.fd, gone.c_str()) != 0) {
    if (errno == ENOENT) return true;
    *err = sys_err("cannot remove " + top + "/" + leaf);
    return false;
  }
  int dfd = openat(tfd.fd, gone.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd >= 0) remove_under(dfd, 64);
  if (unlinkat(tfd.fd, gone.c_str(), AT_REMOVEDIR) != 0 && unlinkat(tfd.fd, gone.c_str(), 0) != 0) {
    *err = sys_err("cannot remove " + top + "/" + gone);
    return false;
  }
  return true;
}

}  // namespace usrc
