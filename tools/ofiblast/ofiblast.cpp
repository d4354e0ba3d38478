// ofiblast: the floor of a libfabric datagram provider (FI_EP_DGRAM, FI_MSG)
// on one path, next to which the benchmark puts usrc's `ofi` NIC backend;
// the command line and output follow udpblast's, so one parser reads both.
//
//   ofiblast -s [-b ADDR] [-p PORT] [-f PROVIDER] [-t SECONDS]      receive
//   ofiblast -c HOST [-p PORT] [-f PROVIDER] [-m SIZE] [-t SECONDS]  send
//   ofiblast -i [-b ADDR] [-p PORT] [-f PROVIDER]       the provider's limits
//
// The provider is libfabric's `udp` unless -f names another. The server's
// endpoint is bound to ADDR:PORT (0.0.0.0 unless -b) through the hints'
// source address; the client puts HOST:PORT in its address vector, so
// nothing is exchanged out of band. The sender keeps as many sends posted
// as the provider's transmit queue holds, reaping their completions (and
// progressing the provider on -FI_EAGAIN), for SECONDS; it prints
//   ofiblast tx bytes=B msgs=N secs=S gbps=G mpps=M errors=E size=S depth=D
// Datagrams may be lost: the receiver, which keeps up to 1024 buffers
// posted, reports what arrived. It stops 0.5 s after traffic stops (or after
// SECONDS + 5 with no traffic at all) and prints
//   ofiblast rx bytes=B msgs=N secs=S gbps=G mpps=M
// SIZE (default: the largest) is clamped to the provider's max_msg_size,
// and to 64 KiB.
//
// With -P, a ping-pong instead, both sides busy-polling their completion
// queues: the client first sends its own endpoint name (a datagram starting
// with "OFIBLAST") until the server, which puts it in its address vector,
// answers; then it sends SIZE bytes (the first 8 a sequence number when
// SIZE >= 8), waits for the echo (a second at most: datagrams get lost)
// and, after SECONDS, prints the median half round trip past the warm-up
// (the first 1000 round trips, or the first tenth of SECONDS)
//   ofiblast pingpong size=S n=N median_us=M min_us=M
// The server echoes to the client that greeted it last.
//
// -i prints what the provider offers the server's endpoint
//   ofiblast info provider=P fabric=F domain=D max_msg_size=N inject_size=N
//     tx_size=N rx_size=N msg_prefix_size=N
//
// Exit status: 0; 1 on a libfabric or usage error; 2 when nothing arrived
// (receiver) or nothing was sent or echoed (client); 3 when the provider
// offers no FI_EP_DGRAM endpoint with FI_MSG and IPv4 addresses here.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxSize = 65536;             // buffers are never larger
constexpr size_t kMaxQueue = 1024;             // posted buffers per queue
constexpr size_t kMaxMemory = 64 << 20;        // all buffers together
constexpr size_t kBatch = 64;                  // completions per read
constexpr char kMagic[8] = {'O', 'F', 'I', 'B', 'L', 'A', 'S', 'T'};
constexpr int kExitUnavailable = 3;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

struct Options {
  const char *host = nullptr;
  const char *bind = "0.0.0.0";
  const char *prov = "udp";
  int port = 19998;
  size_t size = 0;   // 0: the provider's largest
  double secs = 2;
  bool server = false, pingpong = false, info = false;
};

// A libfabric call that failed: the message, and the exit status to return.
int fail(const char *what, long rc) {
  fprintf(stderr, "ofiblast: %s: %s\n", what, fi_strerror(static_cast<int>(-rc)));
  return 1;
}

bool resolve(const char *host, int port, sockaddr_in *out) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  std::string service = std::to_string(port);
  int r = getaddrinfo(host, service.c_str(), &hints, &res);
  if (r != 0) {
    fprintf(stderr, "ofiblast: %s: %s\n", host, gai_strerror(r));
    return false;
  }
  memcpy(out, res->ai_addr, sizeof *out);
  freeaddrinfo(res);
  return true;
}

