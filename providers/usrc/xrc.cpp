// XRC domains (ibv_open_xrcd): the scope in which an XRC target QP
// (XRC_RECV) hands its requests to the XRC SRQ each names. Opened on the
// same file (the inode of attr->fd), two opens in a process share one
// domain; and, as the kernel shares one between the processes of a device,
// the XRC SRQs of such a domain are published host-wide (per device and
// user), so that a target of another process reaches them: it keeps the
// transport and forwards each SEND packet to the SRQ's owner, which places
// it and completes the receive (docs/xrc.md).
//
// A target QP can be opened again by its number (ibv_open_qp) from any
// context of this process with an XRC domain on the same file: a handle of
// that context on the QP, which stays in the context that created it. As
// the kernel's shared QPs, every handle may modify, query and destroy it,
// gets its async events, and the QP is destroyed with its last handle.
//
// On disk, in xrc_dir()/<uid>/<device>/ (0700, ours alone):
//   c<slot>                  the context's socket (AF_UNIX datagrams); the
//                            slot, hence the name, is the context's alone
//   <dev>-<ino>/<srqn>       one per published SRQ of the domain of that
//                            file: a hard link to its owner's socket
// SRQ numbers are slot << 12 | index: unique per device on the host, and
// a name left by a context gone is its slot's next holder's to replace.
// A forwarder sends to <dev>-<ino>/<srqn>: no such file (no such SRQ in
// that domain) or no socket bound there any more (its owner is gone) is
// an error at once, which the target answers as for an unknown SRQ.
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "usrc/common/log.h"
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "usrc/boundary.h"
#include "usrc/usrc.h"

namespace usrc {

namespace {

struct Domains {
  std::mutex mu;
  std::map<std::pair<dev_t, ino_t>, XrcDomain *> by_inode;
};
Domains &domains() {
  static Domains d;
  return d;
}

}  // namespace

ibv_xrcd *open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr) {
  constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  const int oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ? attr->oflags : 0;
  auto *x = new (std::nothrow) Xrcd{};
  auto fail = [&](int e) -> ibv_xrcd * {
    delete x;
    errno = e;
    return nullptr;
  };
  if (!x) return fail(ENOMEM);
  if ((attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || (oflags & ~(O_CREAT | O_EXCL)))
    return fail(EINVAL);
  x->ctx = &impl(ibctx);
  if (attr->fd == -1) {
    // No file: a domain of its own (O_CREAT is required, as the kernel's).
    if (!(oflags & O_CREAT)) return fail(EINVAL);
    if (!(x->dom = new (std::nothrow) XrcDomain{})) return fail(ENOMEM);
    x->dom->opens = 1;
  } else {
    struct stat st;
    if (fstat(attr->fd, &st) != 0) return fail(EBADF);
    Domains &d = domains();
    std::lock_guard g(d.mu);
    auto it = d.by_inode.find({st.st_dev, st.st_ino});
    if (it == d.by_inode.end() && !(oflags & O_CREAT)) return fail(EINVAL);   // none yet, and not to be made
    if (it != d.by_inode.end() && (oflags & O_EXCL)) return fail(EEXIST);
    if (it != d.by_inode.end()) {
      x->dom = it->second;
    } else {
      if (!(x->dom = new (std::nothrow) XrcDomain{})) return fail(ENOMEM);
      x->dom->inode = {st.st_dev, st.st_ino};
      x->dom->shared = true;
      d.by_inode[x->dom->inode] = x->dom;
    }
    x->dom->opens++;
  }
  x->vx.xrcd.context = ibctx;
  x->vx.comp_mask = 0;
  return &x->vx.xrcd;
}

int close_xrcd(ibv_xrcd *ibx) {
  Xrcd *x = to_xrcd(ibx);
  if (x->users.load()) return EBUSY;   // its SRQs and target QPs
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    if (--x->dom->opens == 0) {
      if (x->dom->shared) d.by_inode.erase(x->dom->inode);
      delete x->dom;
    }
  }
  delete x;
  return 0;
}

