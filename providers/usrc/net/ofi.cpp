#include "usrc/net/ofi.h"

#include "usrc/common/guard.h"
#include "usrc/net/ipv4.h"

#include <arpa/inet.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace usrc::net {

namespace {

uint64_t key(Endpoint e) { return uint64_t(e.ip) << 16 | e.port; }

int socket_family(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  return getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len) == 0 ? sa.ss_family : -1;
}

// The provider's datagram socket, if the wait fd is libfabric's epoll set of
// it and the wait's signal (util_wait_fd; the signal is an AF_UNIX pair);
// -1 if the set holds anything else. The members are the "tfd:" lines of
// the set's /proc/self/fdinfo entry.
int provider_socket(int epfd, Endpoint local) {
  char path[48];
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epfd);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  int sock = -1, socks = 0, others = 0;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    int fd;
    if (sscanf(line, "tfd: %d", &fd) != 1) continue;
    int type = 0;
    socklen_t tl = sizeof type;
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_DGRAM &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len) == 0 && sa.sin_family == AF_INET &&
        ntohs(sa.sin_port) == local.port) {
      sock = fd;
      socks++;
    } else if (socket_family(fd) != AF_UNIX) {
      others++;
    }
  }
  fclose(f);
  return socks == 1 && others == 0 ? sock : -1;
}

class OfiNic final : public Nic {
 public:
  ~OfiNic() override {
    // Endpoint first: it references the CQ and AV.
    for (fid *f : {ep_ ? &ep_->fid : nullptr, cq_ ? &cq_->fid : nullptr,
                   tx_cq_ ? &tx_cq_->fid : nullptr, av_ ? &av_->fid : nullptr, mr_ ? &mr_->fid : nullptr,
                   domain_ ? &domain_->fid : nullptr, fabric_ ? &fabric_->fid : nullptr})
      if (f) fi_close(f);
    if (info_) fi_freeinfo(info_);
  }

  Endpoint local() const override { return local_; }
  // The progress thread takes a readable fd for datagrams waiting. The
  // receive CQ's wait fd (libfabric's util_wait_fd: an epoll set of the
  // provider's sockets and a signal) turns readable when a datagram
  // reaches a socket, and also when the provider writes a completion, as
  // it does for every datagram it reads (inside fi_cq_read or fi_trywait),
  // until fi_trywait resets it. So the thread polls the provider's socket
  // itself where the set shows it (udp): readable exactly while datagrams
  // wait, at no cost. Otherwise, the wait fd, which recv() re-arms after
  // every read that took completions (a signal reset and a provider
  // progress, system calls each).
  int wait_fd() const override { return sock_fd_ >= 0 ? sock_fd_ : wait_fd_; }
  bool arm_wait() override { return sock_fd_ >= 0 || wait_fd_ < 0 || try_wait(); }
  // Completions read off the CQ and not yet handed out (recv()'s caller
  // took fewer than were there): the wait fd does not show them.
  bool rx_held() const override { return !ready_.empty(); }
  bool rx_pending() const override { return rx_held(); }

  void add_peer(Endpoint e) override { (void)lookup(e); }
  LocalPeers *local_peers() override { return nullptr; }

  size_t send(std::span<const TxPacket> pkts) override {
    size_t sent = 0;
    for (const TxPacket &p : pkts) {
      if (free_tx_.empty()) reap_tx();
      if (free_tx_.empty()) break;   // NIC full: the transport retransmits
      fi_addr_t to = lookup(p.dst);
      if (to == FI_ADDR_NOTAVAIL) continue;
      uint32_t s = free_tx_.back();
      uint8_t *b = slot(s), *w = b + prefix_;
      size_t len = 0;
      bool faulted = false;
      for (size_t i = 0; i < p.iovcnt && len + p.iov[i].iov_len <= max_payload_ && !faulted; i++) {
        faulted = !guard::copy(w + len, p.iov[i].iov_base, p.iov[i].iov_len);
        len += p.iov[i].iov_len;
      }
      // A payload the application unmapped: skipped, as the kernel's EFAULT
      // is on the udp backend; the transport's look at its sources finds it.
      if (faulted) continue;
      ssize_t r;
      for (int tries = 0; (r = fi_send(ep_, b, prefix_ + len, desc_, to, &ctx_[s])) == -FI_EAGAIN &&
                          tries < 16;
           tries++)
        reap_tx();   // (providers that progress sends in the CQ read)
      if (r != 0) continue;
      free_tx_.pop_back();
      sent++;
    }
    return sent;
  }

  size_t recv(std::span<RxPacket> out) override {
    // The packets handed out last time are consumed now: post their buffers again.
    for (uint32_t s : handed_out_) post_rx(s);
    handed_out_.clear();
    // (Those left over from the last drain first, on their own: see rx_held().)
    if (ready_.empty()) drain_cq(out.size());
    size_t n = std::min(out.size(), ready_.size());
    for (size_t i = 0; i < n; i++) {
      const Ready &r = ready_[i];
      out[i] = {r.src, slot(r.slot) + prefix_, r.len};
      handed_out_.push_back(r.slot);
    }
    ready_.erase(ready_.begin(), ready_.begin() + n);
    return n;
  }

