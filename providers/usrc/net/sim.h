// A deterministic simulated network for transport tests: packets between
// SimNics are dropped, duplicated, reordered, delayed or corrupted according
// to a seeded RNG and a virtual clock that the test advances.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "usrc/net/nic.h"

namespace usrc::net {

struct SimFaults {
  double drop = 0, duplicate = 0, reorder = 0, corrupt = 0;
  uint64_t delay_ns = 1000;         // base one-way delay
  uint64_t reorder_extra_ns = 20000;// extra delay of a reordered packet
  // Datagrams carry a UDP checksum that the receiving kernel verifies
  // (SimNic::udp_checksummed): a corrupted one is dropped, not delivered.
  bool udp_checksum = false;
};

class SimNetwork {
 public:
  explicit SimNetwork(uint64_t seed, SimFaults f = {}) : rng_(seed), faults_(f) {}
  uint64_t now() const { return now_; }
  void advance(uint64_t ns) { now_ += ns; }
  void set_faults(const SimFaults &f) { faults_ = f; }
  const SimFaults &faults() const { return faults_; }
  // The earliest delivery time of a packet in flight, or UINT64_MAX.
  uint64_t next_delivery() const;
  // A NIC that is partitioned away drops everything it sends and receives.
  void set_partitioned(Endpoint e, bool p) { partitioned_[key(e)] = p; }
  // A NIC that takes at most n datagrams per receive (0: as many as asked
  // for), as a host that has just been idle does (net::UdpNic).
  void set_rx_batch(Endpoint e, size_t n) { rx_batch_[key(e)] = n; }

  struct Stats {
    uint64_t sent = 0, dropped = 0, duplicated = 0, reordered = 0, corrupted = 0;
    uint64_t in_place = 0;   // datagrams built in place (LocalPeers::tx_end), of sent
  };
  Stats stats;
  // The network is one host's loopback: every SimNic calls its peers
  // same_host.
  bool loopback = false;
  // Sees every datagram that is not dropped, before other faults.
  std::function<void(const std::vector<uint8_t> &)> tap;
  // Drops the datagrams it returns true for (a chosen loss), before tap.
  std::function<bool(const std::vector<uint8_t> &)> drop_if;

 private:
  friend class SimNic;
  struct InFlight { uint64_t at; uint64_t seq; Endpoint src, dst; std::vector<uint8_t> data; };
  static uint64_t key(Endpoint e) { return (uint64_t(e.ip) << 16) | e.port; }
  void submit(Endpoint src, const TxPacket &p);
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < p; }

  std::mt19937_64 rng_;
  SimFaults faults_;
  uint64_t now_ = 0, seq_ = 0;
  std::multimap<uint64_t, InFlight> flight_;   // by delivery time
  std::map<uint64_t, bool> partitioned_;
  std::map<uint64_t, size_t> rx_batch_;
};

class SimNic final : public Nic, public LocalPeers {
 public:
  SimNic(SimNetwork &net, Endpoint local) : net_(net), local_(local) {}
  Endpoint local() const override { return local_; }
  int wait_fd() const override { return -1; }
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;
  bool same_host(Endpoint) const override { return net_.loopback; }
  bool udp_checksummed() const override { return net_.faults().udp_checksum; }
  // On a loopback network, a buffer to build datagrams in place (as the
  // shared-memory ring offers), each then sent as one with its own faults.
  bool cheap_send(Endpoint) override { return net_.loopback; }
  uint8_t *tx_begin(Endpoint dst, uint16_t src_port, size_t *room) override;
  void tx_end(size_t len, size_t seg) override;
  LocalPeers *local_peers() override { return this; }

 private:
  SimNetwork &net_;
  Endpoint local_;
  std::vector<std::vector<uint8_t>> held_;    // buffers handed out by recv()
  std::vector<uint8_t> tx_buf_;               // between tx_begin() and tx_end()
  Endpoint tx_dst_;
};

}  // namespace usrc::net
