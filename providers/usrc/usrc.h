// The verbs glue: libibverbs objects wrapping the transport's. One file per
// object family (device.cpp, pd_mr.cpp, cq.cpp, qp.cpp, channel.cpp), as in
// rdma-core's providers; nothing here implements protocol.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <cstddef>
#include <deque>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "usrc/device.h"
#include "usrc/net/rtnl.h"
#include "usrc/rc/engine.h"
#include "verbs_pabi34.h"

namespace usrc {

// IBV_QP_RATE_LIMIT range, kbit/s (packet_pacing_caps).
constexpr uint32_t kMinRateLimitKbps = 1000, kMaxRateLimitKbps = 100000000;

struct Device {
  verbs_device vdev;           // must be first: libibverbs owns the prefix
  DeviceConfig *cfg;
};

// A thread domain (ibv_alloc_td): the application's promise that what it
// creates on a parent domain of it is used by one thread at a time. usrc
// keeps its own locking all the same: a TD changes nothing but its count.
struct Td {
  ibv_td td;                        // first: ibv_td* converts to Td*
  std::atomic<uint32_t> users{0};   // parent domains on it
};

struct PdAllocators;   // pd_mr.cpp

// A protection domain, or a parent domain (ibv_alloc_parent_domain): an
// ibv_pd of its own over a PD (base), with an optional thread domain and
// the application's allocators. Protection is the base's: keys, AHs and
// QPs of a parent domain and of its PD are of one domain (compare bases).
//
// An imported PD (ibv_import_pd) is an ibv_pd of its own too, of the
// importing context, over the PD whose handle it named (base and over):
// the same protection. It counts as a user of that PD, which is not
// deallocated under it (EBUSY), and its import is one of its own users:
// ibv_unimport_pd ends that use, and it is freed when its last user goes
// (objects made on it may outlive the import, as with the kernel's handles).
struct Pd {
  ibv_pd pd;
  // MRs, QPs, SRQs, AHs using it; a parent domain's CQs; the parent
  // domains and imports on a PD; an imported PD's import.
  std::atomic<uint32_t> users{0};
  Pd *base = this;                  // the PD whose protection it has
  Pd *over = nullptr;               // a parent domain's or import's PD (a use of it)
  Td *td = nullptr;                 // a parent domain's, if any
  PdAllocators *allocators = nullptr;   // a parent domain's, if it has them
  bool imported = false;            // from ibv_import_pd
  bool parent() const { return base != this && !imported; }
  // Where the arrays of the objects created on it come from (nullptr:
  // the heap).
  rc::BufferSource *buffers() const;
};

struct Mr {
  verbs_mr vmr;
  Pd *pd;                      // its protection domain (a PD, never a parent domain)
  Pd *on;                      // the PD or parent domain it was registered on
  uint8_t *addr;
  uint64_t iova;
  uint64_t length;
  uint32_t access;
  struct Dm *dm;               // the device memory it maps, if any (never an import)
  // An imported MR (ibv_import_mr): an ibv_mr of the importing PD with the
  // keys of the MR it names (origin), which counts its imports and is not
  // deregistered under them (EBUSY). Work requests and peers reach the
  // origin through the keys; the import is only a handle.
  Mr *origin = nullptr;
  std::atomic<uint32_t> imports{0};
  bool odp;                    // IBV_ACCESS_ON_DEMAND: nothing is pinned or
                               // assumed mapped; each access checks first
  // A memory window's view of its MR (Mw::view): in the MR table under the
  // window's R_Key while the window is bound; mw_qpn: a type 2 window's
  // QP, the only one it serves. An MR counts the windows bound to it
  // (guarded by the engine's lock): it is not deregistered under them.
  struct Mw *mw = nullptr;
  uint32_t mw_qpn = 0;
  uint32_t windows = 0;
  // The host address of [va, va+len) if the MR covers it (and, for ODP,
  // it is mapped now); nullptr otherwise. (Inline: every posted WR's SGEs.)
  uint8_t *map(uint64_t va, uint64_t len) const {
    uint8_t *p = range(va, len);
    return p && odp && len ? mapped(p, len) : p;
  }
  // The same without looking at the mapping (the responder's copies are
  // guarded: an unmapped page gives an access error there, common/guard.h).
  uint8_t *range(uint64_t va, uint64_t len) const {
    if (va < iova || len > length || va - iova > length - len) return nullptr;
    return addr + (va - iova);
  }
  uint8_t *mapped(uint8_t *p, uint64_t len) const;   // ODP: p if [p, p+len) is mapped now
};

// A memory window (mw.cpp): while bound, a range of one of its PD's MRs
// that a peer reaches through the window's R_Key with the window's access.
struct Mw {
  ibv_mw mw;                   // first: ibv_mw* converts to Mw*
  Mr view;                     // the bound range (view.mw = this)
  Mr *mr = nullptr;            // bound: the MR it is a range of
};

// Device memory (ibv_alloc_dm): memory of the provider, reached only
// through ibv_memcpy_to/from_dm and MRs made with ibv_reg_dm_mr.
// An imported DM (ibv_import_dm) is an ibv_dm of the importing context
// over the same memory; its origin counts it and is not freed under it
// (EBUSY). MRs on either count on the origin.
struct Dm {
  ibv_dm dm;
  uint8_t *mem;
  size_t length;
  std::atomic<uint32_t> mrs{0};
  Dm *origin = nullptr;
  std::atomic<uint32_t> imports{0};
};
constexpr size_t kMaxDmSize = 1 << 20;

class Context;

// An address handle (ah.cpp): where a UD QP's datagrams go, resolved once.
struct Ah {
  ibv_ah ah;                   // first: ibv_ah* converts to Ah*
  rc::Engine::UdDest dest;     // the path; each WR adds the QPN and Q_Key
};

// A shared receive queue (srq.cpp): its WQEs are the transport's
// (rc::RecvQueue), taken by the QPs created on it.
// An XRC domain (xrc.cpp): shared by the opens of one file in this process,
// and, opened on a file, with the other processes of the host (its SRQs).
struct Qp;
struct XrcDomain {
  std::pair<dev_t, ino_t> inode{};   // of the file (shared: host-wide per device, xrc.cpp)
  bool shared = false;   // opened on a file (by_inode has it)
  int opens = 0;
  // Its target QPs by number, for ibv_open_qp (guarded by xrc.cpp's lock).
  std::unordered_map<uint32_t, Qp *> tgts;
};
struct Xrcd {
  verbs_xrcd vx;               // first: ibv_xrcd* converts to Xrcd*
  Context *ctx = nullptr;
  XrcDomain *dom = nullptr;
  std::atomic<uint32_t> users{0};   // XRC SRQs and target QPs
};
inline Xrcd *to_xrcd(ibv_xrcd *x) { return reinterpret_cast<Xrcd *>(x); }

struct Srq {
  verbs_srq vsrq;              // first: ibv_srq* converts to Srq*
  Context *ctx;
  rc::RecvQueue q;             // guarded by the engine's lock
  std::atomic<uint32_t> qps{0};
  // An XRC SRQ of a domain opened on a file: its number is published for
  // the targets of other processes (xrc.cpp), whose packets for it arrive
  // on the context's XRC socket; those waiting for a WQE, each a record as
  // sent (guarded by the engine's lock; the messages in progress:
  // q.inbound).
  bool published = false;
  std::deque<std::vector<uint8_t>> waiting;
  // A tag matching SRQ's list (q.tm points to it; rc/tm.h).
  std::unique_ptr<rc::TagList> tm;
};

struct Cq {
  verbs_cq vcq;                // first: ibv_cq* converts to Cq*
  Context *ctx;
  Pd *domain = nullptr;        // the parent domain it was created on (create_cq_ex), if any
  int chan_wfd = -1;           // completion channel, writer end
  // Armed (req_notify_cq) and its event not yet taken (cq_event): the
  // application waits for it, and its polls meanwhile are no polling loop.
  std::atomic<bool> waiting{false};
  int chan_rfd = -1;           // and the channel's own fd (the reader end)
  std::atomic<uint32_t> qps{0};
  struct Events final : rc::Cq::Hooks {
    Cq *cq;
    explicit Events(Cq *c) : cq(c) {}
    void notify(rc::Cq &) override;
    void overflow(rc::Cq &) override;
  } events{this};
  rc::Cq ring;
  // Extended polling (ibv_start_poll ... ibv_end_poll): the completion the
  // ibv_wc_read_* accessors read, guarded from start to end of a poll.
  std::mutex poll_mu;
  rc::Completion cur{};
  Cq(Context *c, uint32_t depth, rc::BufferSource *src = nullptr) : ctx(c), ring(depth, &events, src) {}
};

struct Qp {
  verbs_qp vqp;                // first: ibv_qp* and ibv_qp_ex* convert to Qp*
  Context *ctx;
  rc::Qp *t;                   // transport state, owned by the engine
  ibv_qp_attr attr{};          // every attribute as last set, for query_qp
  ibv_qp_init_attr init{};
  // The extended send API (ibv_wr_*, qp_ex.cpp): work requests built
  // between ibv_wr_start and ibv_wr_complete, posted all or none.
  // Pointers into an entry (sg_list, inline data) are set at
  // ibv_wr_complete: the vector may move while the batch grows.
  struct PendingWr {
    ibv_send_wr wr;
    ibv_sge sge[rc::kMaxSge];
    uint8_t inl[rc::kMaxInline];
    int32_t inl_len;               // -1: the SGEs; else inline data in inl
  };
  std::vector<PendingWr> batch;   // grows to the largest batch, then reused
  size_t nbatch = 0;
  int batch_err = 0;              // the first builder error, reported by wr_complete
  // An XRC target's handles (ibv_open_qp, xrc.cpp). Every handle is a Qp;
  // the one the QP was created through (real) holds its state (t, attr,
  // init) and lives while any handle does: destroying a handle closes it,
  // the last one destroys the QP, as the kernel's shared QPs. Guarded by
  // the engine's lock of real->ctx, the context the QP lives in.
  Qp *real = this;
  std::vector<Qp *> opened;       // real's: the other live handles
  bool closed = false;            // real's: its own handle was destroyed
  Xrcd *xrcd = nullptr;           // the XRC domain this handle is of (its use)
};

// Everything of one ibv_context (and of those imported from it) that is not libibverbs' own: the engine, its
// progress thread, the MR table, the async event socket, the counters.
class Context final : public rc::MemoryAccess, public rc::EngineHooks {
 public:
  static Context *open(const DeviceConfig &cfg, std::string *err);
  ~Context();   // (through unref, once open)
  // Shared by the ibv_contexts of one open (ibv_import_device) and held by
  // the handles other contexts opened on its XRC targets: the last unref
  // closes it.
  void ref() { refs_.fetch_add(1); }
  static void unref(Context *c) {
    if (c->refs_.fetch_sub(1) == 1) delete c;
  }

