// Completion queues, polling and completion events.
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <ctime>
#include <mutex>
#include <new>

#include "usrc/boundary.h"
#include "usrc/common/log.h"
#include "usrc/usrc.h"

namespace usrc {

static_assert(int(rc::WcStatus::retry_exc_err) == IBV_WC_RETRY_EXC_ERR);
static_assert(int(rc::WcStatus::rnr_retry_exc_err) == IBV_WC_RNR_RETRY_EXC_ERR);
static_assert(int(rc::WcStatus::wr_flush_err) == IBV_WC_WR_FLUSH_ERR);
static_assert(int(rc::WcStatus::rem_access_err) == IBV_WC_REM_ACCESS_ERR);
static_assert(int(rc::WcStatus::rem_inv_req_err) == IBV_WC_REM_INV_REQ_ERR);
static_assert(int(rc::WcStatus::loc_prot_err) == IBV_WC_LOC_PROT_ERR);
static_assert(int(rc::WcStatus::loc_len_err) == IBV_WC_LOC_LEN_ERR);
static_assert(int(rc::WcOpcode::recv_rdma_with_imm) == IBV_WC_RECV_RDMA_WITH_IMM &&
              int(rc::WcOpcode::bind_mw) == IBV_WC_BIND_MW && int(rc::WcOpcode::local_inv) == IBV_WC_LOCAL_INV &&
              int(rc::WcStatus::mw_bind_err) == IBV_WC_MW_BIND_ERR);
static_assert(int(rc::WcOpcode::rdma_write) == IBV_WC_RDMA_WRITE);
static_assert(int(rc::WcOpcode::tm_add) == IBV_WC_TM_ADD && int(rc::WcOpcode::tm_del) == IBV_WC_TM_DEL &&
              int(rc::WcOpcode::tm_sync) == IBV_WC_TM_SYNC && int(rc::WcOpcode::tm_recv) == IBV_WC_TM_RECV &&
              int(rc::WcOpcode::tm_no_tag) == IBV_WC_TM_NO_TAG && int(rc::WcStatus::tm_err) == IBV_WC_TM_ERR &&
              int(rc::WcStatus::tm_rndv_incomplete) == IBV_WC_TM_RNDV_INCOMPLETE);
static_assert(rc::kWcTmSyncReq == IBV_WC_TM_SYNC_REQ && rc::kWcTmMatch == IBV_WC_TM_MATCH &&
              rc::kWcTmDataValid == IBV_WC_TM_DATA_VALID);
static_assert(int(rc::WcStatus::success) == IBV_WC_SUCCESS && int(rc::WcOpcode::recv) == IBV_WC_RECV);
// rc::Wc is struct ibv_wc as the transport writes it (Engine::DirectWc).
#define USRC_SAME_FIELD(a, b) \
  static_assert(offsetof(rc::Wc, a) == offsetof(ibv_wc, b) && sizeof(rc::Wc::a) == sizeof(ibv_wc::b))
USRC_SAME_FIELD(wr_id, wr_id);
USRC_SAME_FIELD(status, status);
USRC_SAME_FIELD(opcode, opcode);
USRC_SAME_FIELD(vendor_err, vendor_err);
USRC_SAME_FIELD(byte_len, byte_len);
USRC_SAME_FIELD(imm_be, imm_data);
USRC_SAME_FIELD(qp_num, qp_num);
USRC_SAME_FIELD(src_qp, src_qp);
USRC_SAME_FIELD(wc_flags, wc_flags);
USRC_SAME_FIELD(pkey_index, pkey_index);
USRC_SAME_FIELD(slid, slid);
USRC_SAME_FIELD(sl, sl);
USRC_SAME_FIELD(dlid_path_bits, dlid_path_bits);
#undef USRC_SAME_FIELD
static_assert(sizeof(rc::Wc) == sizeof(ibv_wc) && rc::kWcWithImm == IBV_WC_WITH_IMM &&
              rc::kWcWithInv == IBV_WC_WITH_INV);

void Cq::Events::notify(rc::Cq &) {
  int chan_wfd = cq->chan_wfd;
  if (chan_wfd < 0) return;
  // ibv_get_cq_event reads the CQ pointer (struct ib_uverbs_comp_event_desc).
  uint64_t handle = reinterpret_cast<uintptr_t>(&cq->vcq.cq);
  if (send(chan_wfd, &handle, sizeof handle, MSG_DONTWAIT) != sizeof handle)
    log().warn("completion event lost: {}", strerror(errno));
}

// An application that polls the CQ empty after a completion event fired
// consumed the completion that fired it: the event still unread in the
// channel would wake it to an empty CQ (a strict event loop, such as
// ibv_rc_pingpong -t -e, fails on that). Take such an event back and
// restore the arm, so the next completion fires again.
static void withdraw_event(Cq *cq) {
  // Wait until every event counted in seq is in the channel or already
  // read: the pusher is between its push and its send, which is short
  // unless it lost its CPU there (a loaded machine): yield, then sleep.
  // Giving up early would leave a stale event for the next wait.
  const uint32_t seq = cq->ring.fire_seq();
  for (int i = 0; !cq->ring.sent(seq); i++) {
    if (i < 1000) {
      sched_yield();
    } else if (i < 1000 + 20000) {
      usleep(50);   // up to a second in all
    } else {
      log().warn("a completion event stayed unsent for a second: not withdrawn");
      return;
    }
  }
  if (cq->chan_rfd >= 0) {
    const uint64_t mine = reinterpret_cast<uintptr_t>(&cq->vcq.cq);
    uint64_t others[64];
    size_t n = 0;
    bool found = false;
    uint64_t h;
    while (n < 63 && recv(cq->chan_rfd, &h, sizeof h, MSG_DONTWAIT) == sizeof h) {
      if (h == mine) found = true;
      else others[n++] = h;
    }
    // A completion that came meanwhile keeps the event; it is not dealt
    // with then (if that completion is polled too, the event is stale
    // again and the next poll that empties the ring takes it back).
    bool keep = false;
    if (found) {
      std::lock_guard g(cq->ctx->engine().mu);   // (the arm is the producer's: see rc::Cq)
      keep = !cq->ring.rearm_if_empty();
    }
    if (keep) others[n++] = mine;
    for (size_t i = 0; i < n; i++) send(cq->chan_wfd, &others[i], sizeof others[i], MSG_DONTWAIT);
    if (keep) return;
  }
  cq->ring.handled(seq);
}

void Cq::Events::overflow(rc::Cq &) { cq->ctx->async_event(cq->vcq.cq.context, &cq->vcq.cq, IBV_EVENT_CQ_ERR); }

// domain: a parent domain, whose allocators give the ring's array (if it
// has them).
static ibv_cq *new_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector, Pd *domain) {
  if (cqe < 1 || cqe > (1 << 20) || comp_vector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  int wfd = -1;
  if (channel && (wfd = channel_writer(channel)) < 0) {
    errno = EINVAL;   // not a channel of a usrc context
    return nullptr;
  }
  Cq *cq = nullptr;
  int e = ENOMEM;
  if (!no_throw([&] { cq = new Cq(&impl(ibctx), static_cast<uint32_t>(cqe), domain ? domain->buffers() : nullptr); },
                &e)) {
    errno = e;
    return nullptr;
  }
  cq->chan_wfd = wfd;
  cq->chan_rfd = channel ? channel->fd : -1;
  cq->vcq.cq.cqe = cqe;
  if ((cq->domain = domain)) domain->users++;
  return &cq->vcq.cq;
}

ibv_cq *create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector) {
  return new_cq(ibctx, cqe, channel, comp_vector, nullptr);
}