// One FI_EP_DGRAM endpoint with a completion queue per direction, an
// address vector and its buffers: `slots` slots of one message each (the
// provider's prefix, then the payload). Every slot has two operation
// contexts, one for a receive into it and one for a send from it, so a
// completion's op_context names the slot and the direction.
class Endpoint {
 public:
  ~Endpoint() {
    // The endpoint first: it refers to the CQs and the AV.
    for (fid *f : {ep_ ? &ep_->fid : nullptr, tx_cq_ ? &tx_cq_->fid : nullptr,
                   rx_cq_ ? &rx_cq_->fid : nullptr, av_ ? &av_->fid : nullptr,
                   mr_ ? &mr_->fid : nullptr, domain_ ? &domain_->fid : nullptr,
                   fabric_ ? &fabric_->fid : nullptr})
      if (f) fi_close(f);
    if (info_) fi_freeinfo(info_);
  }

  // Finds the provider's datagram endpoint: bound to `src` (server) or
  // routed towards `dst` (client). Returns 0, or the exit status after
  // printing why not.
  int find(const char *prov, const sockaddr_in *src, const sockaddr_in *dst) {
    fi_info *hints = fi_allocinfo();
    if (!hints) return fail("fi_allocinfo", -FI_ENOMEM);
    hints->ep_attr->type = FI_EP_DGRAM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_MSG_PREFIX;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov);
    // fi_freeinfo frees the addresses with the hints.
    if (src) {
      hints->src_addr = malloc(sizeof *src);
      memcpy(hints->src_addr, src, sizeof *src);
      hints->src_addrlen = sizeof *src;
    }
    if (dst) {
      hints->dest_addr = malloc(sizeof *dst);
      memcpy(hints->dest_addr, dst, sizeof *dst);
      hints->dest_addrlen = sizeof *dst;
    }
    int r = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &info_);
    fi_freeinfo(hints);
    if (r == -FI_ENODATA) {
      fprintf(stderr, "ofiblast: provider %s offers no FI_EP_DGRAM endpoint with FI_MSG here (%s)\n", prov,
              fi_strerror(-r));
      return kExitUnavailable;
    }
    if (r) return fail("fi_getinfo", r);
    if (info_->addr_format != FI_SOCKADDR_IN) {
      fprintf(stderr, "ofiblast: provider %s does not take FI_SOCKADDR_IN addresses\n", prov);
      return kExitUnavailable;
    }
    // The endpoint is bound where asked: for the any-address, libfabric's
    // IP providers (1.17) answer 0.0.0.0 with the port dropped.
    if (src) {
      free(info_->src_addr);
      info_->src_addr = malloc(sizeof *src);
      memcpy(info_->src_addr, src, sizeof *src);
      info_->src_addrlen = sizeof *src;
    }
    // The destination only chose the source address: the endpoint sends to
    // whatever the AV names, and is not tied (connected) to one peer.
    free(info_->dest_addr);
    info_->dest_addr = nullptr;
    info_->dest_addrlen = 0;
    prefix_ = (info_->mode & FI_MSG_PREFIX) ? info_->ep_attr->msg_prefix_size : 0;
    max_size_ = std::min<size_t>(info_->ep_attr->max_msg_size, kMaxSize);
    if (max_size_ == 0) {
      fprintf(stderr, "ofiblast: provider %s reports max_msg_size 0\n", info_->fabric_attr->prov_name);
      return 1;
    }
    return 0;
  }

  // Opens everything, with `slots` buffers of `size` bytes of payload.
  int open(size_t slots, size_t size) {
    int r;
    if ((r = fi_fabric(info_->fabric_attr, &fabric_, nullptr))) return fail("fi_fabric", r);
    if ((r = fi_domain(fabric_, info_, &domain_, nullptr))) return fail("fi_domain", r);
    slots_ = slots;
    slot_size_ = (prefix_ + size + 63) & ~size_t(63);
    buf_.assign(slot_size_ * slots_, 'o');
    ctx_.resize(2 * slots_);
    if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
      if ((r = fi_mr_reg(domain_, buf_.data(), buf_.size(), FI_SEND | FI_RECV, 0, 0, 0, &mr_, nullptr)))
        return fail("fi_mr_reg", r);
      desc_ = fi_mr_desc(mr_);
    }
    fi_av_attr av_attr{};
    av_attr.type = info_->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info_->domain_attr->av_type;
    if ((r = fi_av_open(domain_, &av_attr, &av_, nullptr))) return fail("fi_av_open", r);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_MSG;
    cq_attr.wait_obj = FI_WAIT_NONE;   // both sides busy-poll
    cq_attr.size = std::max<size_t>(slots_, 64);
    if ((r = fi_cq_open(domain_, &cq_attr, &tx_cq_, nullptr))) return fail("fi_cq_open (send)", r);
    if ((r = fi_cq_open(domain_, &cq_attr, &rx_cq_, nullptr))) return fail("fi_cq_open (receive)", r);
    if ((r = fi_endpoint(domain_, info_, &ep_, nullptr))) return fail("fi_endpoint", r);
    if ((r = fi_ep_bind(ep_, &av_->fid, 0))) return fail("fi_ep_bind (AV)", r);
    if ((r = fi_ep_bind(ep_, &tx_cq_->fid, FI_TRANSMIT))) return fail("fi_ep_bind (send CQ)", r);
    if ((r = fi_ep_bind(ep_, &rx_cq_->fid, FI_RECV))) return fail("fi_ep_bind (receive CQ)", r);
    if ((r = fi_enable(ep_))) return fail("fi_enable", r);
    return 0;
  }

  const fi_info *info() const { return info_; }
  size_t max_size() const { return max_size_; }
  size_t slots() const { return slots_; }
  size_t tx_depth() const { return std::min<size_t>(std::max<size_t>(info_->tx_attr->size, 1), kMaxQueue); }
  size_t rx_depth() const { return std::min<size_t>(std::max<size_t>(info_->rx_attr->size, 1), kMaxQueue); }
  // How many slots of `size` bytes fit the memory budget, at most `want`.
  size_t fit(size_t want, size_t size) const {
    return std::max<size_t>(1, std::min(want, kMaxMemory / (prefix_ + size + 64)));
  }

  uint8_t *payload(size_t s) { return buf_.data() + s * slot_size_ + prefix_; }

  // Posts a receive into slot s: 0 or a negative libfabric error.
  ssize_t post_recv(size_t s) {
    return fi_recv(ep_, buf_.data() + s * slot_size_, slot_size_, desc_, FI_ADDR_UNSPEC, &ctx_[s]);
  }
  // Sends `len` bytes of payload from slot s to `to`.
  ssize_t post_send(size_t s, size_t len, fi_addr_t to) {
    return fi_send(ep_, buf_.data() + s * slot_size_, prefix_ + len, desc_, to, &ctx_[slots_ + s]);
  }

  // A completion: the slot, the payload length, and the error (0, or a
  // positive libfabric errno) of a failed operation.
  struct Done {
    size_t slot;
    size_t len;
    int err;
  };
  // Reads up to kBatch completions of one queue into `out`: how many, or a
  // negative libfabric error (not -FI_EAGAIN: an empty queue gives 0).
  ssize_t poll(bool rx, Done *out) {
    fid_cq *cq = rx ? rx_cq_ : tx_cq_;
    fi_cq_msg_entry ent[kBatch];
    ssize_t n = fi_cq_read(cq, ent, kBatch);
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e{};
      n = fi_cq_readerr(cq, &e, 0);
      if (n == -FI_EAGAIN) return 0;
      if (n != 1) return n < 0 ? n : -FI_EOTHER;
      size_t i = index(e.op_context);
      if (i == kNoSlot) return -FI_EOTHER;
      int err = e.err ? e.err : FI_EOTHER;
      if (!last_error_[0])
        snprintf(last_error_, sizeof last_error_, "%s (%s)", fi_strerror(err),
                 fi_cq_strerror(cq, e.prov_errno, e.err_data, nullptr, 0));
      out[0] = {i % slots_, 0, err};
      return 1;
    }
    if (n < 0) return n;
    for (ssize_t k = 0; k < n; k++) {
      size_t i = index(ent[k].op_context);
      if (i == kNoSlot) return -FI_EOTHER;
      out[k] = {i % slots_, i < slots_ && ent[k].len >= prefix_ ? ent[k].len - prefix_ : 0, 0};
    }
    return n;
  }
  const char *last_error() const { return last_error_; }
  // Keeps the first failure's message for the summary.
  void note(long rc) {
    if (!last_error_[0]) snprintf(last_error_, sizeof last_error_, "%s", fi_strerror(static_cast<int>(-rc)));
  }

  // Puts a peer's address in the AV: 0 or a negative libfabric error.
  int insert(const sockaddr_in &addr, fi_addr_t *out) {
    int r = fi_av_insert(av_, &addr, 1, out, 0, nullptr);
    return r == 1 ? 0 : r < 0 ? r : -FI_EINVAL;
  }
  // This endpoint's own address, for its peer's AV.
  int name(sockaddr_in *out) {
    size_t len = sizeof *out;
    int r = fi_getname(&ep_->fid, out, &len);
    if (r) return fail("fi_getname", r);
    if (len != sizeof *out || out->sin_family != AF_INET) {
      fprintf(stderr, "ofiblast: fi_getname: not an IPv4 socket address\n");
      return 1;
    }
    return 0;
  }

 private:
  static constexpr size_t kNoSlot = ~size_t(0);
  // The context's index: a receive's below slots_, a send's above.
  size_t index(void *op_context) const {
    auto *c = static_cast<const fi_context2 *>(op_context);
    if (c < ctx_.data() || c >= ctx_.data() + ctx_.size()) return kNoSlot;
    return static_cast<size_t>(c - ctx_.data());
  }

  fi_info *info_ = nullptr;
  fid_fabric *fabric_ = nullptr;
  fid_domain *domain_ = nullptr;
  fid_av *av_ = nullptr;
  fid_cq *tx_cq_ = nullptr, *rx_cq_ = nullptr;
  fid_ep *ep_ = nullptr;
  fid_mr *mr_ = nullptr;
  void *desc_ = nullptr;
  size_t prefix_ = 0, max_size_ = 0, slots_ = 0, slot_size_ = 0;
  std::vector<uint8_t> buf_;
  std::vector<fi_context2> ctx_;
  char last_error_[256] = "";
};