  // Builds the endpoint; see open_ofi_nic.
  int init(Endpoint local, const std::string &prov, uint32_t rx_batch, uint32_t sock_buf, std::string *err) {
    local_ = local;
    fi_info *hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_DGRAM;
    hints->caps = FI_MSG | FI_SOURCE;
    hints->mode = FI_CONTEXT | FI_MSG_PREFIX;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov.empty() ? "udp" : prov.c_str());
    char node[INET_ADDRSTRLEN], service[8];
    in_addr a{htonl(local.ip)};
    inet_ntop(AF_INET, &a, node, sizeof node);
    snprintf(service, sizeof service, "%u", local.port);
    int r = fi_getinfo(FI_VERSION(1, 9), node, service, FI_SOURCE, hints, &info_);
    fi_freeinfo(hints);
    auto fail = [&](const char *what, int rc) {
      *err = std::string(what) + ": " + fi_strerror(-rc);
      return rc;
    };
    if (r) return fail("fi_getinfo (provider with FI_EP_DGRAM, FI_MSG, FI_SOURCE)", r);
    prefix_ = (info_->mode & FI_MSG_PREFIX) ? info_->ep_attr->msg_prefix_size : 0;
    max_payload_ = std::min<size_t>(info_->ep_attr->max_msg_size, kMaxDatagram);
    if ((r = fi_fabric(info_->fabric_attr, &fabric_, nullptr))) return fail("fi_fabric", r);
    if ((r = fi_domain(fabric_, info_, &domain_, nullptr))) return fail("fi_domain", r);

