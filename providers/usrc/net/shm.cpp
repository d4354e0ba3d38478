#include "usrc/net/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "usrc/common/copy.h"
#include "usrc/common/guard.h"

namespace usrc::net {

namespace {

constexpr uint64_t kMagic = 0x31676e6972637375ull;   // "usrcring1"-ish, little-endian
constexpr uint32_t kVersion = 4;
constexpr uint64_t kMask = ShmNic::kSlots - 1;
static_assert((ShmNic::kSlots & kMask) == 0, "a power of two");
// The doorbell: a UDP datagram too short to be an IBA packet.
constexpr uint8_t kDoorbell[4] = {'u', 's', 'd', 'b'};
constexpr uint64_t kStuckNs = 1'000'000'000;

uint64_t coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

}  // namespace

// One datagram, or several of one segmented send (a UDP GSO send's
// worth, as many as fit): claiming and publishing a slot, and the cache
// lines they move between the cores, then cost once per slot. `seq` is stored less the slot's index, so that the zero
// pages of a fresh ring are its initial state (slot i free for position i)
// and creating a ring touches none of them.
struct alignas(64) ShmSlot {
  std::atomic<uint64_t> seq;
  // The producer that claimed it last (0: none yet). Left as it is when
  // the slot is freed, and stored by a claim only if it differs: the
  // consumer spins on this cache line, and each store takes it back.
  std::atomic<int32_t> pid;
  uint32_t len;
  uint32_t src_ip;
  uint16_t src_port;
  uint16_t seg;   // 0: one datagram; else datagrams of seg bytes (the last may be shorter)
  // Right behind the header, in its cache line: a datagram of up to 40
  // bytes (an ACK, a SEND of a few bytes) is one line to move, not two.
  uint8_t data[ShmNic::kSlotData];
};
static_assert(offsetof(ShmSlot, data) == 24 && sizeof(ShmSlot) % 64 == 0);

// Direct placement: what the owner lets peers write into (Nic::expose,
// Nic::set_gate), looked up by key and tag modulo the table size (a key
// or tag whose entry is taken is not exposed: its writers send instead).
// Both tables change, and are read by writers, under `mu` only; a writer
// holds it while it writes, so that once the owner has withdrawn a region
// (under mu) nobody writes into that memory any more.
struct ShmRegion {
  uint32_t key;
  uint64_t domain;   // 0: free
  uint64_t addr, base, len;
};
struct ShmGate {
  uint32_t tag, peer_tag;
  Endpoint peer;
  uint64_t domain;   // 0: free
};
struct ShmDirectory {
  static constexpr uint32_t kRegions = 4096, kGates = 1024;
  // Locked by the owner's progress thread while it runs (robust): a
  // writer's failed trylock says, without a system call, that the pid
  // below is still the owner's (the kernel marks the lock when that
  // thread dies, before its pid can be reused).
  pthread_mutex_t life;
  pthread_mutex_t mu;   // robust, process-shared
  // The owner process: its pid means something only in its pid namespace
  // (containers may share /dev/shm and the network namespace, not pids);
  // `self` tells the owner's own process apart (pids may be equal across
  // namespaces).
  int32_t pid;
  uint64_t pidns_dev, pidns_ino;
  uint64_t self;
  ShmRegion regions[kRegions];
  ShmGate gates[kGates];
};

struct ShmRing {
  uint64_t magic;     // written last, when the ring is ready
  uint32_t version, nslots, slot_size;
  std::atomic<uint32_t> alive;                  // 0: retired, writers let go
  alignas(64) std::atomic<uint64_t> tail;       // the next position to claim
  alignas(64) std::atomic<uint32_t> sleeping;   // the owner waits on its socket
  alignas(64) ShmSlot slots[ShmNic::kSlots];
  alignas(64) ShmDirectory dir;
};
static_assert(offsetof(ShmRing, slots) <= 4096, "the header fits the first page");
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "atomics shared between processes must be lock-free");