// Finds the server's endpoint, bound to ADDR:PORT.
int find_server(const Options &o, Endpoint *ep) {
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_port = htons(static_cast<uint16_t>(o.port));
  if (inet_pton(AF_INET, o.bind, &src.sin_addr) != 1) {
    fprintf(stderr, "ofiblast: -b %s: not an IPv4 address\n", o.bind);
    return 1;
  }
  return ep->find(o.prov, &src, nullptr);
}

// Opens the server's endpoint with `slots` receive buffers, posted, of the
// largest message.
int open_server(const Options &o, Endpoint *ep, size_t *slots) {
  if (int r = find_server(o, ep)) return r;
  *slots = ep->fit(ep->rx_depth(), ep->max_size());
  if (int r = ep->open(*slots, ep->max_size())) return r;
  for (size_t s = 0; s < *slots; s++)
    if (ssize_t r = ep->post_recv(s)) return fail("fi_recv", r);
  printf("ofiblast listening on %d (provider %s, max_msg_size %zu)\n", o.port, ep->info()->fabric_attr->prov_name,
         ep->max_size());
  fflush(stdout);
  return 0;
}


// Opens the client's endpoint towards HOST:PORT, with its message size
// (clamped to the provider's largest) and `slots` buffers of it (every one
// when 0: the transmit queue's depth), and puts the server in its AV.
int open_client(const Options &o, size_t slots, Endpoint *ep, size_t *size, fi_addr_t *peer, size_t at_least = 0) {
  sockaddr_in dst{};
  if (!resolve(o.host, o.port, &dst)) return 1;
  if (int r = ep->find(o.prov, nullptr, &dst)) return r;
  *size = o.size ? o.size : ep->max_size();
  if (*size > ep->max_size()) {
    fprintf(stderr, "ofiblast: -m %zu is over provider %s's max_msg_size (%zu, at most 64 KiB): sending %zu bytes\n",
            *size, ep->info()->fabric_attr->prov_name, static_cast<size_t>(ep->info()->ep_attr->max_msg_size),
            ep->max_size());
    *size = ep->max_size();
  }
  if (at_least > ep->max_size()) {
    fprintf(stderr, "ofiblast: provider %s's max_msg_size %zu is too small\n", ep->info()->fabric_attr->prov_name,
            ep->max_size());
    return 1;
  }
  size_t bytes = std::max(*size, at_least);
  if (int r = ep->open(slots ? slots : ep->fit(ep->tx_depth(), bytes), bytes)) return r;
  if (int r = ep->insert(dst, peer)) return fail("fi_av_insert", r);
  return 0;
}

