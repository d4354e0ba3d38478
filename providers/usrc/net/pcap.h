// A Nic decorator that also writes every datagram it sends and receives to
// a pcap file (USRC_TRACE). Only wrapped around the NIC when tracing is on,
// so an untraced context pays nothing.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

// One pcap file per process, shared by its contexts: LINKTYPE_IPV4 records
// with a synthesized IPv4 and UDP header. The UDP destination port in the
// record is always 4791 (the RoCEv2 port), so Wireshark and tshark dissect
// the payload as RoCEv2 without a decode-as rule; the real ports differ
// (base + slot), and the ICRC in the payload covers the real ones.
class PcapWriter {
 public:
  // path: "%p" is replaced by the process id. nullptr (after a log line)
  // when the file cannot be created.
  static std::shared_ptr<PcapWriter> open(const std::string &path);
  ~PcapWriter();
  void write(Endpoint src, Endpoint dst, const iovec *iov, size_t iovcnt);

 private:
  explicit PcapWriter(FILE *f) : f_(f) {}
  std::mutex mu_;
  FILE *f_;
};

class PcapNic final : public Nic {
 public:
  PcapNic(std::unique_ptr<Nic> inner, std::shared_ptr<PcapWriter> w)
      : inner_(std::move(inner)), w_(std::move(w)) {}
  Endpoint local() const override { return inner_->local(); }
  int wait_fd() const override { return inner_->wait_fd(); }
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;

 private:
  std::unique_ptr<Nic> inner_;
  std::shared_ptr<PcapWriter> w_;
};

// The process's trace writer if USRC_TRACE names a file, else nullptr.
std::shared_ptr<PcapWriter> trace_writer();

}  // namespace usrc::net
