// Direct placement (LocalPeers::place): the owner lists the regions and
// gates peers may write through in its ring's directory; a writer checks
// them under the directory's lock and writes with process_vm_writev
// (memcpy within one process).
#include <pthread.h>
#include <sys/uio.h>

#include <cerrno>
#include <ctime>

#include "usrc/common/guard.h"
#include "usrc/net/shm_layout.h"

namespace usrc::net {

// A robust mutex's lock result: taken (a holder that died leaves it to us,
// consistent again), or not.
static bool taken(pthread_mutex_t &m, int e) {
  if (e == EOWNERDEAD) pthread_mutex_consistent(&m);
  return e == 0 || e == EOWNERDEAD;
}

// The directory's mutex; false only if it is unusable (a holder died in a
// way that left it unrecoverable).
bool lock(pthread_mutex_t &m) { return taken(m, pthread_mutex_lock(&m)); }

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
bool owner_alive(ShmDirectory &d) {
  const int e = pthread_mutex_trylock(&d.life);
  if (e == EBUSY) return true;
  if (taken(d.life, e)) pthread_mutex_unlock(&d.life);
  return false;
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

}  // namespace usrc::net
