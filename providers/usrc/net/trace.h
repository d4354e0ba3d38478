// A NIC decorator that writes every datagram sent and received to a pcap
// file (USRC_TRACE, or `usrc trace FILE -- CMD`), as IPv4/UDP packets with
// the real addresses and ports, so Wireshark's InfiniBand dissector reads
// them (decode the device's UDP ports as InfiniBand; README), datagrams
// built in place in a peer's ring (net::LocalPeers) among them. Costs nothing
// when tracing is off: the decorator is not there.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

class TraceNic final : public NicDecorator {
 public:
  // nullptr (and the inner NIC untouched) if the file cannot be created.
  static std::unique_ptr<Nic> wrap(std::unique_ptr<Nic> &inner, const std::string &path,
                                   std::string *err);
  ~TraceNic() override;

  // Every other call, and every one of the inner NIC's same-host short
  // cuts, goes on unchanged (NicDecorator, LocalPeersDecorator): tracing
  // does not change the path the packets take.
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;
  LocalPeers *local_peers() override { return peers_ ? &*peers_ : nullptr; }

 private:
  // The inner NIC's LocalPeers, recording the datagrams built in place as
  // they are handed on. (Placed data is not a datagram: the trace shows
  // the notice that follows it, sent as usual.)
  class Peers final : public LocalPeersDecorator {
   public:
    Peers(LocalPeers &inner, TraceNic &t) : LocalPeersDecorator(inner), t_(t) {}
    uint8_t *tx_begin(Endpoint dst, uint16_t src_port, size_t *room) override;
    void tx_end(size_t len, size_t seg) override;

   private:
    TraceNic &t_;
    uint8_t *buf_ = nullptr;   // between tx_begin() and tx_end()
    Endpoint dst_;
    uint16_t src_port_ = 0;
  };
  TraceNic(std::unique_ptr<Nic> inner, FILE *f);
  void record(Endpoint src, Endpoint dst, uint8_t tos, uint8_t ttl, uint16_t ip_id, const iovec *iov,
              size_t iovcnt);
  FILE *f_;
  std::optional<Peers> peers_;
};

// Records a datagram sent or received outside the devices' NICs (the CM's
// MADs to and from QP1, docs/cm.md) in this process's trace file, if
// USRC_TRACE names one: the file the devices' NICs write.
void trace_datagram(Endpoint src, Endpoint dst, const uint8_t *p, size_t n);

// The trace file name for this process: "%p" in `pattern` becomes the pid.
std::string trace_path(const std::string &pattern);

}  // namespace usrc::net