bool add_tgt(Qp *qp) {
  Domains &d = domains();
  std::lock_guard g(d.mu);
  int e = 0;
  return no_throw([&] { qp->xrcd->dom->tgts[qp->vqp.qp.qp_num] = qp; }, &e);
}

ibv_qp *open_qp(ibv_context *ibctx, ibv_qp_open_attr *a) {
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  auto fail = [](int e) -> ibv_qp * {
    errno = e;
    return nullptr;
  };
  // (libibverbs' rules for the mask: unknown bits EOPNOTSUPP, a missing
  // field EINVAL.)
  if (!a) return fail(EINVAL);
  if (a->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED) return fail(EOPNOTSUPP);
  if ((a->comp_mask & kNeeded) != kNeeded || !a->xrcd || a->xrcd->context != ibctx ||
      a->qp_type != IBV_QPT_XRC_RECV)
    return fail(EINVAL);
  Xrcd *x = to_xrcd(a->xrcd);
  auto *h = new (std::nothrow) Qp{};
  if (!h) return fail(ENOMEM);
  Qp *real = nullptr;
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    auto it = x->dom->tgts.find(a->qp_num);
    if (it == x->dom->tgts.end()) {
      delete h;
      return fail(EINVAL);   // no target of that number in the domain
    }
    real = it->second;
    std::lock_guard ge(real->ctx->engine().mu);
    int e = 0;
    if (!no_throw([&] { real->opened.push_back(h); }, &e)) {
      delete h;
      return fail(e);
    }
    // (The QP's context lives while the handle does, though the one that
    // created it be closed.)
    real->ctx->ref();
  }
  x->users++;
  h->real = real;
  h->ctx = real->ctx;
  h->t = real->t;
  h->xrcd = x;
  h->vqp.xrcd = &x->vx;
  h->vqp.comp_mask = VERBS_QP_XRCD;
  ibv_qp &q = h->vqp.qp;
  q.context = ibctx;
  q.qp_context = (a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? a->qp_context : nullptr;
  q.qp_num = a->qp_num;
  q.qp_type = IBV_QPT_XRC_RECV;
  q.state = IBV_QPS_UNKNOWN;   // (as libibverbs' opens: query_qp tells)
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return &q;
}

int close_tgt_handle(Qp *h) {
  Qp *real = h->real;
  Context *owner = real->ctx;
  bool last;
  {
    Domains &d = domains();
    std::lock_guard g(d.mu);
    {
      std::lock_guard ge(owner->engine().mu);
      if (h == real) real->closed = true;
      else std::erase(real->opened, h);
      last = real->closed && real->opened.empty();
    }
    // (No more opens of it: the domain outlives the QP, as the handle's
    // use of its XRC domain is given up last.)
    if (last) h->xrcd->dom->tgts.erase(real->vqp.qp.qp_num);
  }
  Xrcd *x = h->xrcd;
  if (h != real) delete h;
  if (last) destroy_qp_now(real);
  x->users--;
  if (h != real) Context::unref(owner);   // (after the QP's destruction in it)
  return 0;
}

int get_srq_num(ibv_srq *ibsrq, uint32_t *srq_num) {
  Srq *srq = to_srq(ibsrq);
  if (srq->vsrq.srq_type != IBV_SRQT_XRC) return EINVAL;
  *srq_num = srq->vsrq.srq_num;
  return 0;
}

// ------------------------------------------- sharing with other processes

