// The narrow interface between the transport and a datagram NIC (design.md:
// "NIC backends"). A backend moves whole UDP payloads to and from IPv4
// endpoints, in batches; it knows nothing of the IBA.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace usrc::net {

struct Endpoint {
  uint32_t ip = 0;     // host byte order
  uint16_t port = 0;   // host byte order
  friend bool operator==(const Endpoint &, const Endpoint &) = default;
};

struct TxPacket {
  Endpoint dst;
  const iovec *iov;    // the UDP payload, in pieces
  size_t iovcnt;
  uint8_t tos = 0;     // IP TOS byte (DSCP and ECN)
  uint8_t ttl = 0;     // IP TTL; 0: the system default
  uint16_t src_port = 0;  // UDP source port; 0: local().port
  // Segmentation offload: 0, one datagram; else the iovecs hold several
  // datagrams of gso_size bytes each (the last may be shorter), sent as one
  // (UDP GSO). Only when the backend's gso_segments() is above 1.
  uint16_t gso_size = 0;
  uint16_t segs = 1;   // datagrams in this packet
};

struct RxPacket {
  Endpoint src;
  const uint8_t *data; // owned by the NIC; valid until the next recv()
  size_t len;
  // From a process of this host and user, through memory only it and we
  // can write (a shared-memory ring): may carry direct-placement notices.
  bool trusted = false;
  // The UDP port it arrived at: 0, local().port; else the RoCE v2 port
  // (net/roce_port.h), which the ICRC covers in its place.
  uint16_t dst_port = 0;
};

// Direct placement (same-host peers whose memory the backend can reach):
// a context exposes memory regions by key and gates by tag; a peer writes
// into a region through an open gate whose far end is the writer.
struct Gate {
  uint64_t domain = 0;     // regions of this domain only (0: the gate is shut)
  uint32_t peer_tag = 0;   // the writer's tag, as the writer gives it
  Endpoint peer;           // the writer's endpoint
};
struct Region {
  uint64_t domain = 0;
  uint8_t *addr = nullptr; // where base lies in the owner's address space
  uint64_t base = 0, len = 0;
};

// The same-host short cuts, where the medium reaches a peer's memory (a
// shared-memory ring): an optional capability of a NIC (Nic::local_peers()).
// A NIC without it is a datagram NIC and nothing else; the transport then
// sends everything with send().
class LocalPeers {
 public:
  virtual ~LocalPeers() = default;
  // Sending to dst costs no system call (a shared-memory ring): a stream's
  // packets may then go out in small batches as they are posted, so that
  // the receiver works on them meanwhile, instead of all at the end of a
  // burst of posts (where a sender that waits for their ACKs would stall).
  virtual bool cheap_send(Endpoint) { return false; }
  // Building in place: tx_begin() gives a buffer of *room bytes for
  // datagrams to dst from our UDP port src_port (0: local().port), which
  // the caller writes back to back, all of seg bytes but the last (which
  // may be shorter), and hands to tx_end() with their total length (at
  // least one datagram; nothing else is called on the NIC in between).
  // nullptr: no such buffer now (none for this peer, or no room): send()
  // instead.
  virtual uint8_t *tx_begin(Endpoint /*dst*/, uint16_t /*src_port*/, size_t * /*room*/) {
    return nullptr;
  }
  virtual void tx_end(size_t /*len*/, size_t /*seg*/) {}
  // Back-pressure: datagrams to dst that send() took (and counted as sent)
  // but could not hand on yet (a full shared-memory ring); they go on, in
  // order, at later send() and recv() calls. The transport sends dst
  // nothing new meanwhile, and tx_pending() asks it to call in again soon
  // while any wait.
  virtual bool tx_blocked(Endpoint /*dst*/) { return false; }
  virtual bool tx_pending() const { return false; }

  // Direct placement. place(): writes the len bytes of iov into dst's
  // region `key` at [at, at+len), through dst's gate `tag` whose peer is
  // (our endpoint, my_tag); true if every byte landed, false if dst has no
  // such region or gate (or no way in): the caller then sends as usual.
  // expose()/withdraw(), set_gate(): what peers may place into here; once
  // withdraw() or a shut gate returns, no place() reaches that memory.
  // expose() and opening a gate return false if the key or tag could not
  // be listed (its entry in a fixed-size table is another's): peers then
  // send to it as usual.
  virtual bool place(Endpoint /*dst*/, uint32_t /*tag*/, uint32_t /*my_tag*/, uint32_t /*key*/,
                     uint64_t /*at*/, const iovec * /*iov*/, size_t /*iovcnt*/, size_t /*len*/) {
    return false;
  }
  virtual bool expose(uint32_t /*key*/, const Region &) { return true; }
  virtual void withdraw(uint32_t /*key*/) {}
  virtual bool set_gate(uint32_t /*tag*/, const Gate &) { return true; }
  // The context's long-lived thread (its progress thread) calls this with
  // true when it starts and false before it ends: peers may place into
  // this context only in between (they need a live target process).
  virtual void owner_thread(bool /*start*/) {}
};