int destroy_cq(ibv_cq *ibcq) {
  Cq *cq = to_cq(ibcq);
  if (cq->qps.load()) return EBUSY;
  if (cq->domain) unuse(cq->domain);
  delete cq;   // (a parent domain's allocator frees the ring's array here)
  return 0;
}

int resize_cq(ibv_cq *ibcq, int cqe) {
  Cq *cq = to_cq(ibcq);
  if (cqe < 1 || cqe > (1 << 20)) return EINVAL;
  // The new array is made, and the old one freed, outside the engine's
  // lock (either may be a parent domain's allocator's).
  rc::Buffer<rc::Completion> b = cq->ring.storage(static_cast<uint32_t>(cqe));
  bool ok;
  {
    std::lock_guard g(cq->ctx->engine().mu);
    ok = cq->ring.resize(b);
  }
  if (!ok) return EINVAL;
  ibcq->cqe = cqe;
  return 0;
}

// Each completion is written into the caller's ibv_wc as it is taken.
static int drain(Cq *cq, int ne, ibv_wc *wc) {
  return static_cast<int>(cq->ring.poll_each(static_cast<size_t>(ne), [&](const rc::Completion &c) {
    ibv_wc &w = *wc++;
    w.wr_id = c.wr_id;
    w.status = static_cast<ibv_wc_status>(c.status);
    w.opcode = static_cast<ibv_wc_opcode>(c.opcode);
    w.vendor_err = 0;
    w.byte_len = c.byte_len;
    w.imm_data = c.with_imm || c.with_inv ? c.imm_be : 0;   // (invalidated_rkey: the same field)
    w.qp_num = c.qp_num;
    w.src_qp = c.src_qp;
    w.wc_flags = (c.with_imm ? IBV_WC_WITH_IMM : 0) | (c.with_inv ? IBV_WC_WITH_INV : 0) | (c.grh ? IBV_WC_GRH : 0) |
                 c.tm_flags;
    w.pkey_index = 0;
    w.slid = c.slid;
    w.sl = 0;
    w.dlid_path_bits = 0;
  }));
}

