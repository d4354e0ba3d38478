// Same-host datagrams through shared memory: a NIC decorator over the UDP
// backend. Each context owns a receive ring, an anonymous memfd that has no
// name anywhere, and listens on an abstract unix socket named after its UDP
// endpoint (and user; the network namespace scopes it). A process that
// wants to write into it connects there and proves, before it gets the
// ring (SCM_RIGHTS), that the kernel would let it write the owner's memory
// anyway: the ring lets its writers put packets in front of the owner's
// transport and place data into its memory, so it grants no more than
// ptrace would (same user or CAP_SYS_PTRACE, a dumpable owner, Yama). The
// owner also hands over its UDP socket, which shows the writer that it
// talks to the endpoint's holder. See "The handshake" in shm_registry.cpp. A
// datagram to a peer whose ring we hold goes into that ring (no system
// call, one copy); everything else, every peer that refused us or has no
// ring, and every peer until the handshake is done, takes the inner NIC.
// The packets are the same IBA packets either way: only the medium differs.
// A ring lives as long as someone maps it: its owner's, and its writers'
// until they see the owner gone.
//
// The ring holds fixed slots (one datagram each) and is a bounded
// multi-producer, single-consumer queue: a producer claims a position with a
// compare-and-swap, copies, then publishes the slot's sequence number. A
// full ring is back-pressure, not loss: what does not fit waits in the
// sender's backlog for that peer (taken on, in order, at the next send or
// receive), and the transport sends the peer nothing new meanwhile
// (LocalPeers::tx_blocked).
//
// Wake-ups: the consumer's progress thread sleeps on the UDP socket. Before
// sleeping it raises the ring's `sleeping` flag and looks once more; a
// producer that sees the flag after publishing sends a small doorbell
// datagram over UDP, which wakes it and is then discarded.
//
// The code: shm_ring.cpp (the ring and its consumer), shm_registry.cpp
// (making, naming and handing over rings; the handshake), shm_place.cpp
// (direct placement); shm_layout.h, what they share.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "usrc/net/nic.h"

namespace usrc::net {

struct ShmRing;
struct ShmSlot;

class ShmNic final : public NicDecorator, public LocalPeers {
 public:
  // Creates our ring and wraps `inner`; nullptr (inner untouched) with *err
  // set if the ring cannot be created.
  static std::unique_ptr<Nic> wrap(std::unique_ptr<Nic> &inner, std::string *err);
  ~ShmNic() override;

  // The datagram NIC: the ring for peers that granted theirs, the inner
  // NIC for the rest.
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;
  bool rx_pending() const override;
  void add_peer(Endpoint e) override;
  bool prepare_wait() override;
  void end_wait() override;
  LocalPeers *local_peers() override { return this; }

  // LocalPeers: building in a peer's ring, its back-pressure.
  bool cheap_send(Endpoint dst) override { return ring_of(find_peer(dst)) != nullptr; }
  uint8_t *tx_begin(Endpoint dst, uint16_t src_port, size_t *room) override;
  void tx_end(size_t len, size_t seg) override;
  bool tx_blocked(Endpoint dst) override;
  bool tx_pending() const override { return backlog_peers_ != 0; }
  // Direct placement into a peer context's memory: ours (the ring's owner
  // and the process that registered it) publishes regions and gates in its
  // ring; a writer checks them under the directory's lock and writes
  // with process_vm_writev (memcpy within one process).
  bool place(Endpoint dst, uint32_t tag, uint32_t my_tag, uint32_t key, uint64_t at,
             const iovec *iov, size_t iovcnt, size_t len) override;
  bool expose(uint32_t key, const Region &r) override;
  void withdraw(uint32_t key) override;
  bool set_gate(uint32_t tag, const Gate &g) override;
  void owner_thread(bool start) override;

  // The abstract socket name (without its leading NUL) where the context
  // of endpoint e of this user listens for writers.
  static std::string socket_name(Endpoint e);
  static constexpr uint32_t kSlots = 2048, kSlotData = 4096 + 256;