void report_errors(const Endpoint &ep, uint64_t errs, const char *what) {
  if (errs)
    fprintf(stderr, "ofiblast: %llu %s failed (first: %s)\n", static_cast<unsigned long long>(errs), what,
            ep.last_error()[0] ? ep.last_error() : "?");
}

int receive(const Options &o) {
  Endpoint ep;
  size_t slots;
  if (int r = open_server(o, &ep, &slots)) return r;
  std::vector<size_t> repost;   // slots the provider would not take back yet
  Endpoint::Done done[kBatch];
  uint64_t bytes = 0, msgs = 0, errs = 0;
  Clock::time_point first{}, last{};
  const auto give_up = Clock::now() + seconds(o.secs + 5);
  for (;;) {
    ssize_t n = ep.poll(true, done);
    if (n < 0) return fail("fi_cq_read", n);
    auto now = Clock::now();
    if (n == 0) {
      if (msgs ? now - last > std::chrono::milliseconds(500) : now > give_up) break;
    } else {
      if (!msgs) first = now;
      last = now;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (done[i].err) {
        errs++;
      } else {
        bytes += done[i].len;
        msgs++;
      }
      repost.push_back(done[i].slot);
    }
    while (!repost.empty()) {
      ssize_t r = ep.post_recv(repost.back());
      if (r == -FI_EAGAIN) break;
      if (r) return fail("fi_recv", r);
      repost.pop_back();
    }
  }
  report_errors(ep, errs, "receives");
  double s = std::chrono::duration<double>(last - first).count();
  if (s <= 0) s = 1e-9;
  printf("ofiblast rx bytes=%llu msgs=%llu secs=%.3f gbps=%.3f mpps=%.4f\n", static_cast<unsigned long long>(bytes),
         static_cast<unsigned long long>(msgs), s, bytes * 8 / s / 1e9, msgs / s / 1e6);
  return msgs ? 0 : 2;
}

