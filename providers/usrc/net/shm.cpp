#include "usrc/net/shm.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

#include "usrc/common/copy.h"
#include "usrc/common/guard.h"

namespace usrc::net {

namespace {

constexpr uint64_t kMagic = 0x31676e6972637375ull;   // "usrcring1"-ish, little-endian
constexpr uint32_t kVersion = 5;
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
  // it got from the owner's socket is still the owner's (the kernel marks the lock when that
  // thread dies, before its pid can be reused).
  pthread_mutex_t life;
  pthread_mutex_t mu;   // robust, process-shared
  // Set once the owner's progress thread took `life`: from then on a free
  // `life` means that thread is gone.
  std::atomic<uint32_t> threaded;
  // The owner process: a context of the same process writes with memcpy
  // (a child of fork() is another process).
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

// The socket through which writers ask for an endpoint's ring: an abstract
// unix socket, which belongs to the network namespace as the endpoint does
// and disappears with its owner, named after the endpoint and the user.
static sockaddr_un ring_socket(Endpoint e, socklen_t *len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const int n = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "usrc.%u.%08x.%u",
                              static_cast<unsigned>(geteuid()), e.ip, static_cast<unsigned>(e.port));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

std::string ShmNic::socket_name(Endpoint e) {
  socklen_t len;
  const sockaddr_un a = ring_socket(e, &len);
  return std::string(a.sun_path + 1, len - offsetof(sockaddr_un, sun_path) - 1);
}

// The handshake (one SOCK_SEQPACKET connection per writer and owner):
//   owner -> writer  Challenge: where 16 random bytes lie in the owner's memory
//   writer -> owner  Answer: those bytes, read with process_vm_readv
//   owner -> writer  Grant, with the ring (a sealed memfd) and the owner's
//                    UDP socket (which shows that it holds the endpoint)
// process_vm_readv succeeds only where the kernel would let the writer
// ptrace the owner (PTRACE_MODE_ATTACH: same user or CAP_SYS_PTRACE, a
// dumpable owner, Yama's scope): the ring, which lets its writers put any
// packet in front of the owner's transport and place into its memory,
// goes to no process that could not write that memory anyway.
namespace {
constexpr uint64_t kHsMagic = 0x3173687372637375ull;   // "usrcshs1"-ish
struct HsChallenge {
  uint64_t magic, addr;
};
struct HsAnswer {
  uint64_t magic;
  uint8_t nonce[16];
};
struct HsGrant {
  uint64_t magic;
};
// Rung on the owner's UDP socket by a writer that connected or answered:
// the owner's progress thread may be asleep there.
constexpr uint8_t kHsBell[4] = {'u', 's', 'h', 's'};
constexpr uint64_t kHsWaitNs = 100'000'000;     // add_peer() waits this long at most
constexpr uint64_t kHsTimeoutNs = 1'000'000'000;   // a handshake's whole life
constexpr uint64_t kHsRetryNs = 1'000'000'000;     // after a failed one
constexpr uint64_t kMaintainNs = 2'000'000;        // handshakes and dead owners, looked at
constexpr size_t kMaxPending = 32;
// Datagrams that found a peer's ring full, waiting for room (bytes).
constexpr size_t kBacklogMax = 8u << 20;
}  // namespace

// The peer's user and pid (in our pid namespace; 0 if it has none there).
static bool peer_cred(int fd, ucred *c) {
  socklen_t l = sizeof *c;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, c, &l) == 0 && c->uid == geteuid();
}

// Receives a message of len bytes and up to two file descriptors (any
// others are closed). The size received, or -1 (errno).
static ssize_t recv_fds(int fd, void *msg, size_t len, int fds[2], int *nfds) {
  alignas(cmsghdr) char ctl[CMSG_SPACE(8 * sizeof(int))];
  iovec iov{msg, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  const ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *nfds = 0;
  if (n < 0) return n;
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (*nfds < 2) fds[(*nfds)++] = f;
      else ::close(f);
    }
  }
  if (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) *nfds = -1;   // (what came is closed by the caller)
  return n;
}