  rc::Engine &engine() { return *engine_; }
  const DeviceConfig &cfg() const { return cfg_; }
  // Each ibv_context on it reads its own async events: the read end of a
  // socket pair added for it (-1 on failure, errno set), removed when it
  // closes (libibverbs closes the read end).
  int add_async(ibv_context *to);
  void remove_async(ibv_context *to);

  // Wakes the progress thread if the engine now has an earlier timer than
  // the one it sleeps for. Call after releasing engine().mu.
  void kick();
  bool nic_ready(int fd);
  static bool cores_crowded();
  // Progress from the caller's thread if nobody else is at it (poll_cq).
  // direct: a poller's array the pass may write receive completions into
  // (rc::Engine::DirectWc); returns how many it wrote there.
  // polling: the caller polls in a loop (not a CQ armed for an event):
  // the progress thread stays out while it does (see progress_loop).
  uint32_t try_progress(const rc::Engine::DirectWc *direct = nullptr, bool polling = true);
  // The application armed a CQ and is about to wait for its event, not
  // poll: the progress thread takes over now.
  void app_waits();
  // The application polled a CQ without a completion channel and found
  // completions. Such a CQ is only ever polled: the caller polls in a loop
  // even if it never finds the CQ empty (the progress thread may have
  // filled it each time), and receives itself from now (see
  // progress_loop). A completion made at post time (a placed RDMA WRITE)
  // came without a pass: receive now, as an empty poll would.
  void found_completions();
  // An event of an object of `to`, or (to == nullptr) of the port, for
  // every ibv_context on this one.
  void async_event(ibv_context *to, void *element, ibv_event_type type);
  // The port follows the netdev: ACTIVE while it is up and running.
  bool port_up() const { return port_up_.load(std::memory_order_relaxed); }