namespace {

// A forwarded packet as sent: this header, then its payload.
struct Record {
  uint32_t magic;
  uint32_t srqn;
  uint64_t dom_dev, dom_ino;   // the target's domain (checked against the SRQ's)
  uint32_t qpn, src_qp;        // the target, its peer
  uint32_t imm_be, len;        // len: the payload's
  uint16_t slid;
  uint8_t flags;
  uint8_t zero[5];
};
static_assert(sizeof(Record) == 48);
constexpr uint32_t kMagic = 0x31637278;   // "xrc1"
enum : uint8_t { kFirst = 1, kLast = 2, kImm = 4, kSolicited = 8, kAbort = 16, kFlags = 31 };
constexpr uint32_t kMaxPayload = 4096;    // one packet (the largest PMTU)
// Packets waiting for a WQE, all SRQs of a context; beyond, dropped.
constexpr uint32_t kMaxWaiting = 1024;
// Records taken per progress pass at most.
constexpr int kReceiveBatch = 64;
// Records waiting to be sent, all owners; beyond, the target answers RNR.
constexpr size_t kMaxOutgoing = 1024;

// A send that may go through later: the owner's socket full, or memory short.
bool transient(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == ENOMEM; }

// A path as a socket address; false if it does not fit.
bool sock_addr(const std::string &path, sockaddr_un *a) {
  *a = {};
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof a->sun_path) return false;
  std::memcpy(a->sun_path, path.c_str(), path.size() + 1);
  return true;
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string domain_dir(const std::string &dev_dir, const XrcDomain &dom) {
  return dev_dir + "/" + hex(dom.inode.first) + "-" + hex(dom.inode.second);
}

// A directory of ours alone: made 0700 if missing; refused if it is
// anything else (a link, another user's, open to others).
bool own_dir(const std::string &d) {
  if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return lstat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077);
}

// A record back into what it forwards; false if malformed.
bool parse(const uint8_t *b, size_t n, Record *h, rc::XrcForward *f) {
  if (n < sizeof *h) return false;
  std::memcpy(h, b, sizeof *h);
  if (h->magic != kMagic || h->len > kMaxPayload || h->len != n - sizeof *h || (h->flags & ~kFlags)) return false;
  for (uint8_t z : h->zero)
    if (z) return false;
  f->srqn = h->srqn;
  f->qpn = h->qpn;
  f->src_qp = h->src_qp;
  f->slid = h->slid;
  f->first = h->flags & kFirst;
  f->last = h->flags & kLast;
  f->imm = h->flags & kImm;
  f->solicited = h->flags & kSolicited;
  f->abort = h->flags & kAbort;
  f->imm_be = h->imm_be;
  f->data = b + sizeof *h;
  f->len = h->len;
  return true;
}

}  // namespace

// The directories and the socket, made once (the first shared XRC SRQ, or
// the first packet to forward).
bool Context::xrc_open() {
  if (xrc_fd_.load(std::memory_order_relaxed) >= 0) return true;
  if (xrc_failed_) return false;
  std::string err;
  const std::string user = xrc_dir() + "/" + std::to_string(geteuid());
  xrc_dev_dir_ = user + "/" + cfg_.name;
  xrc_path_ = xrc_dev_dir_ + "/c" + std::to_string(engine_->slot());
  sockaddr_un a;
  int fd = -1;
  if (!make_xrc_dir(&err) || !own_dir(user) || !own_dir(xrc_dev_dir_)) {
    err = err.empty() ? user + ": " + strerror(errno) + " (not a directory of this user's alone)" : err;
  } else if (!sock_addr(xrc_path_, &a) || (xrc_path_ + "/ffffff-ffffffffffffffff/ffffff").size() >= sizeof a.sun_path) {
    err = xrc_path_ + ": too long for a socket address";
  } else if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0 ||
             (unlink(xrc_path_.c_str()), bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a)) != 0) {
    err = xrc_path_ + ": " + strerror(errno);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (fd < 0) {
    log().warn("{}: XRC domains not shared with other processes: {}", cfg_.name, err);
    xrc_failed_ = true;
    return false;
  }
  xrc_buf_ = std::make_unique_for_overwrite<uint8_t[]>(sizeof(Record) + kMaxPayload);
  xrc_fd_.store(fd, std::memory_order_release);
  uint64_t one = 1;   // (the progress thread watches it from its next sleep)
  (void)!write(wake_fd_, &one, sizeof one);
  return true;
}

