// The verbs suite's common pieces: a device, QPs and their connection,
// posting and polling helpers (public libibverbs API only).
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include "usrc/device.h"
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace verbs_test {

using Clock = std::chrono::steady_clock;

struct Dev {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_port_attr port{};
  Dev() {
    const char *name = getenv("USRC_TEST_DEV");
    REQUIRE(name);
  int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    REQUIRE(list);
    for (int i = 0; i < n; i++)
      if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    REQUIRE(ctx);
    pd = ibv_alloc_pd(ctx);
    REQUIRE(pd);
    REQUIRE(ibv_query_port(ctx, 1, &port) == 0);
  }
  // A context and PD of the caller's (an import's), closed with it.
  Dev(ibv_context *c, ibv_pd *p) : ctx(c), pd(p) {
    REQUIRE(ctx);
    REQUIRE(pd);
    REQUIRE(ibv_query_port(ctx, 1, &port) == 0);
  }
  ~Dev() {
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
};

// A completion channel, destroyed with its scope (declared before the CQs
// that use it, it outlives them).
struct Channel {
  ibv_comp_channel *ch = nullptr;
  explicit Channel(Dev &d) : ch(ibv_create_comp_channel(d.ctx)) { REQUIRE(ch); }
  ~Channel() { ibv_destroy_comp_channel(ch); }
};

// An RC QP on a CQ of its own (with completion events on ch, if given);
// with send_ops, one of the extended API (ibv_create_qp_ex with those
// IBV_QP_EX_WITH_* operations).
struct Qp {
  ibv_cq *cq = nullptr;
  ibv_qp *qp = nullptr;
  Qp(Dev &d, uint32_t depth = 256, ibv_comp_channel *ch = nullptr, ibv_srq *srq = nullptr, uint64_t send_ops = 0) {
    cq = ibv_create_cq(d.ctx, 2 * depth + 8, nullptr, ch, 0);
    REQUIRE(cq);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.srq = srq;
    ia.cap = {depth, depth, 4, 4, 64};
    if (send_ops) {
      ibv_qp_init_attr_ex ix{};
      ix.send_cq = ix.recv_cq = cq;
      ix.qp_type = IBV_QPT_RC;
      ix.srq = srq;
      ix.cap = ia.cap;
      ix.pd = d.pd;
      ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      ix.send_ops_flags = send_ops;
      qp = ibv_create_qp_ex(d.ctx, &ix);
    } else {
      qp = ibv_create_qp(d.pd, &ia);
    }
    REQUIRE(qp);
  }
  ~Qp() {
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
  }
};

// An extended-API RC QP and its ibv_wr_* builders.
struct QpEx : Qp {
  ibv_qp_ex *x = nullptr;
  QpEx(Dev &d, uint64_t send_ops, uint32_t depth = 16) : Qp(d, depth, nullptr, nullptr, send_ops) {
    x = ibv_qp_to_qp_ex(qp);
    REQUIRE(x);
  }
};

struct Params {
  uint32_t sq_psn = 0, rq_psn = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 14, retry = 7, rnr_retry = 7, min_rnr = 12;
  int access = IBV_ACCESS_REMOTE_WRITE;
  uint8_t rd_atomic = 16;   // max_dest_rd_atomic and max_rd_atomic
};

inline int to_init(ibv_qp *qp, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

// The RTR attributes for a peer QP on this device (with a GRH on RoCE).
inline constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
inline ibv_qp_attr rtr_attr(Dev &d, uint32_t dest_qpn, const Params &p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p.mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = p.rd_atomic;
  a.min_rnr_timer = p.min_rnr;
  a.ah_attr.port_num = 1;
  a.ah_attr.dlid = d.port.lid;
  if (d.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    REQUIRE(ibv_query_gid(d.ctx, 1, 0, &a.ah_attr.grh.dgid) == 0);
    a.ah_attr.grh.hop_limit = 1;
  }
  return a;
}

inline int to_rtr(Dev &d, ibv_qp *qp, uint32_t dest_qpn, const Params &p) {
  ibv_qp_attr a = rtr_attr(d, dest_qpn, p);
  return ibv_modify_qp(qp, &a, kRtrMask);
}

inline int to_rts(ibv_qp *qp, const Params &p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry;
  a.rnr_retry = p.rnr_retry;
  a.max_rd_atomic = p.rd_atomic;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

inline void connect(Dev &d, Qp &a, uint32_t dest_qpn, Params p) {
  REQUIRE(to_init(a.qp, p.access) == 0);
  REQUIRE(to_rtr(d, a.qp, dest_qpn, p) == 0);
  REQUIRE(to_rts(a.qp, p) == 0);
}

inline void connect_pair(Dev &d, Qp &a, Qp &b, Params pa = {}, Params pb = {}) {
  pb.rq_psn = pa.sq_psn;
  pa.rq_psn = pb.sq_psn;
  connect(d, a, b.qp->qp_num, pa);
  connect(d, b, a.qp->qp_num, pb);
}

// A counter of the device under test, as `usrc stats` sums it (each
// context counts into its own file as it goes): UINT64_MAX if there is none.
inline uint64_t device_counter(usrc::Counter c) {
  uint64_t v[usrc::kNumCounters];
  std::string err;
  if (!usrc::read_counters(getenv("USRC_TEST_DEV"), v, &err)) return UINT64_MAX;
  return v[uint32_t(c)];
}

inline std::vector<ibv_wc> poll(ibv_cq *cq, size_t n, double seconds = 10) {
  std::vector<ibv_wc> out;
  auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (out.size() < n && Clock::now() < end) {
    ibv_wc wc[16];
    int k = ibv_poll_cq(cq, 16, wc);
    if (k < 0) FAIL("ibv_poll_cq failed");
    out.insert(out.end(), wc, wc + k);
  }
  return out;
}

inline int post_send(ibv_qp *qp, uint64_t id, ibv_wr_opcode op, ibv_sge *sge, int nsge, int flags,
              uint64_t raddr = 0, uint32_t rkey = 0, uint32_t imm = 0) {
  ibv_send_wr wr{}, *bad;
  wr.wr_id = id;
  wr.opcode = op;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.send_flags = flags;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  wr.imm_data = htonl(imm);
  return ibv_post_send(qp, &wr, &bad);
}

// UD: a QP taken to RTS with its Q_Key; an address handle to this device
// (with a GRH on RoCE, where it is required); a signaled datagram.
inline constexpr uint32_t kQkey = 0x11111111;

inline void ud_to_rts(ibv_qp *qp, uint32_t qkey = kQkey, uint32_t sq_psn = 77) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = qkey;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  a.qp_state = IBV_QPS_RTR;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = sq_psn;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

inline ibv_ah_attr ah_attr_to_self(Dev &d) {
  ibv_ah_attr a{};
  a.port_num = 1;
  a.dlid = d.port.lid;
  if (d.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.is_global = 1;
    REQUIRE(ibv_query_gid(d.ctx, 1, 0, &a.grh.dgid) == 0);
    a.grh.hop_limit = 1;
  }
  return a;
}

inline ibv_ah *ah_to_self(Dev &d, ibv_pd *pd) {
  ibv_ah_attr a = ah_attr_to_self(d);
  return ibv_create_ah(pd, &a);
}

inline int send_ud(ibv_qp *qp, uint64_t id, ibv_sge *sge, ibv_ah *ah, uint32_t qpn, uint32_t qkey = kQkey,
                   ibv_wr_opcode op = IBV_WR_SEND, uint32_t imm = 0) {
  ibv_send_wr wr{}, *bad;
  wr.wr_id = id;
  wr.opcode = op;
  wr.sg_list = sge;
  wr.num_sge = sge ? 1 : 0;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qpn;
  wr.wr.ud.remote_qkey = qkey;
  return ibv_post_send(qp, &wr, &bad);
}

// A responder that detects a remote error NAKs once and moves its QP to
// ERR, where it drops everything (IBA 9.9): if that NAK is lost
// (the loss test), the requester's retries time out instead.
inline bool remote_error(ibv_wc_status got, ibv_wc_status want) {
  return got == want || (getenv("USRC_TEST_LOSSY") && got == IBV_WC_RETRY_EXC_ERR);
}

inline ibv_recv_wr recv_wr(uint64_t id, ibv_sge *sge, int nsge) {
  ibv_recv_wr wr{};
  wr.wr_id = id;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  return wr;
}

inline int post_recv(ibv_qp *qp, uint64_t id, ibv_sge *sge, int nsge) {
  ibv_recv_wr wr = recv_wr(id, sge, nsge), *bad;
  return ibv_post_recv(qp, &wr, &bad);
}

// The next async event of the device, within `seconds`: false if none
// came (the event is acknowledged).
inline bool next_async_event(Dev &d, ibv_async_event *out, int seconds = 10) {
  pollfd pf{d.ctx->async_fd, POLLIN, 0};
  if (::poll(&pf, 1, seconds * 1000) != 1) return false;
  if (ibv_get_async_event(d.ctx, out) != 0) return false;
  ibv_ack_async_event(out);
  return true;
}

// Unmaps [p, p + len) and keeps the hole one: a placeholder without access
// takes its place at once, so that no allocation made later (a QP, the
// sanitizer's allocator) is given those addresses. An access still faults
// as it would on the unmapped range.
inline void unmap_keep_hole(void *p, size_t len) {
  REQUIRE(munmap(p, len) == 0);
  void *q = mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  REQUIRE(q == p);
}

}  // namespace verbs_test