  // MR table; guarded by engine().mu.
  uint32_t add_mr(Mr *mr);
  void remove_mr(uint32_t key);
  Mr *find_mr(uint32_t key) {   // (the last one found is kept: the common case inline)
    return key == last_key_ && last_mr_ ? last_mr_ : lookup_mr(key);
  }
  Mr *lookup_mr(uint32_t key);
  void put_mr(uint32_t key, Mr *mr) { mrs_[key] = mr; }   // (a key new_mw_key drew)
  uint32_t new_mw_key();

  // Handles of PDs and DMs (ibv_import_pd/dm name them; an MR's is its
  // key): unique in the process while they live.
  uint32_t add_handle(Pd *pd) { return add_handle(pds_, pd); }
  uint32_t add_handle(Dm *dm) { return add_handle(dms_, dm); }
  // Removed with the object, unless it is in use (then false: EBUSY), in
  // one step with imports, which take a use under the same lock.
  bool remove_unused(Pd *pd) {
    std::lock_guard g(handles_mu_);
    if (pd->users.load()) return false;
    pds_.erase(pd->pd.handle);
    return true;
  }
  bool remove_unused(Dm *dm) {
    std::lock_guard g(handles_mu_);
    if (dm->mrs.load() || dm->imports.load()) return false;
    dms_.erase(dm->dm.handle);
    return true;
  }
  template <class F> auto with_pd(uint32_t h, F f) { return with(pds_, h, f); }
  template <class F> auto with_dm(uint32_t h, F f) { return with(dms_, h, f); }