class Nic {
 public:
  virtual ~Nic() = default;
  virtual Endpoint local() const = 0;
  // A file descriptor that becomes readable when packets arrive (for the
  // progress thread's poll), or -1 if the backend has none.
  virtual int wait_fd() const = 0;
  // The socket bound to local() (what a same-host peer checks, net/shm.h),
  // when it is not wait_fd().
  virtual int bound_fd() const { return wait_fd(); }
  // Sends as many packets as it can; returns how many datagrams were sent
  // (a segmented packet counts its segments; the rest are dropped: the
  // transport retransmits).
  virtual size_t send(std::span<const TxPacket> pkts) = 0;
  // Non-blocking: fills up to out.size() datagrams, returns how many. A
  // backend that receives coalesced datagrams (UDP GRO) hands them out one
  // by one.
  virtual size_t recv(std::span<RxPacket> out) = 0;
  // The datagrams the last recv() handed out are handled: their buffers
  // may go back to the backend now rather than at the next recv() (an
  // AF_XDP ring shows its fd readable until they do).
  virtual void rx_done() {}
  // Datagrams already received from the kernel and not yet handed out by
  // recv() (the rest of a coalesced receive), which wait_fd() does not
  // show, or a stream whose next datagrams are likely waiting: call recv()
  // again before sleeping.
  virtual bool rx_pending() const { return false; }
  // Of those, the ones already received from the kernel (the rest of a
  // coalesced receive): recv() hands them out without receiving more, so a
  // caller that calls it while this holds reaches the end of them.
  virtual bool rx_held() const { return false; }
  // The progress thread is about to sleep on wait_fd(): false if datagrams
  // are waiting that the fd would not show (then it calls recv() instead).
  // end_wait() follows every true, once awake. Thread-safe against recv().
  virtual bool prepare_wait() { return true; }
  virtual void end_wait() {}
  // Before every sleep on wait_fd(), doorbell or not: a backend whose fd
  // stays readable until re-armed (libfabric's wait objects: fi_trywait)
  // re-arms it; false if completions are waiting (then recv() instead).
  // Thread-safe against recv().
  virtual bool arm_wait() { return true; }
  // The transport will talk to this peer (a QP reached RTR). Backends that
  // keep per-peer state (an address vector, a neighbour's MAC) prepare it
  // here, off the datapath.
  virtual void add_peer(Endpoint) {}

  // Path capabilities.
  // The most datagrams one TxPacket may carry (1: no segmentation offload).
  // It may fall to 1 while running (a route that refuses GSO): ask per batch.
  virtual uint32_t gso_segments() const { return 1; }
  // True if datagrams to and from this endpoint never leave the host's
  // memory: the transport then leaves out the ICRC, as the kernel leaves
  // out the checksums on its loopback path. 127.0.0.0/8 and our own
  // address are such peers (the kernel routes both through the loopback
  // device, and drops such sources arriving from outside).
  virtual bool same_host(Endpoint e) const { return (e.ip >> 24) == 127 || e.ip == local().ip; }
  // True if the datagrams it sends carry a UDP checksum and the ones it
  // receives had theirs verified (the kernel's UDP sockets): between two
  // such NICs the ICRC adds nothing the checksum does not cover, and the
  // transport leaves it out once the peer says it takes that
  // (wire::bth::kIcrcOptional). Not AF_XDP's, which sends no checksum and
  // checks none.
  virtual bool udp_checksummed() const { return false; }
  // The same-host short cuts (LocalPeers above), or nullptr: none. The same
  // object for the NIC's life, so callers may keep the pointer.
  virtual LocalPeers *local_peers() = 0;
};

// A NIC over another (a decorator: ShmNic, TraceNic): every call goes to
// the inner NIC unless the decorator overrides it, so a decorator cannot
// switch a path off by not knowing of it.
class NicDecorator : public Nic {
 public:
  Endpoint local() const override { return inner_->local(); }
  int wait_fd() const override { return inner_->wait_fd(); }
  int bound_fd() const override { return inner_->bound_fd(); }
  size_t send(std::span<const TxPacket> pkts) override { return inner_->send(pkts); }
  size_t recv(std::span<RxPacket> out) override { return inner_->recv(out); }
  void rx_done() override { inner_->rx_done(); }
  bool rx_pending() const override { return inner_->rx_pending(); }
  bool rx_held() const override { return inner_->rx_held(); }
  bool udp_checksummed() const override { return inner_->udp_checksummed(); }
  bool prepare_wait() override { return inner_->prepare_wait(); }
  void end_wait() override { inner_->end_wait(); }
  bool arm_wait() override { return inner_->arm_wait(); }
  void add_peer(Endpoint e) override { inner_->add_peer(e); }
  uint32_t gso_segments() const override { return inner_->gso_segments(); }
  bool same_host(Endpoint e) const override { return inner_->same_host(e); }
  LocalPeers *local_peers() override { return inner_->local_peers(); }

 protected:
  explicit NicDecorator(std::unique_ptr<Nic> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Nic> inner_;
};

// The same for the capability: forwards every call to the inner one.
class LocalPeersDecorator : public LocalPeers {
 public:
  explicit LocalPeersDecorator(LocalPeers &inner) : inner_(inner) {}
  bool cheap_send(Endpoint dst) override { return inner_.cheap_send(dst); }
  uint8_t *tx_begin(Endpoint dst, uint16_t src_port, size_t *room) override {
    return inner_.tx_begin(dst, src_port, room);
  }
  void tx_end(size_t len, size_t seg) override { inner_.tx_end(len, seg); }
  bool tx_blocked(Endpoint dst) override { return inner_.tx_blocked(dst); }
  bool tx_pending() const override { return inner_.tx_pending(); }
  bool place(Endpoint dst, uint32_t tag, uint32_t my_tag, uint32_t key, uint64_t at,
             const iovec *iov, size_t iovcnt, size_t len) override {
    return inner_.place(dst, tag, my_tag, key, at, iov, iovcnt, len);
  }
  bool expose(uint32_t key, const Region &r) override { return inner_.expose(key, r); }
  void withdraw(uint32_t key) override { inner_.withdraw(key); }
  bool set_gate(uint32_t tag, const Gate &g) override { return inner_.set_gate(tag, g); }
  void owner_thread(bool start) override { inner_.owner_thread(start); }

 protected:
  LocalPeers &inner_;
};

}  // namespace usrc::net