static uint64_t seq_of(const ShmSlot &s, uint64_t idx) {
  return s.seq.load(std::memory_order_acquire) + idx;
}
static void set_seq(ShmSlot &s, uint64_t idx, uint64_t v) {
  s.seq.store(v - idx, std::memory_order_release);
}

// A robust mutex's lock result: taken (a holder that died leaves it to us,
// consistent again), or not.
static bool taken(pthread_mutex_t &m, int e) {
  if (e == EOWNERDEAD) pthread_mutex_consistent(&m);
  return e == 0 || e == EOWNERDEAD;
}

// The directory's mutex; false only if it is unusable (a holder died in a
// way that left it unrecoverable).
static bool lock(pthread_mutex_t &m) { return taken(m, pthread_mutex_lock(&m)); }

// A writer waits a little, not for ever: a target stopped while it held
// the lock (a debugger) must not hang our post_send. It then sends instead.
static bool lock_briefly(pthread_mutex_t &m) {
  int e = pthread_mutex_trylock(&m);
  if (e == EBUSY) {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += 2'000'000;
    if (t.tv_nsec >= 1'000'000'000) t.tv_sec++, t.tv_nsec -= 1'000'000'000;
    e = pthread_mutex_timedlock(&m, &t);
  }
  return taken(m, e);
}

// The owner's progress thread holds its life lock (ShmNic::owner_thread).
static bool owner_alive(ShmDirectory &d) {
  const int e = pthread_mutex_trylock(&d.life);
  if (e == EBUSY) return true;
  if (taken(d.life, e)) pthread_mutex_unlock(&d.life);
  return false;
}

static void pid_namespace(uint64_t *dev, uint64_t *ino) {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) st = {};
  *dev = st.st_dev;
  *ino = st.st_ino;
}

// This process, among all that share the ring files: random, drawn anew
// in a child of fork.
namespace {
std::atomic<uint64_t> self_token{0};
void new_self() {
  uint64_t t = 0;
  while (!t && getrandom(&t, sizeof t, 0) != sizeof t) {
  }
  self_token.store(t ? t : 1, std::memory_order_relaxed);
}
}  // namespace
static uint64_t process_self() {
  static std::once_flag once;
  std::call_once(once, [] {
    new_self();
    pthread_atfork(nullptr, nullptr, new_self);
  });
  return self_token.load(std::memory_order_relaxed);
}

// "/usrc.<uid>.<netns inode>.": the rings this process may talk to.
static std::string ring_prefix() {
  struct stat st {};
  const unsigned long long ns = stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
  return "/usrc." + std::to_string(getuid()) + "." + std::to_string(ns) + ".";
}

std::string ShmNic::ring_name(Endpoint e) {
  char b[32];
  std::snprintf(b, sizeof b, "%08x.%u", e.ip, static_cast<unsigned>(e.port));
  return ring_prefix() + b;
}

