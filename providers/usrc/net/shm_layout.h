// The shared-memory NIC's ring as it lies in the shared file, and what the
// three files of ShmNic (shm.h) share: shm_ring.cpp, the ring (slots,
// claim and publish, doorbell, consumer); shm_registry.cpp, how a ring is
// made, named, handed to a writer and let go (the handshake, stale owners,
// fork); shm_place.cpp, direct placement (the directory, its gates and
// locks, process_vm_writev). Internal to net/.
#pragma once

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "usrc/net/shm.h"

namespace usrc::net {

inline constexpr uint64_t kMagic = 0x31676e6972637375ull;   // "usrcring1"-ish, little-endian
inline constexpr uint32_t kVersion = 5;
// Rung on the owner's UDP socket by a writer that connected or answered:
// the owner's progress thread may be asleep there.
inline constexpr uint8_t kHsBell[4] = {'u', 's', 'h', 's'};

inline uint64_t coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

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

// Direct placement: what the owner lets peers write into (LocalPeers::expose,
// LocalPeers::set_gate), looked up by key and tag modulo the table size (a key
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

inline uint64_t seq_of(const ShmSlot &s, uint64_t idx) {
  return s.seq.load(std::memory_order_acquire) + idx;
}
inline void set_seq(ShmSlot &s, uint64_t idx, uint64_t v) {
  s.seq.store(v - idx, std::memory_order_release);
}

// shm_place.cpp: the directory's mutex, taken (false only if it is
// unusable: a holder died in a way that left it unrecoverable); whether the
// owner's progress thread holds its life lock (ShmNic::owner_thread).
bool lock(pthread_mutex_t &m);
bool owner_alive(ShmDirectory &d);
// shm_registry.cpp: this process, among all that share the ring files.
uint64_t process_self();

}  // namespace usrc::net