static bool send_fds(int fd, const void *msg, size_t len, const int fds[2]) {
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  iovec iov{const_cast<void *>(msg), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, 2 * sizeof(int));
  return sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(len);
}

// A UDP socket bound to e.
static bool bound_to(int fd, Endpoint e) {
  sockaddr_in a{};
  socklen_t l = sizeof a;
  int type = 0;
  socklen_t tl = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_DGRAM &&
         getsockname(fd, reinterpret_cast<sockaddr *>(&a), &l) == 0 && a.sin_family == AF_INET &&
         ntohl(a.sin_addr.s_addr) == e.ip && ntohs(a.sin_port) == e.port;
}


static bool valid(const ShmRing &r) {
  return __atomic_load_n(&r.magic, __ATOMIC_ACQUIRE) == kMagic && r.version == kVersion &&
         r.nslots == ShmNic::kSlots && r.slot_size == sizeof(ShmSlot);
}

static void unmap(ShmRing *&r) {
  if (r) munmap(r, sizeof(ShmRing));
  r = nullptr;
}

// Maps a ring handed to us: a memfd of this version's size that cannot
// shrink (a mapping past a file's end faults), ready and in use.
static ShmRing *map_fd(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) != sizeof(ShmRing) ||
      !(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK))
    return nullptr;
  void *p = mmap(nullptr, sizeof(ShmRing), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  auto *r = static_cast<ShmRing *>(p);
  if (!valid(*r) || !r->alive.load(std::memory_order_acquire)) {
    munmap(p, sizeof(ShmRing));
    return nullptr;
  }
  return r;
}

// An owner whose progress thread ran and is gone (it died, or is closing):
// its ring takes nothing any more.
static bool owner_gone(ShmDirectory &d) {
  return d.threaded.load(std::memory_order_acquire) && !owner_alive(d);
}

// The rings of this process's contexts, by endpoint: a writer in the same
// process (which may read its memory anyway) maps them without a handshake.
// Keyed by pid too: a child of fork() inherits the table, not the rings' owners.
namespace {
struct LocalRing {
  Endpoint ep;
  uint64_t netns;
  int fd;
  pid_t pid;
};
std::mutex local_mu;
std::vector<LocalRing> local_rings;
uint64_t net_namespace() {
  struct stat st {};
  return stat("/proc/thread-self/ns/net", &st) == 0 ? st.st_ino : 0;
}
}  // namespace


// The ring sockets this process listens on. A child of fork() shares them:
// it closes its copies at once, or the endpoint's name would stay taken
// (and connections to it unanswered) for as long as the child lives after
// its owner has closed. Lock-free: the child handler may run while another
// thread of the parent was in the middle of an update.
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
  // (More than kMaxOwned contexts: this one's children keep its socket.)
}
void untrack_owned(int fd) {
  for (auto &f : owned_fds) {
    int mine = fd;
    if (f.compare_exchange_strong(mine, -1, std::memory_order_relaxed)) return;
  }
}
}  // namespace