// Opens a ring file of ours: owned by this user, private to it (mode 0600:
// /dev/shm is world-writable, and a file another user planted under our
// name must not receive our traffic), of this version's size. -1 if not.
static int open_ring(const std::string &name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
      size_t(st.st_size) != sizeof(ShmRing)) {
    ::close(fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

// The owner holds a write lock (an open file description lock, released
// by the kernel when the owner exits however it exits) for as long as the
// ring is in use: a ring without one is stale.
static bool has_owner(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

static bool valid(const ShmRing &r) {
  return __atomic_load_n(&r.magic, __ATOMIC_ACQUIRE) == kMagic && r.version == kVersion &&
         r.nslots == ShmNic::kSlots && r.slot_size == sizeof(ShmSlot);
}

// Maps an existing ring of this version in use by a live owner; nullptr
// if there is none.
static ShmRing *map_ring(const std::string &name) {
  int fd = open_ring(name);
  if (fd < 0) return nullptr;
  void *p = has_owner(fd) ? mmap(nullptr, sizeof(ShmRing), PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_POPULATE, fd, 0)
                          : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  auto *r = static_cast<ShmRing *>(p);
  if (!valid(*r) || !r->alive.load(std::memory_order_acquire)) {
    munmap(p, sizeof(ShmRing));
    return nullptr;
  }
  return r;
}

static void unmap(ShmRing *&r) {
  if (r) munmap(r, sizeof(ShmRing));
  r = nullptr;
}

// Retires a ring without an owner (its writers let go) and removes it, if
// the name still refers to it. fd: the ring, open.
// force: the caller holds the ring's endpoint (its UDP port), so whoever
// else holds the lock is not a context of that endpoint.
static void retire_stale(const std::string &name, int fd, bool force = false) {
  void *p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);   // the header
  if (p == MAP_FAILED) return;
  auto *r = static_cast<ShmRing *>(p);
  struct stat a {}, b {};
  // (A ring not yet valid may be a new one whose owner is setting it up:
  // it takes its lock before it writes the magic.)
  if ((force || (valid(*r) && !has_owner(fd))) && fstat(fd, &a) == 0 &&
      stat(("/dev/shm" + name).c_str(), &b) == 0 && a.st_ino == b.st_ino) {
    r->alive.store(0, std::memory_order_release);
    shm_unlink(name.c_str());
  }
  munmap(p, 4096);
}

// The owners' lock fds of this process. A child of fork() shares them (the
// lock belongs to the open file description, which fork shares): it closes
// its copies at once, or a ring would look owned for as long as the child
// lives after its owner has died. Lock-free: the child handler may run
// while another thread of the parent was in the middle of an update.
namespace {
constexpr int kMaxOwned = 64;
std::atomic<int> owned_fds[kMaxOwned];
std::once_flag atfork_once;
void close_owned_in_child() {
  for (auto &f : owned_fds) {
    const int fd = f.exchange(-1, std::memory_order_relaxed);
    if (fd >= 0) ::close(fd);
  }
}
void track_owned(int fd) {
  std::call_once(atfork_once, [] {
    for (auto &f : owned_fds) f.store(-1, std::memory_order_relaxed);
    pthread_atfork(nullptr, nullptr, close_owned_in_child);
  });
  for (auto &f : owned_fds) {
    int none = -1;
    if (f.compare_exchange_strong(none, fd, std::memory_order_relaxed)) return;
  }
  // (More than kMaxOwned contexts: this one's children keep its lock.)
}
void untrack_owned(int fd) {
  for (auto &f : owned_fds) {
    int mine = fd;
    if (f.compare_exchange_strong(mine, -1, std::memory_order_relaxed)) return;
  }
}
}  // namespace

// Rings whose owner died without removing them (killed, crashed) hold
// their memory until someone does: removed when a context opens.
static void sweep(const std::string &prefix) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  while (dirent *e = readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str() + 1, prefix.size() - 1) != 0) continue;
    const std::string name = std::string("/") + e->d_name;
    int fd = open_ring(name);
    if (fd < 0) continue;
    retire_stale(name, fd);
    ::close(fd);
  }
  closedir(d);
}

