// A NIC decorator that writes every datagram sent and received to a pcap
// file (USRC_TRACE, or `usrc trace FILE -- CMD`), as IPv4/UDP packets with
// the real addresses and ports, so Wireshark's InfiniBand dissector reads
// them (decode the device's UDP ports as InfiniBand; README). Costs nothing
// when tracing is off: the decorator is not there.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

class TraceNic final : public Nic {
 public:
  // nullptr (and the inner NIC untouched) if the file cannot be created.
  static std::unique_ptr<Nic> wrap(std::unique_ptr<Nic> &inner, const std::string &path,
                                   std::string *err);
  ~TraceNic() override;

  Endpoint local() const override { return inner_->local(); }
  int wait_fd() const override { return inner_->wait_fd(); }
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;
  void add_peer(Endpoint e) override { inner_->add_peer(e); }
  bool same_host(Endpoint e) const override { return inner_->same_host(e); }
  uint32_t gso_segments() const override { return inner_->gso_segments(); }
  bool rx_pending() const override { return inner_->rx_pending(); }
  bool prepare_wait() override { return inner_->prepare_wait(); }
  void end_wait() override { inner_->end_wait(); }
  bool tx_blocked(Endpoint dst) override { return inner_->tx_blocked(dst); }
  bool tx_pending() const override { return inner_->tx_pending(); }
  // (Placed data is not a datagram: the trace shows the notice alone.)
  bool place(Endpoint dst, uint32_t tag, uint32_t my_tag, uint32_t key, uint64_t at,
             const iovec *iov, size_t iovcnt, size_t len) override {
    return inner_->place(dst, tag, my_tag, key, at, iov, iovcnt, len);
  }
  bool expose(uint32_t key, const Region &r) override { return inner_->expose(key, r); }
  void withdraw(uint32_t key) override { inner_->withdraw(key); }
  bool set_gate(uint32_t tag, const Gate &g) override { return inner_->set_gate(tag, g); }
  void owner_thread(bool start) override { inner_->owner_thread(start); }

 private:
  TraceNic(std::unique_ptr<Nic> inner, FILE *f) : inner_(std::move(inner)), f_(f) {}
  void record(Endpoint src, Endpoint dst, uint8_t tos, uint8_t ttl, uint16_t ip_id, const iovec *iov,
              size_t iovcnt);
  std::unique_ptr<Nic> inner_;
  FILE *f_;
};

// The trace file name for this process: "%p" in `pattern` becomes the pid.
std::string trace_path(const std::string &pattern);

}  // namespace usrc::net
