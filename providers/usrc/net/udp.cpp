#include "usrc/net/udp.h"

#include "usrc/common/guard.h"
#include "usrc/common/log.h"
#include "usrc/net/ipv4.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace usrc::net {

// The system calls themselves, not libc's wrappers: those are thread
// cancellation points, and a cancellation there would leave the engine
// locked (they also cost an eighth of an empty poll).
static int raw_recvmmsg(int fd, mmsghdr *m, size_t n, int flags) {
  return static_cast<int>(::syscall(SYS_recvmmsg, fd, m, n, flags, nullptr));
}
static int raw_sendmmsg(int fd, mmsghdr *m, size_t n, int flags) {
  return static_cast<int>(::syscall(SYS_sendmmsg, fd, m, n, flags));
}

std::unique_ptr<UdpNic> UdpNic::open(Endpoint local, uint32_t sock_buf, uint32_t rx_batch,
                                     uint32_t gso_segs, int *errno_out, std::string *err) {
  *errno_out = 0;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *errno_out = errno;
    *err = std::string("socket: ") + strerror(errno);
    return nullptr;
  }
  // DF set and no PMTU discovery games: unconnected + DF gives IP ID 0.
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  // Large buffers: a fast sender on loopback overflows a small receive
  // buffer.
  const uint32_t rcvbuf = size_socket_buffers(fd, sock_buf);
  sockaddr_in a = to_sockaddr(local);
  if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    *errno_out = errno;
    *err = std::string("bind: ") + strerror(errno);
    ::close(fd);
    return nullptr;
  }
  // UDP GSO (Linux 4.18) and GRO (5.0): probed, not assumed. At most 64
  // per send, the kernel's UDP_MAX_SEGMENTS before Linux 6.9.
  int zero = 0, one = 1;
  gso_segs = std::min<uint32_t>(gso_segs, 64);
  if (gso_segs > 1 && setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof zero) != 0) gso_segs = 1;
  const bool gro = gso_segs > 1 && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  std::unique_ptr<UdpNic> nic(
      new UdpNic(fd, local, rx_batch ? rx_batch : 32, std::max<uint32_t>(gso_segs, 1), gro));
  nic->rcvbuf_ = rcvbuf;
  return nic;
}

UdpNic::UdpNic(int fd, Endpoint local, uint32_t rx_batch, uint32_t gso_segs, bool gro)
    : fd_(fd), local_(local), gso_segs_(gso_segs), gro_(gro),
      rx_buf_(rx_batch * (gro ? kMaxGro : kMaxDatagram)), rx_msgs_(rx_batch), rx_iov_(rx_batch),
      rx_addr_(rx_batch), rx_cmsg_(rx_batch), rx_seg_(rx_batch), tx_msgs_(64), tx_addr_(64),
      tx_cmsg_(64) {
  const size_t each = gro ? kMaxGro : kMaxDatagram;
  for (uint32_t i = 0; i < rx_batch; i++) {
    rx_iov_[i] = {rx_buf_.data() + i * each, each};
    auto &h = rx_msgs_[i].msg_hdr;
    h.msg_iov = &rx_iov_[i];
    h.msg_iovlen = 1;
    h.msg_name = &rx_addr_[i];
    reset_rx_header(i);
  }
}

// The lengths recvmmsg overwrites in a header it fills.
void UdpNic::reset_rx_header(size_t i) {
  auto &h = rx_msgs_[i].msg_hdr;
  h.msg_namelen = sizeof(sockaddr_in);
  h.msg_control = gro_ ? rx_cmsg_[i].buf : nullptr;
  h.msg_controllen = gro_ ? sizeof rx_cmsg_[i].buf : 0;
}

UdpNic::~UdpNic() {
  for (auto &[port, fd] : src_fds_)
    if (fd != fd_ && (!roce_ || fd != roce_->fd())) ::close(fd);
  if (ep_ >= 0) ::close(ep_);
  roce_.reset();
  ::close(fd_);
}

bool UdpNic::join_roce(uint16_t port, uint16_t slot, const std::string &registry, uint32_t sock_buf,
                       std::string *err) {
  auto r = std::make_unique<RocePort>(local_.ip, port, slot, registry, sock_buf, err);
  if (r->fd() < 0) return false;
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event e{};
  e.events = EPOLLIN;
  if (ep < 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, fd_, &e) != 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, r->fd(), &e) != 0) {
    *err = std::string("epoll: ") + strerror(errno);
    if (ep >= 0) ::close(ep);
    return false;
  }
  if (gro_) {
    int one = 1;
    setsockopt(r->fd(), SOL_UDP, UDP_GRO, &one, sizeof one);
  }
  ep_ = ep;
  roce_ = std::move(r);
  return true;
}