  uint8_t *resolve(const void *pd, uint32_t qpn, uint32_t rkey, uint64_t va, uint64_t len,
                   uint32_t access) override;
  bool invalidate(const void *pd, uint32_t qpn, uint32_t rkey) override;
  void qp_event(rc::Qp &qp, rc::QpEvent ev) override;
  void srq_event(rc::RecvQueue &q) override;

  // XRC domains shared with the other processes of this host (xrc.cpp),
  // all under engine().mu: an XRC SRQ of a domain opened on a file is
  // published (and withdrawn) by its number; a target's SENDs for such an
  // SRQ of another process are forwarded to it (xrc_forward); the packets
  // forwarded to this context's SRQs are taken in each progress pass
  // (xrc_progress, which also sends those that had to wait), and those
  // waiting for a WQE once one is posted (xrc_drain).
  void xrc_publish(Srq &srq, const struct XrcDomain &dom);
  void xrc_withdraw(Srq &srq, const struct XrcDomain &dom);
  int xrc_forward(const void *xrcd, const rc::XrcForward &f) override;
  void xrc_progress();
  void xrc_drain(Srq &srq);

 private:
  Context() = default;
  void progress_loop();
  std::atomic<int> refs_{1};
  template <class T>
  uint32_t add_handle(std::unordered_map<uint32_t, T *> &m, T *p) {
    // (Drawn from one count for the process: a handle of another context
    // names nothing here, unless that context was imported from this one.)
    static std::atomic<uint32_t> next{0};
    std::lock_guard g(handles_mu_);
    for (;;) {
      const uint32_t h = next.fetch_add(1, std::memory_order_relaxed) + 1;
      if (h && m.emplace(h, p).second) return h;
    }
  }
  // f(the object of handle h, or nullptr), under the handles' lock.
  template <class T, class F>
  auto with(std::unordered_map<uint32_t, T *> &m, uint32_t h, F f) {
    std::lock_guard g(handles_mu_);
    auto it = m.find(h);
    return f(it == m.end() ? nullptr : it->second);
  }
  std::mutex handles_mu_;
  std::unordered_map<uint32_t, Pd *> pds_;
  std::unordered_map<uint32_t, Dm *> dms_;
  struct AsyncSink {
    ibv_context *ctx;
    int wfd;
  };
  std::mutex async_mu_;
  std::vector<AsyncSink> async_;