int send_to(const Options &o) {
  Endpoint ep;
  size_t size;
  fi_addr_t peer;
  if (int r = open_client(o, 0, &ep, &size, &peer)) return r;
  const size_t depth = ep.slots();
  std::vector<size_t> idle(depth);   // slots with no send posted
  for (size_t s = 0; s < depth; s++) idle[s] = depth - 1 - s;
  Endpoint::Done done[kBatch];
  uint64_t msgs = 0, errs = 0;
  const auto start = Clock::now(), end = start + seconds(o.secs);
  auto reap = [&]() -> ssize_t {
    ssize_t n = ep.poll(false, done);
    for (ssize_t i = 0; i < n; i++) {
      idle.push_back(done[i].slot);
      if (done[i].err) errs++;
      else msgs++;
    }
    return n;
  };
  while (Clock::now() < end) {
    while (!idle.empty()) {
      ssize_t r = ep.post_send(idle.back(), size, peer);
      if (r == 0) {
        idle.pop_back();
        continue;
      }
      if (r != -FI_EAGAIN) {   // counted like a failed completion; the receiver counts what arrived
        errs++;
        ep.note(r);
      }
      break;   // full: progress the provider by reading completions
    }
    if (ssize_t n = reap(); n < 0) return fail("fi_cq_read", n);
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  // The sends still posted complete (or fail) soon: wait for them, a while.
  for (const auto stop = Clock::now() + std::chrono::seconds(1); idle.size() < depth && Clock::now() < stop;)
    if (ssize_t n = reap(); n < 0) return fail("fi_cq_read", n);
  report_errors(ep, errs, "sends");
  const uint64_t bytes = msgs * size;
  printf("ofiblast tx bytes=%llu msgs=%llu secs=%.3f gbps=%.3f mpps=%.4f errors=%llu size=%zu depth=%zu\n",
         static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(msgs), s, bytes * 8 / s / 1e9,
         msgs / s / 1e6, static_cast<unsigned long long>(errs), size, depth);
  return msgs ? 0 : 2;
}

// The client's greeting: the magic, then the address to answer.
struct Hello {
  char magic[8];
  sockaddr_in addr;
};
constexpr size_t kHello = sizeof(Hello);

// Busy-polled ping-pong (-P), server side: echoes every datagram, from the
// buffer it arrived in, to the client whose greeting came last.
int pingpong_server(const Options &o) {
  Endpoint ep;
  size_t slots;
  if (int r = open_server(o, &ep, &slots)) return r;
  fi_addr_t client = FI_ADDR_NOTAVAIL;
  sockaddr_in client_addr{};
  Endpoint::Done done[kBatch];
  uint64_t msgs = 0, errs = 0;
  auto last = Clock::now();
  const auto give_up = last + seconds(o.secs + 5);
  // A slot whose echo is done (or never left) takes a receive again.
  auto repost = [&](size_t s) -> int {
    for (auto stop = Clock::now() + std::chrono::seconds(1);;) {
      ssize_t r = ep.post_recv(s);
      if (r == 0) return 0;
      if (r != -FI_EAGAIN || Clock::now() > stop) return fail("fi_recv", r);
    }
  };
  auto reap_sends = [&]() -> int {
    ssize_t n = ep.poll(false, done);
    if (n < 0) return fail("fi_cq_read", n);
    for (ssize_t i = 0; i < n; i++) {
      if (done[i].err) errs++;
      if (int r = repost(done[i].slot)) return r;
    }
    return 0;
  };
  for (;;) {
    Endpoint::Done got[kBatch];
    ssize_t n = ep.poll(true, got);
    if (n < 0) return fail("fi_cq_read", n);
    auto now = Clock::now();
    if (n == 0 && (msgs ? now - last > std::chrono::milliseconds(500) : now > give_up)) break;
    for (ssize_t i = 0; i < n; i++) {
      const size_t s = got[i].slot, len = got[i].len;
      const uint8_t *p = ep.payload(s);
      bool echo = !got[i].err && client != FI_ADDR_NOTAVAIL;
      if (!got[i].err && len == kHello && memcmp(p, kMagic, sizeof kMagic) == 0) {
        Hello h;
        memcpy(&h, p, sizeof h);
        int r = 0;
        fi_addr_t from = client;
        if (h.addr.sin_family != AF_INET) r = -FI_EINVAL;
        else if (client == FI_ADDR_NOTAVAIL || memcmp(&h.addr, &client_addr, sizeof h.addr) != 0)
          r = ep.insert(h.addr, &from);
        echo = r == 0;
        if (echo) {
          client = from;
          client_addr = h.addr;
        } else {
          errs++;   // a greeting with an address the AV refuses: dropped
          ep.note(r);
        }
      } else if (echo) {
        msgs++;
        last = now;
      }
      if (!echo) {
        if (int r = repost(s)) return r;
        continue;
      }
      ssize_t r;
      for (auto stop = Clock::now() + std::chrono::seconds(1);
           (r = ep.post_send(s, len, client)) == -FI_EAGAIN && Clock::now() < stop;)
        if (int e = reap_sends()) return e;
      if (r != 0) {
        errs++;
        ep.note(r);
        if (int e = repost(s)) return e;
      }
    }
    if (int e = reap_sends()) return e;
  }
  report_errors(ep, errs, "echoes");
  return msgs ? 0 : 2;
}

// Busy-polled ping-pong (-P), client side: greets the server, then sends
// SIZE bytes at a time and waits for each echo.
int pingpong_client(const Options &o) {
  Endpoint ep;
  size_t size;
  fi_addr_t peer;
  constexpr size_t kRecvs = 64;   // receive slots; the one after them sends
  if (int r = open_client(o, kRecvs + 1, &ep, &size, &peer, kHello)) return r;
  const size_t tx = kRecvs;
  for (size_t s = 0; s < kRecvs; s++)
    if (ssize_t r = ep.post_recv(s)) return fail("fi_recv", r);
  Hello hello;
  memcpy(hello.magic, kMagic, sizeof kMagic);
  if (int r = ep.name(&hello.addr)) return r;

  Endpoint::Done done[kBatch];
  bool tx_busy = false;      // the send slot's send has not completed
  bool greeting = true;      // awaiting the greeting's echo, not a ping's
  bool matched = false;      // the awaited echo came
  uint64_t seq = 0, errs = 0;
  // Reads both queues once: a send completion frees the send slot, a
  // receive is checked against the awaited echo and its slot posted again.
  auto progress = [&]() -> int {
    ssize_t n = ep.poll(false, done);
    if (n < 0) return fail("fi_cq_read", n);
    for (ssize_t i = 0; i < n; i++) {
      tx_busy = false;
      if (done[i].err) errs++;
    }
    n = ep.poll(true, done);
    if (n < 0) return fail("fi_cq_read", n);
    for (ssize_t i = 0; i < n; i++) {
      const uint8_t *p = ep.payload(done[i].slot);
      const size_t len = done[i].len;
      if (!done[i].err && (greeting ? len == kHello && memcmp(p, kMagic, sizeof kMagic) == 0
                                    : len == size && (size < sizeof seq || memcmp(p, &seq, sizeof seq) == 0)))
        matched = true;
      if (ssize_t r = ep.post_recv(done[i].slot)) return fail("fi_recv", r);
    }
    return 0;
  };
  // Sends `len` bytes from the send slot, the first `head_len` of them
  // `head`, once the slot's previous send is done.
  auto send = [&](const void *head, size_t head_len, size_t len) -> int {
    const auto stop = Clock::now() + std::chrono::seconds(1);
    while (tx_busy && Clock::now() < stop)
      if (int r = progress()) return r;
    if (tx_busy) {
      fprintf(stderr, "ofiblast: a send did not complete in 1 s\n");
      return 1;
    }
    memcpy(ep.payload(tx), head, head_len);
    ssize_t r;
    while ((r = ep.post_send(tx, len, peer)) == -FI_EAGAIN && Clock::now() < stop)
      if (int e = progress()) return e;
    if (r) return fail("fi_send", r);
    tx_busy = true;
    return 0;
  };

  // The greeting, every 100 ms until the server answers.
  for (const auto give_up = Clock::now() + seconds(o.secs + 5); !matched;) {
    if (Clock::now() > give_up) {
      fprintf(stderr, "ofiblast: no answer from %s:%d\n", o.host, o.port);
      return 2;
    }
    if (int r = send(&hello, kHello, kHello)) return r;
    for (const auto stop = Clock::now() + std::chrono::milliseconds(100); !matched && Clock::now() < stop;)
      if (int r = progress()) return r;
  }
  greeting = false;

  // Warm-up: the first 1000 round trips, or the first tenth of the time
  // if that ends first (a loaded machine's scheduler makes them slow).
  std::vector<double> rtt;
  const auto start = Clock::now(), end = start + seconds(o.secs), warm_end = start + seconds(o.secs / 10);
  for (int warm = -1000; Clock::now() < end; warm++) {
    if (warm < 0 && Clock::now() > warm_end) warm = 0;
    seq++;
    matched = false;
    const auto t0 = Clock::now();
    if (int r = send(&seq, size < sizeof seq ? 0 : sizeof seq, size)) return r;
    // A lost datagram would stall the loop: give up on it after a second
    // (its late echo, if any, carries an older sequence number).
    while (!matched && Clock::now() - t0 < std::chrono::seconds(1))
      if (int r = progress()) return r;
    if (matched && warm >= 0) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  report_errors(ep, errs, "sends");
  if (rtt.empty()) {
    fprintf(stderr, "ofiblast: no echo from %s:%d after the warm-up\n", o.host, o.port);
    return 2;
  }
  std::sort(rtt.begin(), rtt.end());
  printf("ofiblast pingpong size=%zu n=%zu median_us=%.3f min_us=%.3f\n", size, rtt.size(), rtt[rtt.size() / 2] / 2,
         rtt[0] / 2);
  return 0;
}

// -i: what the provider offers for the server's endpoint.
int show_info(const Options &o) {
  Endpoint ep;
  if (int r = find_server(o, &ep)) return r;
  const fi_info *i = ep.info();
  printf("ofiblast info provider=%s fabric=%s domain=%s max_msg_size=%zu inject_size=%zu tx_size=%zu rx_size=%zu "
         "msg_prefix_size=%zu\n",
         i->fabric_attr->prov_name, i->fabric_attr->name, i->domain_attr->name,
         static_cast<size_t>(i->ep_attr->max_msg_size), static_cast<size_t>(i->tx_attr->inject_size),
         static_cast<size_t>(i->tx_attr->size), static_cast<size_t>(i->rx_attr->size),
         static_cast<size_t>(i->ep_attr->msg_prefix_size));
  return 0;
}

bool parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end || v == 0 || s[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  int opt;
  bool bad = false;
  while ((opt = getopt(argc, argv, "sc:b:p:f:m:Pit:")) != -1) {
    char *end;
    switch (opt) {
      case 's': o.server = true; break;
      case 'c': o.host = optarg; break;
      case 'b': o.bind = optarg; break;
      case 'f': o.prov = optarg; break;
      case 'P': o.pingpong = true; break;
      case 'i': o.info = true; break;
      case 'p': {
        long v = strtol(optarg, &end, 10);
        if (end == optarg || *end || v < 1 || v > 65535) {
          fprintf(stderr, "ofiblast: -p %s: a port from 1 to 65535\n", optarg);
          return 1;
        }
        o.port = static_cast<int>(v);
        break;
      }
      case 'm':
        if (!parse_size(optarg, &o.size)) {
          fprintf(stderr, "ofiblast: -m %s: a size > 0 in bytes\n", optarg);
          return 1;
        }
        break;
      case 't':
        o.secs = strtod(optarg, &end);
        if (end == optarg || *end || !(o.secs > 0 && o.secs <= 86400)) {
          fprintf(stderr, "ofiblast: -t %s: seconds, more than 0 and at most 86400\n", optarg);
          return 1;
        }
        break;
      default: bad = true;
    }
  }
  if (bad || optind != argc || o.server + (o.host != nullptr) + o.info != 1) {
    fprintf(stderr,
            "usage: ofiblast -s [-b ADDR] [-p PORT] [-f PROVIDER] [-P] [-t S]\n"
            "       ofiblast -c HOST [-p PORT] [-f PROVIDER] [-m SIZE] [-P] [-t S]\n"
            "       ofiblast -i [-b ADDR] [-p PORT] [-f PROVIDER]\n");
    return 1;
  }
  if (o.info) return show_info(o);
  if (o.pingpong) return o.server ? pingpong_server(o) : pingpong_client(o);
  return o.server ? receive(o) : send_to(o);
}