// A send-only socket bound to local ip:port for packets with their own UDP
// source port (RoCE v2 flow-label entropy). SO_REUSEPORT lets processes
// share one; -1 (the packet then leaves from the main socket) if the port
// is taken otherwise.
int UdpNic::source_fd(uint16_t port) {
  if (port == 0 || port == local_.port) return fd_;
  // (From the RoCE port: its group's socket, never a new member.)
  if (roce_ && port == roce_->port()) return roce_->fd();
  for (auto &[p, fd] : src_fds_)
    if (p == port) return fd;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int one = 1, pmtu = IP_PMTUDISC_DO, b = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    sockaddr_in a = to_sockaddr({local_.ip, port});
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) fd = fd_;
  src_fds_.push_back({port, fd});
  return fd;
}

size_t UdpNic::send(std::span<const TxPacket> pkts) {
  size_t done = 0, dgrams = 0;
  while (done < pkts.size()) {
    // One sendmmsg per run of packets that leave from the same socket.
    const int fd = source_fd(pkts[done].src_port);
    size_t n = 0, staged = 0;
    while (n < tx_msgs_.size() && done + n < pkts.size() &&
           (n == 0 || pkts[done + n].src_port == pkts[done].src_port)) {
      const TxPacket &p = pkts[done + n];
      tx_addr_[n] = to_sockaddr(p.dst);
      auto &h = tx_msgs_[n].msg_hdr;
      h = {};
      h.msg_name = &tx_addr_[n];
      h.msg_namelen = sizeof(sockaddr_in);
      const bool gso = p.segs > 1 && p.gso_size;
      if (gso && p.iovcnt > 1 && stage(p, n, &staged)) {
        h.msg_iov = &tx_stage_iov_[n];
        h.msg_iovlen = 1;
      } else {
        h.msg_iov = const_cast<iovec *>(p.iov);
        h.msg_iovlen = p.iovcnt;
      }
      if (p.tos || p.ttl || gso) {
        // Per-packet TOS and TTL (IP_TOS / IP_TTL ancillary data) and the
        // GSO segment size (UDP_SEGMENT).
        h.msg_control = tx_cmsg_[n].buf;
        h.msg_controllen = sizeof tx_cmsg_[n].buf;
        cmsghdr *c = CMSG_FIRSTHDR(&h);
        size_t used = 0;
        for (auto [type, val] : {std::pair{IP_TOS, int(p.tos)}, std::pair{IP_TTL, int(p.ttl)}}) {
          if (!val) continue;
          c->cmsg_level = IPPROTO_IP;
          c->cmsg_type = type;
          c->cmsg_len = CMSG_LEN(sizeof(int));
          std::memcpy(CMSG_DATA(c), &val, sizeof val);
          used += CMSG_SPACE(sizeof(int));
          c = CMSG_NXTHDR(&h, c);
        }
        if (gso) {
          c->cmsg_level = SOL_UDP;
          c->cmsg_type = UDP_SEGMENT;
          c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
          std::memcpy(CMSG_DATA(c), &p.gso_size, sizeof p.gso_size);
          used += CMSG_SPACE(sizeof(uint16_t));
        }
        h.msg_controllen = used;
      }
      n++;
    }
    int r = raw_sendmmsg(fd, tx_msgs_.data(), n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (const TxPacket &p = pkts[done]; p.segs > 1 && (errno == EIO || errno == EINVAL || errno == EOPNOTSUPP) &&
          gso_segs_ > 1) {
        // The route's device cannot take GSO (no checksum offload, an MTU
        // below the segment): no more GSO. This send is dropped, not split
        // here: its ICRCs assume the IP IDs of a GSO send; the transport
        // resends the packets, built one datagram each.
        log().warn("UDP GSO refused ({}): sending datagram by datagram", strerror(errno));
        gso_segs_ = 1;
      }
      // An unreachable or refused peer must not stall the others: skip the
      // head packet; the transport's retransmission covers it. (A payload
      // the application unmapped: the kernel's copy faulted, the
      // transport's look at its sources finds it, as for a guarded copy.)
      if (errno == EFAULT) guard::note_fault();
      done++;
      continue;
    }
    for (int i = 0; i < r; i++) dgrams += pkts[done + i].segs;
    done += r;
  }
  return dgrams;
}