std::unique_ptr<Nic> ShmNic::wrap(std::unique_ptr<Nic> &inner, std::string *err) {
  const Endpoint me = inner->local();
  // No name: the ring reaches a writer only through the handshake.
  const int fd = memfd_create("usrc-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *err = std::string("memfd_create: ") + strerror(errno);
    return nullptr;
  }
  // The pages are reserved now (a lack of memory fails here, cleanly, and
  // not later as SIGBUS in a writer), and the size is sealed: no writer's
  // mapping can end up past the end of the file.
  void *p = MAP_FAILED;
  int e = ftruncate(fd, sizeof(ShmRing)) == 0 ? posix_fallocate(fd, 0, sizeof(ShmRing)) : errno;
  if (e == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) e = errno;
  if (e == 0) {
    p = mmap(nullptr, sizeof(ShmRing), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) e = errno;
  }
  if (p == MAP_FAILED) {
    ::close(fd);
    *err = std::string("shared memory for the ring: ") + strerror(e);
    return nullptr;
  }
  socklen_t alen;
  const sockaddr_un a = ring_socket(me, &alen);
  const int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ls < 0 || bind(ls, reinterpret_cast<const sockaddr *>(&a), alen) != 0 || listen(ls, 64) != 0) {
    // (Taken: by another process of ours that holds no such endpoint, as
    // we hold it now; writers check the endpoint, and we go without a ring.)
    e = errno;
    if (ls >= 0) ::close(ls);
    munmap(p, sizeof(ShmRing));
    ::close(fd);
    *err = "ring socket @" + socket_name(me) + ": " + strerror(e);
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
  r->dir.self = process_self();
  r->version = kVersion;
  r->nslots = kSlots;
  r->slot_size = sizeof(ShmSlot);
  r->alive.store(1, std::memory_order_relaxed);
  __atomic_store_n(&r->magic, kMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<Nic>(new ShmNic(std::move(inner), r, fd, ls));
}

ShmNic::ShmNic(std::unique_ptr<Nic> inner, ShmRing *own, int fd, int listen_fd)
    : NicDecorator(std::move(inner)), own_(own), own_fd_(fd), listen_fd_(listen_fd), netns_(net_namespace()),
      pid_(getpid()) {
  track_owned(listen_fd_);
  udp_tx_.reserve(64);
  std::lock_guard g(local_mu);
  local_rings.push_back({inner_->local(), netns_, own_fd_, pid_});
}

ShmNic::~ShmNic() {
  {
    std::lock_guard g(local_mu);
    std::erase_if(local_rings, [&](const LocalRing &l) { return l.fd == own_fd_ && l.pid == pid_; });
  }
  untrack_owned(listen_fd_);
  ::close(listen_fd_);
  for (Pending &q : pending_) ::close(q.fd);
  for (Peer &p : peers_) {
    if (p.hs_fd >= 0) ::close(p.hs_fd);
    if (p.owned) unmap(p.ring);
  }
  own_->alive.store(0, std::memory_order_release);
  // No writer is inside (they hold mu) or gets in after this (alive 0).
  if (lock(own_->dir.mu)) pthread_mutex_unlock(&own_->dir.mu);
  unmap(own_);
  ::close(own_fd_);
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
  if (!p) {
    p = &peers_.emplace_back();
    p->ep = e;
  }
  if (e == inner_->local()) {   // to ourselves: our own ring, not mapped twice
    p->ring = own_;
    p->owned = false;
    p->pid = pid_;
    return;
  }
  if (ring_of(p) && !owner_gone(p->ring->dir)) return;   // in use by a live owner
  drop_ring(*p);   // none yet, closed or dead: look again
  if (map_local(*p)) return;
  if (p->hs_fd >= 0) return hs_step(*p);   // under way (a slow owner): not waited for again
  if (!hs_start(*p)) return;
  // Off the datapath (a QP's modify): wait a little for the owner, whose
  // progress pass answers; meanwhile we answer whoever asks us (the peer
  // may be in its own add_peer(), waiting for us). What is not done by
  // then goes on in later passes (maintain()), the socket carrying the
  // traffic until it is; later QPs to the same peer do not wait for it.
  for (const uint64_t until = coarse_ns() + kHsWaitNs; p->hs_fd >= 0;) {
    hs_step(*p);
    serve();
    if (p->hs_fd < 0 || coarse_ns() >= until) break;
    pollfd pf[2] = {{p->hs_fd, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    poll(pf, 2, 1);
  }
}

// A ring of a context in this process, mapped directly.
bool ShmNic::map_local(Peer &p) {
  std::lock_guard g(local_mu);
  for (const LocalRing &l : local_rings) {
    if (l.ep != p.ep || l.netns != netns_ || l.pid != pid_) continue;
    p.ring = map_fd(l.fd);
    p.owned = true;
    p.pid = pid_;
    return p.ring != nullptr;
  }
  return false;
}

// Writer: connects to the owner's socket (to a process of our user) and
// rings it. False if there is none to talk to.
bool ShmNic::hs_start(Peer &p) {
  const uint64_t now = coarse_ns();
  if (now < p.hs_retry) return false;
  socklen_t alen;
  const sockaddr_un a = ring_socket(p.ep, &alen);
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ucred c{};
  if (s < 0 || connect(s, reinterpret_cast<const sockaddr *>(&a), alen) != 0 || !peer_cred(s, &c) ||
      c.pid <= 0) {
    if (s >= 0) ::close(s);
    p.hs_retry = now + kHsRetryNs;
    return false;
  }
  p.hs_fd = s;
  p.hs = 1;
  p.pid = c.pid;
  p.hs_until = now + kHsTimeoutNs;
  hs_bell(p.ep);
  return true;
}

void ShmNic::hs_fail(Peer &p) {
  ::close(p.hs_fd);
  p.hs_fd = -1;
  p.hs = 0;
  p.hs_retry = coarse_ns() + kHsRetryNs;
}

void ShmNic::hs_bell(Endpoint dst) {
  iovec iov{const_cast<uint8_t *>(kHsBell), sizeof kHsBell};
  TxPacket t{dst, &iov, 1};
  inner_->send({&t, 1});
}

// Writer: the handshake's next step, if the owner's message is there.
void ShmNic::hs_step(Peer &p) {
  if (p.hs_fd < 0) return;
  if (p.hs == 1) {
    HsChallenge ch{};
    const ssize_t n = ::recv(p.hs_fd, &ch, sizeof ch, MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) {
      if (coarse_ns() > p.hs_until) hs_fail(p);
      return;
    }
    HsAnswer ans{kHsMagic, {}};
    const iovec mine{ans.nonce, sizeof ans.nonce};
    const iovec theirs{reinterpret_cast<void *>(ch.addr), sizeof ans.nonce};
    if (n != sizeof ch || ch.magic != kHsMagic ||
        process_vm_readv(p.pid, &mine, 1, &theirs, 1, 0) != ssize_t(sizeof ans.nonce) ||
        ::send(p.hs_fd, &ans, sizeof ans, MSG_DONTWAIT | MSG_NOSIGNAL) != ssize_t(sizeof ans))
      return hs_fail(p);
    p.hs = 2;
    hs_bell(p.ep);
    return;
  }
  HsGrant g{};
  int fds[2] = {-1, -1}, nfds = 0;
  const ssize_t n = recv_fds(p.hs_fd, &g, sizeof g, fds, &nfds);
  if (n < 0 && errno == EAGAIN) {
    if (coarse_ns() > p.hs_until) hs_fail(p);
    return;
  }
  ShmRing *r = n == sizeof g && g.magic == kHsMagic && nfds == 2 && bound_to(fds[1], p.ep)
                   ? map_fd(fds[0]) : nullptr;
  for (int f : fds)
    if (f >= 0) ::close(f);
  if (!r) return hs_fail(p);
  ::close(p.hs_fd);
  p.hs_fd = -1;
  p.hs = 0;
  p.ring = r;
  p.owned = true;
  p.no_place = false;
}

// Owner: takes new connections from processes of our user (each is sent
// its challenge) and the answers of earlier ones (a right one gets the
// ring). Non-blocking, bounded: kMaxPending at a time, each for
// kHsTimeoutNs at most.
void ShmNic::serve() {
  for (;;) {
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) break;
    Pending q{c, coarse_ns() + kHsTimeoutNs, std::make_unique<uint8_t[]>(16)};
    const HsChallenge ch{kHsMagic, reinterpret_cast<uint64_t>(q.nonce.get())};
    ucred cr{};
    if (pending_.size() >= kMaxPending || !peer_cred(c, &cr) ||
        getrandom(q.nonce.get(), 16, GRND_NONBLOCK) != 16 ||
        ::send(c, &ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) != ssize_t(sizeof ch)) {
      ::close(c);
      continue;
    }
    pending_.push_back(std::move(q));
  }
  for (size_t i = 0; i < pending_.size();) {
    Pending &q = pending_[i];
    HsAnswer a{};
    const ssize_t n = ::recv(q.fd, &a, sizeof a, MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN && coarse_ns() < q.until) {
      i++;
      continue;
    }
    if (n == sizeof a && a.magic == kHsMagic && std::memcmp(a.nonce, q.nonce.get(), 16) == 0) {
      const HsGrant g{kHsMagic};
      const int fds[2] = {own_fd_, inner_->wait_fd()};
      send_fds(q.fd, &g, sizeof g, fds);
    }
    ::close(q.fd);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

// Now and then (and at once when a writer rang): handshakes on either side,
// and rings of owners that died, let go.
void ShmNic::maintain() {
  maint_now_ = false;
  maint_at_ = coarse_ns() + kMaintainNs;
  serve();
  for (Peer &p : peers_) {
    if (p.hs_fd >= 0) hs_step(p);
    else if (p.owned && p.ring && owner_gone(p.ring->dir)) drop_ring(p);
  }
}

// The peer's ring unmapped (ours is not), and what waited for it dropped.
void ShmNic::drop_ring(Peer &p) {
  if (p.owned) unmap(p.ring);
  p.ring = nullptr;
  p.no_place = false;
  backlog_clear(p);
}

ShmRing *ShmNic::ring_of(Peer *p) {
  if (!p || !p->ring) return nullptr;
  if (p->owned && !p->ring->alive.load(std::memory_order_relaxed)) {
    // The peer closed: from now on the socket, until the next add_peer()
    // finds a new ring.
    drop_ring(*p);
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
    } else if (p->pid > 0 && owner_alive(d)) {   // (the pid the handshake's socket gave)
      const iovec remote{to, len};
      const ssize_t n = process_vm_writev(p->pid, iov, iovcnt, &remote, 1, 0);
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
  else if (lock(own_->dir.life))   // (held for a moment by a writer, or left by one that died)
    own_->dir.threaded.store(1, std::memory_order_release);
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

// Hands the next len bytes at the iovec cursor, datagrams of seg bytes
// (seg >= len: one), to pe's ring r: into a claimed slot, or, if r is full
// or `wait` (datagrams to pe wait already), behind them in pe's backlog,
// which takes them on to the ring in order (drain()). After the first
// one that waits, `wait` is set. False: dropped (larger than a slot, a
// backlog full up, or a source the application unmapped, guard.h: its
// slot then holds an empty datagram, dropped by the receiver). The
// cursor moves past them.
bool ShmNic::push(Peer &pe, ShmRing &r, Endpoint src, const iovec *&iov, size_t &off, size_t len,
                  size_t seg, bool &wait) {
  if (len > kSlotData) return fill(nullptr, iov, off, len), false;
  uint64_t pos = 0;
  ShmSlot *s = wait ? nullptr : claim(r, &pos);
  if (!s) {
    wait = true;
    return enqueue(pe, src, iov, off, len, seg);
  }
  if (!fill(s->data, iov, off, len)) {
    publish(*s, pos, src, 0, 0);
    return false;
  }
  publish(*s, pos, src, len, seg);
  prefetch_next(r, pos, len);
  return true;
}

// Copies the next len bytes at the iovec cursor to dst (nullptr: skips
// them); the cursor moves past them. False if a source was no longer
// mapped (guard.h; the rest is skipped).
bool ShmNic::fill(uint8_t *dst, const iovec *&iov, size_t &off, size_t len) {
  bool ok = true;
  for (size_t need = len; need;) {
    const size_t take = std::min(iov->iov_len - off, need);
    if (dst && !guard::copy(dst, static_cast<const uint8_t *>(iov->iov_base) + off, take)) {
      dst = nullptr;
      ok = false;
    }
    if (dst) dst += take;
    need -= take;
    off += take;
    if (off == iov->iov_len) iov++, off = 0;
  }
  return ok;
}

// The backlog of datagrams to a peer whose ring was full: records of a
// header and the datagrams, 8-byte aligned, taken from q_off on.
namespace {
struct BacklogRec {
  uint32_t len;
  uint16_t seg;        // as ShmSlot::seg
  uint16_t src_port;
};
constexpr size_t rec_size(size_t len) { return sizeof(BacklogRec) + ((len + 7) & ~size_t(7)); }
}  // namespace

bool ShmNic::enqueue(Peer &pe, Endpoint src, const iovec *&iov, size_t &off, size_t len, size_t seg) {
  if (pe.q.size() - pe.q_off + rec_size(len) > kBacklogMax) return fill(nullptr, iov, off, len), false;
  if (pe.q.empty()) backlog_peers_++;
  const size_t at = pe.q.size();
  pe.q.resize(at + rec_size(len));
  const BacklogRec h{static_cast<uint32_t>(len), static_cast<uint16_t>(seg < len ? seg : 0), src.port};
  std::memcpy(&pe.q[at], &h, sizeof h);
  if (!fill(&pe.q[at + sizeof h], iov, off, len)) {   // (its source unmapped: not kept)
    if (at == 0) backlog_clear(pe);
    else pe.q.resize(at);
    return false;
  }
  return true;
}

// Moves pe's backlog into its ring r, as far as there is room. True if
// nothing waits any more.
bool ShmNic::drain(Peer &pe, ShmRing &r) {
  const uint32_t ip = inner_->local().ip;
  while (pe.q_off < pe.q.size()) {
    BacklogRec h;
    std::memcpy(&h, &pe.q[pe.q_off], sizeof h);
    uint64_t pos = 0;
    ShmSlot *s = claim(r, &pos);
    if (!s) return false;
    std::memcpy(s->data, &pe.q[pe.q_off + sizeof h], h.len);
    publish(*s, pos, {ip, h.src_port}, h.len, h.seg ? h.seg : h.len);
    pe.q_off += rec_size(h.len);
  }
  backlog_clear(pe);
  return true;
}

void ShmNic::drain_all() {
  for (Peer &p : peers_) {
    if (p.q.empty()) continue;
    if (ShmRing *r = ring_of(&p)) {   // (a ring gone drops what waited for it)
      drain(p, *r);
      ring_if_asleep(*r, p.ep);
    }
  }
}

void ShmNic::backlog_clear(Peer &pe) {
  if (!pe.q.empty()) backlog_peers_--;
  pe.q.clear();
  pe.q_off = 0;
  if (pe.q.capacity() > (1u << 20)) pe.q.shrink_to_fit();
}

bool ShmNic::tx_blocked(Endpoint dst) {
  if (!backlog_peers_) return false;
  const Peer *p = find_peer(dst);
  return p && !p->q.empty();
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
  Peer *pe = find_peer(dst);
  ShmRing *r = ring_of(pe);
  uint64_t pos = 0;
  // (Behind a backlog: send() queues it.)
  ShmSlot *s = r && pe->q.empty() ? claim(*r, &pos) : nullptr;
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
    Peer *pe = find_peer(p.dst);
    ShmRing *r = ring_of(pe);
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
    // Datagrams wait for room in this ring: those go first.
    bool wait = !pe->q.empty() && !drain(*pe, *r);
    if (total <= kSlotData) {   // (the common case: one slot, no divisions)
      if (push(*pe, *r, src, iov, off, total, seg, wait)) sent += p.segs;
      continue;
    }
    // As many whole segments per slot as fit.
    const size_t chunk = seg <= kSlotData ? kSlotData / seg * seg : seg;
    for (size_t left = total; left;) {
      const size_t len = std::min(chunk, left);
      if (push(*pe, *r, src, iov, off, len, seg, wait)) sent += (len + seg - 1) / seg;
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
  if (backlog_peers_) drain_all();   // (room in peers' rings since the last pass?)
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
  if (udp && (maint_now_ || coarse_ns() >= maint_at_)) maintain();
  if (!udp || k == out.size()) return k;
  if (woken) udp_now_.store(false, std::memory_order_relaxed);
  udp_skip_ = 0;
  const size_t n = inner_->recv(out.subspan(k));
  size_t w = k;
  for (size_t i = k; i < k + n; i++) {
    if (out[i].len == sizeof kDoorbell && std::memcmp(out[i].data, kDoorbell, sizeof kDoorbell) == 0)
      continue;
    if (out[i].len == sizeof kHsBell && std::memcmp(out[i].data, kHsBell, sizeof kHsBell) == 0) {
      maint_now_ = true;   // a writer connected or answered
      continue;
    }
    out[w++] = out[i];
  }
  if (maint_now_) maintain();
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