void Context::xrc_publish(Srq &srq, const XrcDomain &dom) {
  if (!dom.shared || !xrc_open()) return;
  const std::string d = domain_dir(xrc_dev_dir_, dom), name = d + "/" + hex(srq.vsrq.srq_num);
  // (The directory may go between its mkdir and the link: the last SRQ
  // of the domain withdrawn meanwhile, by another process.)
  for (int tries = 0; tries < 4 && !srq.published; tries++) {
    if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) break;
    unlink(name.c_str());   // (a context gone left it: the number is ours now)
    srq.published = link(xrc_path_.c_str(), name.c_str()) == 0;
  }
  if (!srq.published)
    log().warn("{}: XRC SRQ {:#x} not shared with other processes: {}: {}", cfg_.name, srq.vsrq.srq_num, name,
               strerror(errno));
}

void Context::xrc_withdraw(Srq &srq, const XrcDomain &dom) {
  engine_->counters[uint32_t(Counter::xrc_drops)] += srq.waiting.size();
  xrc_waiting_ -= static_cast<uint32_t>(srq.waiting.size());
  srq.waiting.clear();
  if (!srq.published) return;
  const std::string d = domain_dir(xrc_dev_dir_, dom);
  unlink((d + "/" + hex(srq.vsrq.srq_num)).c_str());
  rmdir(d.c_str());   // (if it was the domain's last)
  srq.published = false;
}

int Context::xrc_forward(const void *xrcd, const rc::XrcForward &f) {
  const auto *dom = static_cast<const XrcDomain *>(xrcd);
  if (!dom || !dom->shared || f.len > kMaxPayload || !xrc_open()) return ENOENT;
  Record h{};
  h.magic = kMagic;
  h.srqn = f.srqn;
  h.dom_dev = dom->inode.first;
  h.dom_ino = dom->inode.second;
  h.qpn = f.qpn;
  h.src_qp = f.src_qp;
  h.imm_be = f.imm_be;
  h.len = f.len;
  h.slid = f.slid;
  h.flags = uint8_t((f.first ? kFirst : 0) | (f.last ? kLast : 0) | (f.imm ? kImm : 0) |
                    (f.solicited ? kSolicited : 0) | (f.abort ? kAbort : 0));
  XrcOut o;
  if (!sock_addr(domain_dir(xrc_dev_dir_, *dom) + "/" + hex(f.srqn), &o.to)) return ENAMETOOLONG;
  if (xrc_out_.empty()) {
    iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t *>(f.data), f.len}};
    msghdr m{};
    m.msg_name = &o.to;
    m.msg_namelen = sizeof o.to;
    m.msg_iov = iov;
    m.msg_iovlen = f.len ? 2 : 1;
    if (sendmsg(xrc_fd_.load(std::memory_order_relaxed), &m, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return 0;
    // No such SRQ (ENOENT), its owner gone (ECONNREFUSED), anything but
    // a full socket: none.
    if (!transient(errno)) return errno;
  }
  // The owner's socket is full (it holds a few records only, see
  // net.unix.max_dgram_qlen), or others wait before this one: it waits
  // in order, sent from the next progress passes; none left: not now.
  if (xrc_out_.size() >= kMaxOutgoing) return EAGAIN;
  o.rec.resize(sizeof h + f.len);
  std::memcpy(o.rec.data(), &h, sizeof h);
  if (f.len) std::memcpy(o.rec.data() + sizeof h, f.data, f.len);
  xrc_out_.push_back(std::move(o));
  xrc_out_waiting_.store(true, std::memory_order_relaxed);
  return 0;
}

// The records waiting to go, in order, as far as their owners take them.
// One whose owner is gone since is dropped (its target acknowledged it).
void Context::xrc_send_waiting() {
  const int fd = xrc_fd_.load(std::memory_order_relaxed);
  for (; !xrc_out_.empty(); xrc_out_.pop_front()) {
    XrcOut &o = xrc_out_.front();
    if (sendto(fd, o.rec.data(), o.rec.size(), MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr *>(&o.to),
               sizeof o.to) < 0) {
      if (transient(errno)) break;
      engine_->counters[uint32_t(Counter::xrc_drops)]++;
    }
  }
  xrc_out_waiting_.store(!xrc_out_.empty(), std::memory_order_relaxed);
}