std::unique_ptr<Nic> ShmNic::wrap(std::unique_ptr<Nic> &inner, std::string *err) {
  sweep(ring_prefix());
  const std::string name = ring_name(inner->local());
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Left by an earlier owner of this endpoint (we hold its UDP port now),
    // which exited without removing it: retire it, replace it. A file we
    // may not use (another user's) stays, and we go without a ring.
    int old = open_ring(name);
    if (old >= 0) {
      retire_stale(name, old, true);
      ::close(old);
    }
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    *err = "shm_open " + name + ": " + strerror(errno);
    return nullptr;
  }
  // Ours from now until we close: the lock says so to the others.
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    *err = "lock " + name + ": " + strerror(errno);
    ::close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  // The pages are reserved now: a full /dev/shm fails here, cleanly, and
  // not later as SIGBUS in a writer.
  void *p = MAP_FAILED;
  int e = ftruncate(fd, sizeof(ShmRing)) == 0 ? posix_fallocate(fd, 0, sizeof(ShmRing)) : errno;
  if (e == 0) {
    // Mapped through an open file of its own: a mapping holds its file
    // open, and one of the locked file would keep the lock alive in every
    // child that inherits the mapping.
    const int mfd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    p = mfd < 0 ? MAP_FAILED
                : mmap(nullptr, sizeof(ShmRing), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
    if (p == MAP_FAILED) e = errno;
    if (mfd >= 0) ::close(mfd);
  }
  if (p == MAP_FAILED) {
    ::close(fd);
    shm_unlink(name.c_str());
    *err = "shared memory for " + name + ": " + strerror(e);
    return nullptr;
  }
  auto *r = static_cast<ShmRing *>(p);   // all zero: every slot free
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&r->dir.life, &ma);
  pthread_mutex_init(&r->dir.mu, &ma);
  pthread_mutexattr_destroy(&ma);
  r->dir.pid = getpid();
  pid_namespace(&r->dir.pidns_dev, &r->dir.pidns_ino);
  r->dir.self = process_self();
  r->version = kVersion;
  r->nslots = kSlots;
  r->slot_size = sizeof(ShmSlot);
  r->alive.store(1, std::memory_order_relaxed);
  __atomic_store_n(&r->magic, kMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<Nic>(new ShmNic(std::move(inner), r, fd, name));
}

ShmNic::ShmNic(std::unique_ptr<Nic> inner, ShmRing *own, int fd, std::string name)
    : inner_(std::move(inner)), own_(own), own_fd_(fd), name_(std::move(name)), pid_(getpid()) {
  track_owned(own_fd_);
  udp_tx_.reserve(64);
}

ShmNic::~ShmNic() {
  for (Peer &p : peers_)
    if (p.owned) unmap(p.ring);
  own_->alive.store(0, std::memory_order_release);
  // No writer is inside (they hold mu) or gets in after this (alive 0).
  if (lock(own_->dir.mu)) pthread_mutex_unlock(&own_->dir.mu);
  unmap(own_);
  shm_unlink(name_.c_str());
  untrack_owned(own_fd_);
  ::close(own_fd_);   // drops the lock
}

ShmNic::Peer *ShmNic::find_peer(Endpoint e) {
  if (last_peer_ < peers_.size() && peers_[last_peer_].ep == e) return &peers_[last_peer_];
  for (size_t i = 0; i < peers_.size(); i++)
    if (peers_[i].ep == e) return &peers_[last_peer_ = i];
  return nullptr;
}

void ShmNic::add_peer(Endpoint e) {
  inner_->add_peer(e);
  Peer *p = find_peer(e);
  if (!p) p = &peers_.emplace_back(Peer{e});
  if (e == inner_->local()) {   // to ourselves: our own ring, not mapped twice
    *p = {e, own_, false};
    return;
  }
  if (p->ring && p->ring->alive.load(std::memory_order_acquire)) {
    // Still in use by a live owner? (One that died leaves alive set.)
    int fd = open_ring(ring_name(e));
    const bool owned = fd >= 0 && has_owner(fd);
    if (fd >= 0) ::close(fd);
    if (owned) return;
  }
  unmap(p->ring);   // none yet, retired or stale: look again
  p->ring = map_ring(ring_name(e));
  p->no_place = false;
}

ShmRing *ShmNic::ring_of(Peer *p) {
  if (!p || !p->ring) return nullptr;
  if (p->owned && !p->ring->alive.load(std::memory_order_relaxed)) {
    // The peer closed (or a new owner of its endpoint retired the ring):
    // from now on the socket, until the next add_peer() finds a new ring.
    unmap(p->ring);
    return nullptr;
  }
  return p->ring;
}

