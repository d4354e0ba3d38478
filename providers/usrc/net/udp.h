// Kernel UDP sockets: the portable backend. One unconnected socket per
// context, bound to the device address and the process's slot port, with DF
// set so that the kernel sends IP ID 0 (the RoCEv2 ICRC covers the IP ID).
// Where the kernel offers it, runs of datagrams leave as one UDP GSO send
// (segment i gets IP ID i) and arrive coalesced by UDP GRO, split here.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "usrc/net/nic.h"
#include "usrc/net/roce_port.h"

namespace usrc::net {

class UdpNic final : public Nic {
 public:
  // Binds ip:port. Returns nullptr with *err set (errno text) on failure;
  // *errno_out is the bind errno (EADDRINUSE lets the caller try another port).
  // gso_segs: the most datagrams per GSO send (0 or 1: no GSO, no GRO).
  static std::unique_ptr<UdpNic> open(Endpoint local, uint32_t sock_buf, uint32_t rx_batch,
                                      uint32_t gso_segs, int *errno_out, std::string *err);
  // Also receive at the RoCE v2 port shared by the address's contexts
  // (roce_port.h); false (and *err) if it cannot be had.
  bool join_roce(uint16_t port, uint16_t slot, const std::string &registry, uint32_t sock_buf,
                 std::string *err);
  ~UdpNic() override;

  Endpoint local() const override { return local_; }
  // Both sockets behind one epoll set once the RoCE port is joined.
  int wait_fd() const override { return ep_ >= 0 ? ep_ : fd_; }
  int bound_fd() const override { return fd_; }
  size_t send(std::span<const TxPacket> pkts) override;
  size_t recv(std::span<RxPacket> out) override;
  uint32_t gso_segments() const override { return gso_segs_; }
  bool rx_pending() const override { return rx_held() || rx_more_; }
  bool rx_held() const override { return rx_i_ < rx_n_; }
  bool udp_checksummed() const override { return true; }
  void end_wait() override { empty_[0] = empty_[1] = 0; }
  LocalPeers *local_peers() override { return nullptr; }
  uint32_t rcvbuf() const { return rcvbuf_; }

 private:
  UdpNic(int fd, Endpoint local, uint32_t rx_batch, uint32_t gso_segs, bool gro);
  int fd_;
  Endpoint local_;
  std::unique_ptr<RocePort> roce_;
  int ep_ = -1;
  bool rx_roce_ = false;   // the datagrams being handed out came from roce_
  bool next_roce_ = false; // the next empty-queue refill tries roce_ first
  // Per socket (1: roce_'s), the empty looks in a row. Of the two, one is
  // usually quiet (peers on this host send to ours, peers on others to the
  // RoCE port), and an empty poll would cost two recvmmsg: a socket empty
  // for kIdleLooks looks is looked at every kIdleEvery-th time only, until
  // it has datagrams again or a wait wakes (end_wait: both looked at).
  static constexpr uint32_t kIdleLooks = 1024, kIdleEvery = 16;
  uint32_t empty_[2] = {0, 0};
  bool look(bool roce);
  int refill(int fd, size_t n);
  uint32_t rcvbuf_ = 0;
  uint32_t gso_segs_ = 1;
  bool gro_ = false;
  static constexpr size_t kMaxDatagram = 4096 + 128, kMaxGro = 65536;
  std::vector<uint8_t> rx_buf_;
  std::vector<struct mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<struct sockaddr_in> rx_addr_;
  struct Cmsg {
    alignas(cmsghdr) uint8_t buf[3 * CMSG_SPACE(sizeof(int))];
  };
  std::vector<Cmsg> rx_cmsg_;
  // What the last recvmmsg returned and is still being handed out.
  std::vector<uint16_t> rx_seg_;   // per datagram: its GRO segment size, 0 if none
  size_t rx_n_ = 0, rx_i_ = 0, rx_off_ = 0;
  size_t rx_want_ = 1;   // datagrams the next recvmmsg asks for
  bool rx_more_ = false; // the last recvmmsg got all of several it asked for
  void reset_rx_header(size_t i);
  std::vector<struct mmsghdr> tx_msgs_;
  std::vector<struct sockaddr_in> tx_addr_;
  std::vector<Cmsg> tx_cmsg_;
  // Each GSO send's pieces (every packet's headers, payload and trailer)
  // gathered into one piece: the kernel copies a send piece by piece, at a
  // cost per piece above that of a copy here (a GSO send of 60 packets of
  // 1 KB across a veth: 21-29 us from 180 pieces, 12-17 us gathered first).
  // One sendmmsg's sends lie one after the other in tx_stage_, which holds
  // an engine's transmit batch of the largest packets (allocated at the
  // first GSO send); a send that does not fit goes as its pieces.
  static constexpr size_t kStageBytes = 64 * kMaxDatagram;
  std::unique_ptr<uint8_t[]> tx_stage_;
  std::vector<iovec> tx_stage_iov_;
  bool stage(const TxPacket &p, size_t n, size_t *used);
  std::vector<std::pair<uint16_t, int>> src_fds_;   // source port -> socket
  int source_fd(uint16_t port);
};

}  // namespace usrc::net
