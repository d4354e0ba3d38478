// Completion queues, polling and completion events.
#include <sys/socket.h>

#include <cerrno>
#include <new>

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
static_assert(int(rc::WcOpcode::recv_rdma_with_imm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(int(rc::WcOpcode::rdma_write) == IBV_WC_RDMA_WRITE);

void Cq::Events::notify(rc::Cq &) {
  int chan_wfd = cq->chan_wfd;
  if (chan_wfd < 0) return;
  // ibv_get_cq_event reads the CQ pointer (struct ib_uverbs_comp_event_desc).
  uint64_t handle = reinterpret_cast<uintptr_t>(&cq->vcq.cq);
  if (send(chan_wfd, &handle, sizeof handle, MSG_DONTWAIT) != sizeof handle)
    log().warn("completion event lost: {}", strerror(errno));
}

void Cq::Events::overflow(rc::Cq &) { cq->ctx->async_event(&cq->vcq.cq, IBV_EVENT_CQ_ERR); }

ibv_cq *create_cq(ibv_context *ibctx, int cqe, ibv_comp_channel *channel, int comp_vector) {
  if (cqe < 1 || cqe > (1 << 20) || comp_vector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  int wfd = -1;
  if (channel && (wfd = channel_writer(channel)) < 0) {
    errno = EINVAL;   // not a channel of a usrc context
    return nullptr;
  }
  auto *cq = new (std::nothrow) Cq(&impl(ibctx), static_cast<uint32_t>(cqe));
  if (!cq) {
    errno = ENOMEM;
    return nullptr;
  }
  cq->chan_wfd = wfd;
  cq->vcq.cq.cqe = cqe;
  return &cq->vcq.cq;
}

int destroy_cq(ibv_cq *ibcq) {
  Cq *cq = to_cq(ibcq);
  if (cq->qps.load()) return EBUSY;
  delete cq;
  return 0;
}

int resize_cq(ibv_cq *ibcq, int cqe) {
  Cq *cq = to_cq(ibcq);
  if (cqe < 1 || cqe > (1 << 20)) return EINVAL;
  cq->ring.resize(static_cast<uint32_t>(cqe));
  if (cq->ring.depth() != static_cast<uint32_t>(cqe)) return EINVAL;
  ibcq->cqe = cqe;
  return 0;
}

static int drain(Cq *cq, int ne, ibv_wc *wc) {
  rc::Completion c[16];
  int n = 0;
  while (n < ne) {
    size_t want = std::min<size_t>(16, ne - n);
    size_t got = cq->ring.poll(c, want);
    for (size_t i = 0; i < got; i++, n++) {
      ibv_wc &w = wc[n];
      w = {};
      w.wr_id = c[i].wr_id;
      w.status = static_cast<ibv_wc_status>(c[i].status);
      w.opcode = static_cast<ibv_wc_opcode>(c[i].opcode);
      w.byte_len = c[i].byte_len;
      w.qp_num = c[i].qp_num;
      w.src_qp = c[i].src_qp;
      w.slid = c[i].slid;
      if (c[i].with_imm) {
        w.wc_flags |= IBV_WC_WITH_IMM;
        w.imm_data = c[i].imm_be;
      }
    }
    if (got < want) break;
  }
  return n;
}

int poll_cq(ibv_cq *ibcq, int ne, ibv_wc *wc) {
  Cq *cq = to_cq(ibcq);
  if (ne <= 0) return 0;
  int n = drain(cq, ne, wc);
  if (n == 0) {
    // Nothing yet: receive and execute in the caller's thread (latency
    // comes from polling here, not from waking the progress thread).
    cq->ctx->try_progress();
    n = drain(cq, ne, wc);
  }
  return n;
}

int req_notify_cq(ibv_cq *ibcq, int solicited_only) {
  to_cq(ibcq)->ring.arm(solicited_only != 0);
  return 0;
}

void cq_event(ibv_cq *) {}

}  // namespace usrc