bool ShmNic::place(Endpoint dst, uint32_t tag, uint32_t my_tag, uint32_t key, uint64_t at,
                   const iovec *iov, size_t iovcnt, size_t len) {
  Peer *p = find_peer(dst);
  ShmRing *r = ring_of(p);
  if (!r || p->no_place) return false;
  ShmDirectory &d = r->dir;
  if (!lock_briefly(d.mu)) return false;
  bool ok = false;
  const ShmGate &g = d.gates[tag % ShmDirectory::kGates];
  const ShmRegion &m = d.regions[key % ShmDirectory::kRegions];
  if (r->alive.load(std::memory_order_relaxed) && g.domain && g.tag == tag &&
      g.peer_tag == my_tag && g.peer == inner_->local() && m.domain == g.domain &&
      m.key == key && at >= m.base && len <= m.len && at - m.base <= m.len - len) {
    auto *to = reinterpret_cast<uint8_t *>(m.addr + (at - m.base));
    if (d.self == process_self()) {   // a context of this process
      ok = true;   // (either side unmapped, guard.h: sent instead, and failed there)
      for (size_t i = 0; i < iovcnt && ok; to += iov[i].iov_len, i++)
        ok = guard::copy(to, iov[i].iov_base, iov[i].iov_len);
    } else if (d.pidns_dev == own_->dir.pidns_dev && d.pidns_ino == own_->dir.pidns_ino &&
               owner_alive(d)) {   // (our own ring's: our pid namespace)
      const iovec remote{to, len};
      const ssize_t n = process_vm_writev(d.pid, iov, iovcnt, &remote, 1, 0);
      ok = n == ssize_t(len);
      // Not allowed to (Yama's ptrace_scope, a seccomp filter): not again.
      if (n < 0 && (errno == EPERM || errno == ENOSYS)) p->no_place = true;
    }
  }
  pthread_mutex_unlock(&d.mu);
  return ok;
}

// A held robust mutex sits on its holder thread's robust list until it is
// unlocked: the holder must unlock it before the ring is unmapped, hence
// the progress thread, which the context joins before it closes the NIC.
void ShmNic::owner_thread(bool start) {
  if (!start) pthread_mutex_unlock(&own_->dir.life);
  else lock(own_->dir.life);   // (held for a moment by a writer, or left by one that died)
}

bool ShmNic::expose(uint32_t key, const Region &m) {
  ShmDirectory &d = own_->dir;
  if (!lock(d.mu)) return false;
  ShmRegion &e = d.regions[key % ShmDirectory::kRegions];
  const bool listed = !e.domain || e.key == key;
  if (listed) e = {key, m.domain, reinterpret_cast<uint64_t>(m.addr), m.base, m.len};
  pthread_mutex_unlock(&d.mu);
  return listed;
}

void ShmNic::withdraw(uint32_t key) {
  ShmDirectory &d = own_->dir;
  if (!lock(d.mu)) return;
  ShmRegion &e = d.regions[key % ShmDirectory::kRegions];
  if (e.domain && e.key == key) e = {};
  pthread_mutex_unlock(&d.mu);
}

bool ShmNic::set_gate(uint32_t tag, const Gate &g) {
  ShmDirectory &d = own_->dir;
  if (!lock(d.mu)) return false;
  ShmGate &e = d.gates[tag % ShmDirectory::kGates];
  bool listed = true;
  if (g.domain && (!e.domain || e.tag == tag)) e = {tag, g.peer_tag, g.peer, g.domain};
  else if (g.domain) listed = false;
  else if (e.domain && e.tag == tag) e = {};
  pthread_mutex_unlock(&d.mu);
  return listed;
}