// The record of a forwarded packet just received: taken (placed,
// completed, failed or dropped) or set to wait for a WQE, behind any of
// its target's that wait already; false if it is no good (the caller
// counts it).
bool Context::xrc_take(const uint8_t *b, size_t n) {
  Record h;
  rc::XrcForward f;
  const rc::XrcSrq *s = parse(b, n, &h, &f) ? engine_->find_xrc_srq(f.srqn) : nullptr;
  const auto *dom = s ? static_cast<const XrcDomain *>(s->xrcd) : nullptr;
  if (!dom || !dom->shared || dom->inode != std::pair<dev_t, ino_t>(h.dom_dev, h.dom_ino)) return false;
  Srq &srq = *static_cast<Srq *>(s->q->user);
  const auto of_target = [&](const std::vector<uint8_t> &w) {
    return std::memcmp(w.data() + offsetof(Record, qpn), &f.qpn, sizeof f.qpn) == 0;
  };
  rc::XrcInbound &in = srq.q.inbound[f.qpn];
  if (std::none_of(srq.waiting.begin(), srq.waiting.end(), of_target) && engine_->xrc_deliver(*s, in, f)) {
    if (!in.active && !in.discard) srq.q.inbound.erase(f.qpn);
    return true;
  }
  if (xrc_waiting_ >= kMaxWaiting) {
    // Over the bound: this packet and its target's waiting ones are
    // dropped, and the rest of its message as it comes.
    const size_t before = srq.waiting.size();
    std::erase_if(srq.waiting, of_target);
    const auto gone = static_cast<uint32_t>(before - srq.waiting.size());
    xrc_waiting_ -= gone;
    engine_->counters[uint32_t(Counter::xrc_drops)] += gone + 1;
    in.active = false;
    in.discard = !f.last;
    return true;
  }
  srq.waiting.emplace_back(b, b + n);
  xrc_waiting_++;
  return true;
}

void Context::xrc_progress() {
  const int fd = xrc_fd_.load(std::memory_order_relaxed);
  if (fd < 0) return;
  if (!xrc_out_.empty()) xrc_send_waiting();
  for (int i = 0; i < kReceiveBatch; i++) {
    // (A record longer than any shows as such: MSG_TRUNC gives its length.)
    const ssize_t n = recv(fd, xrc_buf_.get(), sizeof(Record) + kMaxPayload, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) break;
    if (static_cast<size_t>(n) > sizeof(Record) + kMaxPayload || !xrc_take(xrc_buf_.get(), size_t(n)))
      engine_->counters[uint32_t(Counter::xrc_drops)]++;
  }
}

// The waiting packets the SRQ can take now (WQEs were posted), in order
// for each target: one whose packet still waits holds up its own only.
void Context::xrc_drain(Srq &srq) {
  const rc::XrcSrq *s = engine_->find_xrc_srq(srq.vsrq.srq_num);
  if (!s || srq.waiting.empty()) return;
  std::vector<uint32_t> held;
  for (auto it = srq.waiting.begin(); it != srq.waiting.end();) {
    Record h;
    rc::XrcForward f;
    (void)parse(it->data(), it->size(), &h, &f);   // (checked as it came)
    rc::XrcInbound &in = srq.q.inbound[f.qpn];
    if (std::find(held.begin(), held.end(), f.qpn) != held.end() || !engine_->xrc_deliver(*s, in, f)) {
      if (std::find(held.begin(), held.end(), f.qpn) == held.end()) held.push_back(f.qpn);
      ++it;
      continue;
    }
    if (!in.active && !in.discard) srq.q.inbound.erase(f.qpn);
    it = srq.waiting.erase(it);
    xrc_waiting_--;
  }
}

}  // namespace usrc
