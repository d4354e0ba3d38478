// How a ring is made, named and handed to a writer (the handshake over
// the abstract unix socket, the memfd passed with SCM_RIGHTS), how a
// writer finds a ring of its own process, and how rings of owners gone are
// let go, in a child of fork() too. (shm.h; the ring itself: shm_ring.cpp.)
#include "usrc/net/shm_layout.h"
#include "usrc/device.h"   // net_namespace

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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

namespace usrc::net {

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
uint64_t process_self() {
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
constexpr uint64_t kHsWaitNs = 100'000'000;     // add_peer() waits this long at most
constexpr uint64_t kHsTimeoutNs = 1'000'000'000;   // a handshake's whole life
constexpr uint64_t kHsRetryNs = 1'000'000'000;     // after a failed one
constexpr uint64_t kMaintainNs = 2'000'000;        // handshakes and dead owners, looked at
constexpr size_t kMaxPending = 32;
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
      const int fds[2] = {own_fd_, inner_->bound_fd()};
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

}  // namespace usrc::net