// Claims the next free slot of r, or nullptr if the ring is full. (Bounded:
// a ring whose numbers make no sense drops rather than spins.)
ShmSlot *ShmNic::claim(ShmRing &r, uint64_t *pos_out) {
  uint64_t pos = r.tail.load(std::memory_order_relaxed);
  for (int tries = 0; tries < 4096; tries++) {
    const uint64_t idx = pos & kMask;
    ShmSlot *s = &r.slots[idx];
    const auto d = static_cast<int64_t>(seq_of(*s, idx) - pos);
    if (d == 0) {
      // (Sequentially consistent: ring_if_asleep's look at `sleeping`
      // after it is what keeps a sleeping consumer from missing the slot.)
      if (r.tail.compare_exchange_weak(pos, pos + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) {
        if (s->pid.load(std::memory_order_relaxed) != pid_) s->pid.store(pid_, std::memory_order_relaxed);
        *pos_out = pos;
        return s;
      }
    } else if (d < 0) {
      return nullptr;   // full
    } else {
      pos = r.tail.load(std::memory_order_relaxed);
    }
  }
  return nullptr;
}

// Hands a filled slot to the consumer: len bytes, as datagrams of seg bytes
// (seg >= len: one datagram).
void ShmNic::publish(ShmSlot &s, uint64_t pos, Endpoint src, size_t len, size_t seg) {
  s.len = static_cast<uint32_t>(len);
  s.src_ip = src.ip;
  s.src_port = src.port;
  s.seg = static_cast<uint16_t>(seg < len ? seg : 0);
  set_seq(s, pos & kMask, pos + 1);
}

// Copies the next len bytes at the iovec cursor into a claimed slot, as
// datagrams of seg bytes (0: one datagram); the cursor moves past them
// whether or not a slot was free. A source the application unmapped
// (guard.h) leaves the slot an empty datagram, dropped: not sent.
bool ShmNic::push(ShmRing &r, Endpoint src, const iovec *&iov, size_t &off, size_t len, size_t seg) {
  uint64_t pos = 0;
  ShmSlot *s = len <= kSlotData ? claim(r, &pos) : nullptr;
  uint8_t *dst = s ? s->data : nullptr;
  for (size_t need = len; need;) {
    const size_t take = std::min(iov->iov_len - off, need);
    if (dst && !guard::copy(dst, static_cast<const uint8_t *>(iov->iov_base) + off, take)) {
      publish(*s, pos, src, 0, 0);
      s = nullptr;
      dst = nullptr;
    }
    if (dst) dst += take;
    need -= take;
    off += take;
    if (off == iov->iov_len) iov++, off = 0;
  }
  if (!s) return false;
  publish(*s, pos, src, len, seg);
  prefetch_next(r, pos, len);
  return true;
}

// After filling the slot at pos with len bytes: the next slot's header,
// which the consumer wrote when it freed it, is what the next claim reads
// first, and a stream's next slot takes about as many lines as this one
// did. Both are fetched for writing now, while the application goes on,
// so that neither the next copy nor the fences after it (the publish, the
// engine lock) wait for them one by one.
void ShmNic::prefetch_next(ShmRing &r, uint64_t pos, size_t len) {
  ShmSlot &next = r.slots[(pos + 1) & kMask];
  prefetch_lines<true>(&next, std::min<size_t>(len + offsetof(ShmSlot, data), 2048));
}

uint8_t *ShmNic::tx_begin(Endpoint dst, uint16_t src_port, size_t *room) {
  ShmRing *r = ring_of(find_peer(dst));
  uint64_t pos = 0;
  ShmSlot *s = r ? claim(*r, &pos) : nullptr;
  if (!s) return nullptr;
  const Endpoint me = inner_->local();
  open_ = {r, s, pos, dst, {me.ip, src_port ? src_port : me.port}};
  *room = kSlotData;
  return s->data;
}

void ShmNic::tx_end(size_t len, size_t seg) {
  publish(*open_.slot, open_.pos, open_.src, len, seg);
  ring_if_asleep(*open_.ring, open_.dst);
  prefetch_next(*open_.ring, open_.pos, len);
  open_.slot = nullptr;
}

// After a run of datagrams published to r: a consumer about to sleep
// raises `sleeping`, fences, and looks at the ring's tail a last time; we
// claimed our slots from that tail (claim()) before we look at the flag.
// The claim and this look are sequentially consistent and the consumer's
// fence is too, so one of the two sees the other: the consumer the claim
// (it stays awake until the slot is published), or we the flag. No fence
// of our own (on x86 the claim's locked compare-and-swap orders it; a
// fence here waited for every line of the slot to reach the other core,
// once per slot). The flag stays up until the consumer wakes: a doorbell
// lost (a full socket buffer) is rung again by the next send, a
// retransmission at the latest.
void ShmNic::ring_if_asleep(ShmRing &r, Endpoint dst) {
  if (!r.sleeping.load(std::memory_order_seq_cst)) return;
  iovec iov{const_cast<uint8_t *>(kDoorbell), sizeof kDoorbell};
  TxPacket t{dst, &iov, 1};
  inner_->send({&t, 1});
}

size_t ShmNic::send(std::span<const TxPacket> pkts) {
  size_t sent = 0;
  udp_tx_.clear();
  const Endpoint me = inner_->local();
  ShmRing *run = nullptr;   // the ring the last datagrams went to
  Endpoint run_dst{};
  for (const TxPacket &p : pkts) {
    ShmRing *r = ring_of(find_peer(p.dst));
    if (r != run && run) ring_if_asleep(*run, run_dst);
    run = r;
    run_dst = p.dst;
    if (!r) {
      udp_tx_.push_back(p);
      continue;
    }
    const Endpoint src{me.ip, p.src_port ? p.src_port : me.port};
    size_t total = 0;
    for (size_t i = 0; i < p.iovcnt; i++) total += p.iov[i].iov_len;
    if (!total) continue;   // (no such datagram: nothing to copy)
    const size_t seg = p.segs > 1 && p.gso_size ? p.gso_size : total;
    const iovec *iov = p.iov;
    size_t off = 0;
    if (total <= kSlotData) {   // (the common case: one slot, no divisions)
      if (push(*r, src, iov, off, total, seg)) sent += p.segs;
      continue;
    }
    // As many whole segments per slot as fit.
    const size_t chunk = seg <= kSlotData ? kSlotData / seg * seg : seg;
    for (size_t left = total; left;) {
      const size_t len = std::min(chunk, left);
      if (push(*r, src, iov, off, len, seg)) sent += (len + seg - 1) / seg;
      left -= len;
    }
  }
  if (run) ring_if_asleep(*run, run_dst);
  if (!udp_tx_.empty()) sent += inner_->send(udp_tx_);
  return sent;
}

size_t ShmNic::recv(std::span<RxPacket> out) {
  ShmRing &r = *own_;
  uint64_t head = head_.load(std::memory_order_relaxed);
  // What the last call handed out is done with: free it, in order.
  for (; released_ != head; released_++) {
    set_seq(r.slots[released_ & kMask], released_ & kMask, released_ + kSlots);
  }
  // The socket's turn: every call while it carries traffic (a peer off
  // this host), else every 64th, with room kept for it in a full batch so
  // that a busy ring does not starve it.
  const bool woken = udp_now_.load(std::memory_order_relaxed);
  const bool udp = woken || udp_hot_ || inner_->rx_pending() || ++udp_skip_ >= 64;
  const size_t ring_max = udp && out.size() > 1 ? out.size() / 2 : out.size();
  size_t k = 0;
  while (k < ring_max) {
    const uint64_t idx = head & kMask;
    ShmSlot &s = r.slots[idx];
    if (seq_of(s, idx) != head + 1) {
      // Not published: mostly an empty ring, or a writer in the middle of
      // its copy. Looked into only after many looks: the tail's cache line
      // is the writers' (reading it on every empty poll made each claim
      // fetch it back from us).
      if (++stuck_polls_ < 1024) break;
      stuck_polls_ = 0;
      if (r.tail.load(std::memory_order_relaxed) == head) {   // empty
        stuck_since_ = 0;
        break;
      }
      // Claimed by a producer that died before publishing (its process
      // gone for a second): skip it, or the ring stops here.
      const uint64_t now = coarse_ns();
      if (!stuck_since_) stuck_since_ = now;
      if (now - stuck_since_ < kStuckNs) break;
      const int32_t pid = s.pid.load(std::memory_order_relaxed);
      if (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH)) break;   // alive: wait
      stuck_since_ = 0;
      head++;
      out[k++] = {{0, 0}, s.data, 0, true};   // an empty datagram: dropped and counted as malformed
      continue;
    }
    stuck_since_ = stuck_polls_ = 0;
    const uint32_t len = s.len, seg = s.seg;
    // The header line is ours to write next (the free): asked for now, so
    // that the store does not wait for the producer's core then.
    prefetch_lines<true>(&s, 1);
    if (len > kSlotData) {   // not from one of us: handed out empty (malformed_drops)
      head++;
      out[k++] = {{s.src_ip, s.src_port}, s.data, 0, true};
      continue;
    }
    if (seg == 0) {
      head++;
      out[k++] = {{s.src_ip, s.src_port}, s.data, len, true};
      continue;
    }
    // Several datagrams: as many as the batch takes; the slot stays at the
    // head (not freed) until its last one is handed out. The producer's
    // core wrote them: their lines are asked for all at once on the first
    // look (up to 2 KB), not missed one after another as they are read.
    if (!seg_off_) prefetch_lines(s.data, std::min<size_t>(len, 2048));
    // (In locals: each store into out[] could otherwise change the slot's
    // fields as far as the compiler knows, and they were read again.)
    const Endpoint src{s.src_ip, s.src_port};
    const uint8_t *const data = s.data;
    uint32_t off = seg_off_;
    for (; off < len && k < ring_max; off += seg) out[k++] = {src, data + off, std::min(seg, len - off), true};
    seg_off_ = off;
    if (off < len) break;
    seg_off_ = 0;
    head++;
  }
  head_.store(head, std::memory_order_relaxed);
  if (!udp || k == out.size()) return k;
  if (woken) udp_now_.store(false, std::memory_order_relaxed);
  udp_skip_ = 0;
  const size_t n = inner_->recv(out.subspan(k));
  size_t w = k;
  for (size_t i = k; i < k + n; i++) {
    if (out[i].len == sizeof kDoorbell && std::memcmp(out[i].data, kDoorbell, sizeof kDoorbell) == 0)
      continue;
    out[w++] = out[i];
  }
  if (w > k) udp_hot_ = 1024;
  else if (udp_hot_) udp_hot_--;
  return w;
}

bool ShmNic::rx_pending() const {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  return seq_of(own_->slots[head & kMask], head & kMask) == head + 1 || inner_->rx_pending();
}

bool ShmNic::prepare_wait() {
  own_->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);   // (see ring_if_asleep)
  const uint64_t head = head_.load(std::memory_order_relaxed);
  // Sleep only on an empty ring: nothing claimed since the last datagram
  // taken. A slot claimed and not yet published keeps us awake: its writer
  // would ring once it publishes, but one that died never will, and only
  // looking again finds its slot stuck (and skips it).
  if (own_->tail.load(std::memory_order_relaxed) == head) return true;
  own_->sleeping.store(0, std::memory_order_relaxed);
  return false;
}

void ShmNic::end_wait() {
  own_->sleeping.store(0, std::memory_order_relaxed);
  udp_now_.store(true, std::memory_order_relaxed);   // the wake may have been the socket's
}

}  // namespace usrc::net