int poll_cq(ibv_cq *ibcq, int ne, ibv_wc *wc) {
  Cq *cq = to_cq(ibcq);
  if (ne <= 0) return 0;
  cq->ctx->engine().note_poll();
  int n = drain(cq, ne, wc);
  if (n == 0) {
    // Nothing yet: receive and execute in the caller's thread (latency
    // comes from polling here, not from waking the progress thread).
    // The completions it makes for this CQ, as long as nothing waits in
    // the ring, go straight into wc; the ring's (later ones) follow.
    const rc::Engine::DirectWc direct{&cq->ring, reinterpret_cast<rc::Wc *>(wc), static_cast<uint32_t>(ne)};
    n = static_cast<int>(cq->ctx->try_progress(&direct, !cq->waiting.load(std::memory_order_relaxed)));
    if (n < ne) n += drain(cq, ne - n, wc + n);
  } else if (cq->chan_wfd < 0) {
    cq->ctx->found_completions();
  }
  if (cq->ring.fired() && cq->ring.empty()) withdraw_event(cq);
  return n;
}

int req_notify_cq(ibv_cq *ibcq, int solicited_only) {
  Cq *cq = to_cq(ibcq);
  {
    std::lock_guard g(cq->ctx->engine().mu);
    cq->ring.arm(solicited_only != 0);
  }
  // The application is going to wait for the event: its polls until then
  // do not keep the progress thread out, and that thread takes over now
  // (otherwise it would look in only once the last poll is
  // USRC_APP_QUIET_US old: ib_send_bw -e at 4 KB, 345 -> 5700 MB/s).
  cq->waiting.store(true, std::memory_order_relaxed);
  cq->ctx->app_waits();
  return 0;
}

// ibv_get_cq_event took the event.
void cq_event(ibv_cq *ibcq) { to_cq(ibcq)->waiting.store(false, std::memory_order_relaxed); }

// ---------------------------------------------------- extended CQ (cq_ex)