  DeviceConfig cfg_;
  OwnCounters counters_;   // (outlives the engine, which counts into it)
  std::unique_ptr<rc::Engine> engine_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sleep_until_{0};   // the progress thread's wake time
  std::atomic<uint64_t> app_polled_{0};    // when the application last polled
  // The application's polls and posts so far (ProgressPolicy::next): one
  // writer at a time mostly, so a load and a store, not an atomic add.
  std::atomic<uint64_t> app_calls_{0};
  void note_call() { app_calls_.store(app_calls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  // The progress thread sleeps while the application polls (watch), on the
  // NIC's fd as well (nic); and the application's own passes meanwhile that
  // took datagrams off that fd (ProgressPolicy::app_took).
  enum Watch : uint8_t { kAwake, kWatch, kWatchNic };
  std::atomic<uint8_t> watch_{kAwake};
  std::atomic<uint32_t> app_took_{0};
  int wake_fd_ = -1;                        // eventfd
  net::Rtnl nl_;                            // rtnetlink: the netdev's link and addresses
  int nl_fd_ = -1;                          // its descriptor (-1: none)
  unsigned ifindex_ = 0;
  std::atomic<bool> port_up_{true};
  void watch_netdev();     // netdev_watch.cpp: opens nl_fd_, reads the port state
  void netdev_events();    // reads nl_fd_; raises the port's events
  // The XRC socket (AF_UNIX datagrams, bound at xrc_path_ in this user's
  // directory for the device): -1 until the first shared XRC SRQ or
  // forward needs it; xrc_failed_: it could not be made (the domains stay
  // this process's).
  std::atomic<int> xrc_fd_{-1};
  std::string xrc_dev_dir_, xrc_path_;
  bool xrc_failed_ = false;
  uint32_t xrc_waiting_ = 0;   // forwarded packets waiting, all SRQs
  std::unique_ptr<uint8_t[]> xrc_buf_;
  // Forwarded packets waiting for room in their owners' sockets, in order
  // (xrc_out_waiting_: some do; the progress thread comes back for them).
  struct XrcOut {
    sockaddr_un to;
    std::vector<uint8_t> rec;
  };
  std::deque<XrcOut> xrc_out_;
  std::atomic<bool> xrc_out_waiting_{false};
  void xrc_send_waiting();
  bool xrc_open();
  bool xrc_take(const uint8_t *rec, size_t len);
  std::unordered_map<uint32_t, Mr *> mrs_;
  uint32_t next_key_ = 0;   // the next MR index (add_mr); 0: not drawn yet
  // The MR found last (a stream posts from the same one, WR after WR).
  uint32_t last_key_ = 0;
  Mr *last_mr_ = nullptr;
};

struct VerbsContext {
  verbs_context vctx;          // allocated by libibverbs with this layout
  Context *impl;
};

inline VerbsContext *to_vctx(ibv_context *c) {
  return reinterpret_cast<VerbsContext *>(reinterpret_cast<char *>(c) -
                                          offsetof(verbs_context, context));
}
inline Context &impl(ibv_context *c) { return *to_vctx(c)->impl; }
inline Cq *to_cq(ibv_cq *c) { return reinterpret_cast<Cq *>(c); }
inline Qp *to_qp(ibv_qp *q) { return reinterpret_cast<Qp *>(q); }
inline Qp *to_qp(ibv_qp_ex *q) { return reinterpret_cast<Qp *>(q); }
inline Pd *to_pd(ibv_pd *p) { return reinterpret_cast<Pd *>(p); }
// Ends one use of a PD (users); frees an imported PD whose import has ended
// and whose last user this was (pd_mr.cpp).
void unuse(Pd *pd);
// The protection domain of a PD or parent domain (what MRs, AHs and QPs
// are checked against).
// (None for an XRC target, which has no PD of its own.)
inline Pd *prot_pd(ibv_pd *p) { return p ? to_pd(p)->base : nullptr; }
inline Td *to_td(ibv_td *t) { return reinterpret_cast<Td *>(t); }
inline Mr *to_mr(ibv_mr *m) { return reinterpret_cast<Mr *>(m); }
inline Srq *to_srq(ibv_srq *s) { return reinterpret_cast<Srq *>(s); }
inline Ah *to_ah(ibv_ah *a) { return reinterpret_cast<Ah *>(a); }

// The casts above, and those of device.cpp (Device), pd_mr.cpp (Dm) and
// cq.cpp (ibv_cq_ex), take a libibverbs object for ours: each of ours
// begins with it, and libibverbs' own wrappers begin with the object they
// hand out.
static_assert(std::is_standard_layout_v<Device> && offsetof(Device, vdev) == 0 &&
              offsetof(verbs_device, device) == 0);
static_assert(std::is_standard_layout_v<VerbsContext> && offsetof(VerbsContext, vctx) == 0);
static_assert(std::is_standard_layout_v<Pd> && offsetof(Pd, pd) == 0);
static_assert(std::is_standard_layout_v<Td> && offsetof(Td, td) == 0);
static_assert(std::is_standard_layout_v<Mr> && offsetof(Mr, vmr) == 0 && offsetof(verbs_mr, ibmr) == 0);
static_assert(std::is_standard_layout_v<Dm> && offsetof(Dm, dm) == 0);
static_assert(std::is_standard_layout_v<Ah> && offsetof(Ah, ah) == 0);
static_assert(std::is_standard_layout_v<Qp> && offsetof(Qp, vqp) == 0 && offsetof(verbs_qp, qp) == 0 &&
              offsetof(verbs_qp, qp_ex) == 0 && offsetof(ibv_qp_ex, qp_base) == 0);
static_assert(offsetof(verbs_cq, cq) == 0 && offsetof(verbs_cq, cq_ex) == 0);
// Cq is not standard-layout (its Events member is polymorphic), where
// offsetof is only conditionally supported: GCC and Clang give the layout
// they use. Cq itself has no base and no vptr to put before vcq.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(!std::is_polymorphic_v<Cq> && offsetof(Cq, vcq) == 0);
// (Srq likewise: its queue mixes public and private members.)
static_assert(!std::is_polymorphic_v<Srq> && offsetof(Srq, vsrq) == 0 && offsetof(verbs_srq, srq) == 0);
#pragma GCC diagnostic pop
uint64_t now_ns();   // progress.cpp: CLOCK_MONOTONIC, the engine's clock

// backend.cpp: a context's NIC, the device's backend on a free process slot
// (*slot: its UDP port is base_port + slot) with the shared-memory ring and
// the tracer over it where they apply; *window: the send window it suits.
// nullptr with *err set (empty only for a nested libfabric probe).
std::unique_ptr<net::Nic> open_nic(const DeviceConfig &cfg, uint32_t *slot, uint32_t *window,
                                   std::string *err);

// The ops, by family.
int query_device_ex(ibv_context *, const ibv_query_device_ex_input *, ibv_device_attr_ex *, size_t);
int query_port(ibv_context *, uint8_t, ibv_port_attr *);
ibv_pd *alloc_pd(ibv_context *);
int dealloc_pd(ibv_pd *);
ibv_td *alloc_td(ibv_context *, ibv_td_init_attr *);
int dealloc_td(ibv_td *);
ibv_pd *alloc_parent_domain(ibv_context *, ibv_parent_domain_init_attr *);
ibv_mr *reg_mr(ibv_pd *, void *, size_t, uint64_t, int);
int advise_mr(ibv_pd *, ibv_advise_mr_advice, uint32_t flags, ibv_sge *, uint32_t num_sge);
int dereg_mr(verbs_mr *);
int rereg_mr(verbs_mr *, int flags, ibv_pd *, void *addr, size_t length, int access);
ibv_dm *alloc_dm(ibv_context *, ibv_alloc_dm_attr *);
int free_dm(ibv_dm *);
ibv_mr *reg_dm_mr(ibv_pd *, ibv_dm *, uint64_t offset, size_t length, unsigned int access);
ibv_cq *create_cq(ibv_context *, int, ibv_comp_channel *, int);
int destroy_cq(ibv_cq *);
int poll_cq(ibv_cq *, int, ibv_wc *);
int req_notify_cq(ibv_cq *, int);
void cq_event(ibv_cq *);
int resize_cq(ibv_cq *, int);
ibv_cq_ex *create_cq_ex(ibv_context *, ibv_cq_init_attr_ex *);
int query_rt_values(ibv_context *, ibv_values_ex *);
ibv_qp *create_qp(ibv_pd *, ibv_qp_init_attr *);
ibv_qp *create_qp_ex(ibv_context *, ibv_qp_init_attr_ex *);
int modify_qp(ibv_qp *, ibv_qp_attr *, int);
int query_qp(ibv_qp *, ibv_qp_attr *, int, ibv_qp_init_attr *);
int destroy_qp(ibv_qp *);
int post_send(ibv_qp *, ibv_send_wr *, ibv_send_wr **);
int post_recv(ibv_qp *, ibv_recv_wr *, ibv_recv_wr **);
// Posts a list with the engine lock held (post_send and ibv_wr_complete).
int check_send_wr(const Qp *qp, const ibv_send_wr &wr);
int post_send_locked(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad);
ibv_mw *alloc_mw(ibv_pd *, ibv_mw_type);
ibv_xrcd *open_xrcd(ibv_context *, ibv_xrcd_init_attr *);
// xrc.cpp: ibv_open_qp, and the target QPs' registry.
ibv_qp *open_qp(ibv_context *, ibv_qp_open_attr *);
bool add_tgt(Qp *qp);                      // a new target QP (make_qp); false: ENOMEM
// ibv_destroy_qp of a target's handle: the QP goes with the last one.
int close_tgt_handle(Qp *qp);
// qp.cpp: a QP's destruction (the engine's, its uses, the object).
void destroy_qp_now(Qp *qp);
// import.cpp: the live contexts (for ibv_import_device, which names one
// by its command fd); the import alloc_context is making on this thread
// (the Context to share, a reference taken for it, and the fd the new
// context takes; nullptr if none); the device op import_context.
void register_context(VerbsContext *c);
void unregister_context(VerbsContext *c);
Context *importing(int *fd);
verbs_context *import_context(ibv_device *, int cmd_fd);
// ibv_import_pd/mr/dm and their unimports.
ibv_pd *import_pd(ibv_context *, uint32_t handle);
void unimport_pd(ibv_pd *);
ibv_mr *import_mr(ibv_pd *, uint32_t handle);
void unimport_mr(ibv_mr *);
ibv_dm *import_dm(ibv_context *, uint32_t handle);
void unimport_dm(ibv_dm *);
int close_xrcd(ibv_xrcd *);
int get_srq_num(ibv_srq *, uint32_t *);
int dealloc_mw(ibv_mw *);
int bind_mw(ibv_qp *, ibv_mw *, ibv_mw_bind *);
// A BIND_MW or LOCAL_INV work request (mw.cpp), under the engine's lock:
// its effect made now, its completion in send queue order. type1: from
// ibv_bind_mw. 0 or ENOMEM (the send queue is full).
int post_local_wr(Qp *qp, const ibv_send_wr &wr, bool type1);
// qp_ex.cpp: the ibv_wr_* builders of a QP created with send_ops_flags.
int init_qp_ex(Qp *qp, uint64_t send_ops_flags);
void async_event_op(ibv_context *, ibv_async_event *);

// qp.cpp: the IP an address vector names, and the path it asks for.
int resolve_ip(const DeviceConfig &cfg, const ibv_ah_attr &ah, uint32_t *ip);
void path_of(const ibv_ah_attr &ah, uint8_t *tos, uint8_t *ttl, uint16_t *sport);
// ah.cpp: address handles.
ibv_ah *create_ah(ibv_pd *, ibv_ah_attr *);
int destroy_ah(ibv_ah *);

// srq.cpp: shared receive queues.
ibv_srq *create_srq(ibv_pd *, ibv_srq_init_attr *);
ibv_srq *create_srq_ex(ibv_context *, ibv_srq_init_attr_ex *);
int modify_srq(ibv_srq *, ibv_srq_attr *, int);
int query_srq(ibv_srq *, ibv_srq_attr *);
int destroy_srq(ibv_srq *);
int post_srq_recv(ibv_srq *, ibv_recv_wr *, ibv_recv_wr **);
int post_srq_ops(ibv_srq *, ibv_ops_wr *, ibv_ops_wr **);
// One receive WR's SGEs checked against the PD and mapped (qp.cpp); false
// if one fails its lkey, bounds or access check: the WQE is posted bad and
// fails when used.
bool map_recv_sges(Context &c, const Pd *pd, const ibv_recv_wr &wr, rc::RecvWr *out, uint64_t *len);

// channel.cpp: completion channels of usrc contexts.
int channel_writer(ibv_comp_channel *ch);   // -1 if not one of ours

// qp_attr.cpp: the IBA modify_qp rules, free of side effects.
int check_modify_qp(ibv_qp_type type, ibv_qp_state cur, const ibv_qp_attr &attr, int mask, ibv_qp_state *next);

}  // namespace usrc