 private:
  struct Peer {
    Endpoint ep;
    ShmRing *ring = nullptr;   // mapped, or none (the socket)
    bool owned = true;         // false: our own ring (own_), not unmapped here
    bool no_place = false;     // process_vm_writev refused: no direct placement
    int32_t pid = 0;           // the owner, in our pid namespace (its socket's SO_PEERCRED)
    // The handshake for its ring: the connection (-1: none), the message
    // awaited (1 the challenge, 2 the grant), until when, and when to try
    // again after one failed.
    int hs_fd = -1;
    uint8_t hs = 0;
    uint64_t hs_until = 0, hs_retry = 0;
    // Datagrams that found the ring full (BacklogRec and data), from q_off;
    // empty (cleared) once all have gone.
    std::vector<uint8_t> q;
    size_t q_off = 0;
  };
  // Owner side: a writer's connection, challenged with `nonce` (held here,
  // in our memory, where the writer must read it).
  struct Pending {
    int fd;
    uint64_t until;
    std::unique_ptr<uint8_t[]> nonce;
  };
  ShmNic(std::unique_ptr<Nic> inner, ShmRing *own, int fd, int listen_fd);
  Peer *find_peer(Endpoint e);
  ShmRing *ring_of(Peer *p);   // the peer's ring if it is still open
  void drop_ring(Peer &p);
  bool map_local(Peer &p);
  bool hs_start(Peer &p);
  void hs_step(Peer &p);
  void hs_fail(Peer &p);
  void hs_bell(Endpoint dst);
  void serve();
  void maintain();
  ShmSlot *claim(ShmRing &r, uint64_t *pos);
  bool push(Peer &pe, ShmRing &r, Endpoint src, const iovec *&iov, size_t &off, size_t len, size_t seg,
            bool &wait);
  static bool fill(uint8_t *dst, const iovec *&iov, size_t &off, size_t len);
  bool enqueue(Peer &pe, Endpoint src, const iovec *&iov, size_t &off, size_t len, size_t seg);
  bool drain(Peer &pe, ShmRing &r);
  void drain_all();
  void backlog_clear(Peer &pe);
  void publish(ShmSlot &s, uint64_t pos, Endpoint src, size_t len, size_t seg);
  void prefetch_next(ShmRing &r, uint64_t pos, size_t len);
  void ring_if_asleep(ShmRing &r, Endpoint dst);

  ShmRing *own_;
  int own_fd_;      // the ring's memfd
  int listen_fd_;   // where writers ask for it
  const uint64_t netns_;
  const int pid_;
  std::vector<Peer> peers_;
  size_t last_peer_ = 0;
  size_t backlog_peers_ = 0;   // peers with datagrams waiting in their backlog
  std::vector<Pending> pending_;
  uint64_t maint_at_ = 0;      // the next maintain() (coarse clock)
  bool maint_now_ = false;     // a writer rang: maintain() at once
  // Consumer state (under the engine lock); head_ is read by prepare_wait()
  // from the progress thread, hence atomic.
  std::atomic<uint64_t> head_{0};
  uint64_t released_ = 0;          // slots handed out before head_ not yet freed
  uint32_t seg_off_ = 0;           // datagrams of the head slot handed out (bytes)
  uint64_t stuck_since_ = 0;       // when the head slot was first seen claimed, unpublished
  uint32_t stuck_polls_ = 0;
  // The UDP socket is looked at on every call while it carries traffic
  // (a peer off this host), else on every 64th: an empty receive is a
  // system call, the ring a memory read.
  uint32_t udp_hot_ = 0, udp_skip_ = 0;
  std::atomic<bool> udp_now_{false};   // the progress thread woke: look at once
  std::vector<TxPacket> udp_tx_;
  // Between tx_begin() and tx_end(): the slot claimed, its ring position,
  // where it goes and from which endpoint.
  struct {
    ShmRing *ring = nullptr;
    ShmSlot *slot = nullptr;
    uint64_t pos = 0;
    Endpoint dst, src;
  } open_;
};

}  // namespace usrc::net