// Gathers p's pieces into tx_stage_ at *used (message n's one piece:
// tx_stage_iov_[n]). False where they do not fit or a piece cannot be read
// (the application unmapped its buffer): p then goes as its pieces, and
// the kernel's copy fails (EFAULT) as it would have.
bool UdpNic::stage(const TxPacket &p, size_t n, size_t *used) {
  if (!tx_stage_) {
    tx_stage_ = std::make_unique_for_overwrite<uint8_t[]>(kStageBytes);
    tx_stage_iov_.resize(tx_msgs_.size());
  }
  uint8_t *const base = tx_stage_.get() + *used;
  size_t len = 0;
  for (size_t i = 0; i < p.iovcnt; i++) {
    const iovec &v = p.iov[i];
    if (*used + len + v.iov_len > kStageBytes || !guard::copy(base + len, v.iov_base, v.iov_len)) return false;
    len += v.iov_len;
  }
  tx_stage_iov_[n] = {base, len};
  *used += len;
  return true;
}

int UdpNic::refill(int fd, size_t n) {
  int r = raw_recvmmsg(fd, rx_msgs_.data(), n, MSG_DONTWAIT);
  rx_want_ = r <= 0 ? 1 : size_t(r) == n ? 2 * n : size_t(r);
  rx_more_ = r > 1 && size_t(r) == n;
  return r;
}

bool UdpNic::look(bool roce) {
  uint32_t &e = empty_[roce];
  if (!roce_ || e < kIdleLooks) return true;
  return (e++ - kIdleLooks) % kIdleEvery == 0;
}

size_t UdpNic::recv(std::span<RxPacket> out) {
  if (rx_i_ == rx_n_) {
    // Everything handed out: the buffers may be reused. The headers are
    // ready (set up once, and restored below as soon as they are read), so
    // an empty poll, the common case when polling, touches none of them.
    // Ask for as many datagrams as the last call got, doubled when it got
    // all it asked for: recvmmsg stops only at an empty queue, and a lone
    // datagram (a ping-pong) then costs one receive, not two. A full
    // receive of more than one says a stream is on: more are likely
    // waiting (rx_pending()).
    // With the RoCE port joined, the two sockets take turns to go first,
    // and a quiet one is looked at now and then (look()).
    const size_t n = std::min({out.size(), rx_msgs_.size(), rx_want_});
    int r = 0;
    for (int k = 0; k < (roce_ ? 2 : 1) && r <= 0; k++) {
      const bool roce = (roce_ && next_roce_) != (k == 1);
      if (!look(roce)) continue;
      rx_roce_ = roce;
      r = refill(roce ? roce_->fd() : fd_, n);
      if (r > 0) empty_[roce] = 0;
      else if (empty_[roce] < kIdleLooks) empty_[roce]++;
    }
    next_roce_ = roce_ && !rx_roce_;
    if (r <= 0) return 0;
    for (int i = 0; i < r; i++) {
      rx_seg_[i] = 0;
      auto &h = rx_msgs_[i].msg_hdr;
      for (cmsghdr *c = gro_ ? CMSG_FIRSTHDR(&h) : nullptr; c; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int seg;
          std::memcpy(&seg, CMSG_DATA(c), sizeof seg);
          rx_seg_[i] = static_cast<uint16_t>(seg);
        }
      reset_rx_header(i);
    }
    rx_n_ = r;
    rx_i_ = rx_off_ = 0;
  }
  // Hand out datagrams, splitting the coalesced ones at their segment size.
  size_t k = 0;
  while (k < out.size() && rx_i_ < rx_n_) {
    const sockaddr_in &a = rx_addr_[rx_i_];
    const size_t len = rx_msgs_[rx_i_].msg_len;
    const size_t take = rx_seg_[rx_i_] ? std::min<size_t>(rx_seg_[rx_i_], len - rx_off_) : len;
    out[k++] = {{ntohl(a.sin_addr.s_addr), ntohs(a.sin_port)},
                static_cast<const uint8_t *>(rx_iov_[rx_i_].iov_base) + rx_off_, take, false,
                rx_roce_ ? roce_->port() : uint16_t(0)};
    rx_off_ += take;
    if (rx_off_ >= len) rx_i_++, rx_off_ = 0;
  }
  return k;
}

}  // namespace usrc::net