namespace {

Cq *to_cq(ibv_cq_ex *c) { return reinterpret_cast<Cq *>(c); }

// next_poll only reads the ring. Progress in the caller's thread happens in
// start_poll on an empty ring: a completion made by progress inside a poll
// that then consumes it would leave its completion event without a
// completion (strict event loops, e.g. ibv_rc_pingpong -t -e, treat that as
// an error).
bool take(ibv_cq_ex *x) {
  Cq *cq = to_cq(x);
  bool got = cq->ring.poll(&cq->cur, 1) != 0;
  if (cq->ring.fired() && cq->ring.empty()) withdraw_event(cq);
  if (!got) return false;
  x->wr_id = cq->cur.wr_id;
  x->status = static_cast<ibv_wc_status>(cq->cur.status);
  return true;
}

int next_poll(ibv_cq_ex *x) { return take(x) ? 0 : ENOENT; }

// start_poll takes the CQ's poll lock; end_poll releases it; a start_poll
// that finds nothing releases it itself (man ibv_create_cq_ex).
int start_poll(ibv_cq_ex *x, ibv_poll_cq_attr *attr) {
  if (attr && attr->comp_mask) return EINVAL;
  Cq *cq = to_cq(x);
  cq->poll_mu.lock();
  cq->ctx->engine().note_poll();
  if (take(x)) {
    if (cq->chan_wfd < 0) cq->ctx->found_completions();   // (as in poll_cq)
    return 0;
  }
  cq->ctx->try_progress(nullptr, !cq->waiting.load(std::memory_order_relaxed));
  if (take(x)) return 0;
  cq->poll_mu.unlock();
  return ENOENT;
}

void end_poll(ibv_cq_ex *x) { to_cq(x)->poll_mu.unlock(); }

const rc::Completion &cur(ibv_cq_ex *x) { return to_cq(x)->cur; }
ibv_wc_opcode read_opcode(ibv_cq_ex *x) { return static_cast<ibv_wc_opcode>(cur(x).opcode); }
uint32_t read_vendor_err(ibv_cq_ex *) { return 0; }
uint32_t read_byte_len(ibv_cq_ex *x) { return cur(x).byte_len; }
__be32 read_imm_data(ibv_cq_ex *x) { return cur(x).imm_be; }
uint32_t read_qp_num(ibv_cq_ex *x) { return cur(x).qp_num; }
uint32_t read_src_qp(ibv_cq_ex *x) { return cur(x).src_qp; }
unsigned int read_wc_flags(ibv_cq_ex *x) {
  return (cur(x).with_imm ? IBV_WC_WITH_IMM : 0) | (cur(x).with_inv ? IBV_WC_WITH_INV : 0) |
         (cur(x).grh ? IBV_WC_GRH : 0) | cur(x).tm_flags;
}
// Tag matching (rc/tm.h): a matched message's TMH tag and app context.
void read_tm_info(ibv_cq_ex *x, ibv_wc_tm_info *info) {
  info->tag = cur(x).tm_tag;
  info->priv = cur(x).tm_priv;
}
uint32_t read_slid(ibv_cq_ex *x) { return cur(x).slid; }
uint8_t read_sl(ibv_cq_ex *) { return 0; }
uint8_t read_dlid_path_bits(ibv_cq_ex *) { return 0; }
uint64_t read_completion_ts(ibv_cq_ex *x) { return cur(x).timestamp_ns; }

uint64_t ns_of(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

uint64_t read_completion_wallclock_ns(ibv_cq_ex *x) {
  // The timestamp is on the monotonic clock: shift it to the real-time one.
  return cur(x).timestamp_ns + (ns_of(CLOCK_REALTIME) - ns_of(CLOCK_MONOTONIC));
}

constexpr uint64_t kWcFlags =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
    IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS |
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;

}  // namespace

ibv_cq_ex *create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *a) {
  // Flow tags and VLANs are not implemented.
  if ((a->wc_flags & ~kWcFlags) ||
      (a->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) ||
      ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
       (a->flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)))) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // IBV_CQ_INIT_ATTR_MASK_PD: a parent domain of this context (not a plain
  // PD), whose allocators, if it has them, give the CQ's array.
  Pd *domain = nullptr;
  if (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    if (!a->parent_domain || a->parent_domain->context != ibctx || !to_pd(a->parent_domain)->parent()) {
      errno = EINVAL;
      return nullptr;
    }
    domain = to_pd(a->parent_domain);
  }
  if (a->cqe > INT32_MAX) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_cq *c = new_cq(ibctx, static_cast<int>(a->cqe), a->channel, static_cast<int>(a->comp_vector), domain);
  if (!c) return nullptr;
  // libibverbs fills context, channel (and its reference), cq_context and
  // the event counters after this returns, as for ibv_create_cq.
  ibv_cq_ex &x = to_cq(c)->vcq.cq_ex;
  x.start_poll = at_boundary<start_poll>;
  x.next_poll = at_boundary<next_poll>;
  x.end_poll = at_boundary<end_poll>;
  x.read_opcode = at_boundary<read_opcode>;
  x.read_vendor_err = at_boundary<read_vendor_err>;
  x.read_byte_len = at_boundary<read_byte_len>;
  x.read_imm_data = at_boundary<read_imm_data>;
  x.read_qp_num = at_boundary<read_qp_num>;
  x.read_src_qp = at_boundary<read_src_qp>;
  x.read_wc_flags = at_boundary<read_wc_flags>;
  x.read_slid = at_boundary<read_slid>;
  x.read_sl = at_boundary<read_sl>;
  x.read_dlid_path_bits = at_boundary<read_dlid_path_bits>;
  x.read_completion_ts = at_boundary<read_completion_ts>;
  x.read_completion_wallclock_ns = at_boundary<read_completion_wallclock_ns>;
  x.read_tm_info = at_boundary<read_tm_info>;
  return &x;
}

// The clock of the completion timestamps (ibv_query_rt_values_ex).
int query_rt_values(ibv_context *, ibv_values_ex *v) {
  if (v->comp_mask & ~uint32_t(IBV_VALUES_MASK_RAW_CLOCK)) return EOPNOTSUPP;
  if (v->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) clock_gettime(CLOCK_MONOTONIC, &v->raw_clock);
  return 0;
}

}  // namespace usrc