    nrx_ = std::max<uint32_t>(4 * rx_batch, 256);
    ntx_ = 256;
    slot_size_ = (prefix_ + max_payload_ + 63) & ~size_t(63);
    buf_.resize(slot_size_ * (nrx_ + ntx_));
    ctx_.resize(nrx_ + ntx_);
    if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
      if ((r = fi_mr_reg(domain_, buf_.data(), buf_.size(), FI_SEND | FI_RECV, 0, 0, 0, &mr_,
                         nullptr)))
        return fail("fi_mr_reg", r);
      desc_ = fi_mr_desc(mr_);
    }
    fi_av_attr av_attr{};
    if ((r = fi_av_open(domain_, &av_attr, &av_, nullptr))) return fail("fi_av_open", r);
    // A receive CQ with a wait fd lets the progress thread sleep in poll;
    // providers without one are polled on a short period (progress.cpp).
    // Sends complete on a CQ of their own without one: a send is no
    // arrival, and should not make the wait fd readable (see wait_fd()).
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_MSG;
    cq_attr.size = ntx_;
    if ((r = fi_cq_open(domain_, &cq_attr, &tx_cq_, nullptr))) return fail("fi_cq_open (send)", r);
    cq_attr.size = nrx_;
    cq_attr.wait_obj = FI_WAIT_FD;
    if (fi_cq_open(domain_, &cq_attr, &cq_, nullptr) == 0) {
      if (fi_control(&cq_->fid, FI_GETWAIT, &wait_fd_) != 0) wait_fd_ = -1;
    } else {
      cq_attr.wait_obj = FI_WAIT_NONE;
      if ((r = fi_cq_open(domain_, &cq_attr, &cq_, nullptr))) return fail("fi_cq_open", r);
    }
    if ((r = fi_endpoint(domain_, info_, &ep_, nullptr))) return fail("fi_endpoint", r);
    if ((r = fi_ep_bind(ep_, &av_->fid, 0))) return fail("fi_ep_bind av", r);
    if ((r = fi_ep_bind(ep_, &cq_->fid, FI_RECV))) return fail("fi_ep_bind cq", r);
    if ((r = fi_ep_bind(ep_, &tx_cq_->fid, FI_TRANSMIT))) return fail("fi_ep_bind send cq", r);
    if ((r = fi_enable(ep_))) return fail("fi_enable", r);
    // (The endpoint's socket joins the set when bound to the CQ.)
    if (wait_fd_ >= 0) sock_fd_ = provider_socket(wait_fd_, local);
    // The provider leaves the socket's buffers at the system's default
    // (net.core.rmem_default, about 200 KB): some 90 datagrams of 1 KB,
    // fewer than two peers' send windows (64 packets each, backend.cpp).
    // A burst beyond it was dropped, each drop costing its sender a
    // timeout and its window. Sized as the udp backend's socket.
    if (sock_fd_ >= 0 && sock_buf) (void)size_socket_buffers(sock_fd_, sock_buf);
    for (uint32_t s = 0; s < nrx_; s++) post_rx(s);
    for (uint32_t s = nrx_; s < nrx_ + ntx_; s++) free_tx_.push_back(s);
    return 0;
  }
  size_t max_payload() const { return max_payload_; }

 private:
  static constexpr size_t kMaxDatagram = 4096 + 128;
  struct Ready {
    uint32_t slot;
    Endpoint src;
    size_t len;
  };

  uint8_t *slot(uint32_t s) { return buf_.data() + size_t(s) * slot_size_; }
  uint32_t slot_of(void *op_context) {
    return static_cast<uint32_t>(static_cast<fi_context *>(op_context) - ctx_.data());
  }
  void post_rx(uint32_t s) {
    // A full receive queue only means fewer buffers; nothing is lost but capacity.
    (void)fi_recv(ep_, slot(s), prefix_ + max_payload_, desc_, FI_ADDR_UNSPEC, &ctx_[s]);
  }

  fi_addr_t lookup(Endpoint e) {
    auto it = addr_.find(key(e));
    if (it != addr_.end()) return it->second;
    sockaddr_in sa = to_sockaddr(e);
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    if (fi_av_insert(av_, &sa, 1, &fa, 0, nullptr) != 1) return FI_ADDR_NOTAVAIL;
    addr_[key(e)] = fa;
    peer_[fa] = e;
    return fa;
  }

  bool try_wait() {
    fid *f = &cq_->fid;
    return fi_trywait(fabric_, &f, 1) == FI_SUCCESS;
  }

  // Finished sends free their slot (an error too: the transport retransmits).
  void reap_tx() {
    fi_cq_msg_entry ent[64];
    for (;;) {
      ssize_t n = fi_cq_read(tx_cq_, ent, 64);
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry e{};
        if (fi_cq_readerr(tx_cq_, &e, 0) == 1 && e.op_context) free_tx_.push_back(slot_of(e.op_context));
        continue;
      }
      if (n <= 0) return;
      for (ssize_t i = 0; i < n; i++) free_tx_.push_back(slot_of(ent[i].op_context));
    }
  }

  // Reads receive completions until the CQ is empty, their sources mapped
  // back from the AV; then re-arms the wait fd if it is the one polled (see wait_fd()). Each read
  // lets a provider that progresses in it (udp: one datagram a read) take
  // in more: at most want + 1 reads, and none once want wait in ready_
  // (the fd shows the rest).
  void drain_cq(size_t want) {
    fi_cq_msg_entry ent[64];
    fi_addr_t src[64];
    bool took = false;
    for (size_t reads = 0;; reads++) {
      if (reads > want || ready_.size() >= want) return;
      ssize_t n = fi_cq_readfrom(cq_, ent, 64, src);
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry e{};
        if (fi_cq_readerr(cq_, &e, 0) == 1 && e.op_context) post_rx(slot_of(e.op_context));
        took = true;
        continue;
      }
      if (n <= 0) break;
      took = true;
      for (ssize_t i = 0; i < n; i++) {
        uint32_t s = slot_of(ent[i].op_context);
        auto it = peer_.find(src[i]);
        if (it == peer_.end() || ent[i].len < prefix_) {
          post_rx(s);   // an unknown sender: no QP of ours expects it
          continue;
        }
        ready_.push_back({s, it->second, ent[i].len - prefix_});
      }
    }
    // (Refused: a datagram came in meanwhile; the fd shows it.)
    if (took && sock_fd_ < 0 && wait_fd_ >= 0) (void)try_wait();
  }

  Endpoint local_;
  fi_info *info_ = nullptr;
  fid_fabric *fabric_ = nullptr;
  fid_domain *domain_ = nullptr;
  fid_av *av_ = nullptr;
  fid_cq *cq_ = nullptr, *tx_cq_ = nullptr;
  fid_ep *ep_ = nullptr;
  fid_mr *mr_ = nullptr;
  void *desc_ = nullptr;
  int wait_fd_ = -1;
  int sock_fd_ = -1;   // the provider's socket (see wait_fd()), or -1
  size_t prefix_ = 0, max_payload_ = 0, slot_size_ = 0;
  uint32_t nrx_ = 0, ntx_ = 0;
  std::vector<uint8_t> buf_;
  std::vector<fi_context> ctx_;          // one per buffer slot: op_context names the slot
  std::vector<uint32_t> free_tx_, handed_out_;
  std::vector<Ready> ready_;
  std::unordered_map<uint64_t, fi_addr_t> addr_;
  std::unordered_map<fi_addr_t, Endpoint> peer_;
};

}  // namespace

std::unique_ptr<Nic> open_ofi_nic(Endpoint local, const std::string &prov, uint32_t rx_batch,
                                  uint32_t sock_buf, size_t *max_payload, int *errno_out, std::string *err) {
  // libfabric's verbs provider opens every verbs device while fi_getinfo
  // holds libfabric's init lock, usrc devices included: that nested open
  // would call fi_getinfo again and deadlock. Refuse it; verbs skips us.
  static thread_local bool in_getinfo = false;
  if (in_getinfo) {
    *errno_out = EBUSY;
    err->clear();   // quietly: libfabric probes every device this way
    return nullptr;
  }
  auto nic = std::make_unique<OfiNic>();
  in_getinfo = true;
  int r = nic->init(local, prov, rx_batch ? rx_batch : 32, sock_buf, err);
  in_getinfo = false;
  *errno_out = r < 0 ? -r : 0;
  if (r) return nullptr;
  *max_payload = nic->max_payload();
  return nic;
}

}  // namespace usrc::net
