// Queue pairs: creation, the QP context (modify/query), and posting.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "usrc/cm/sa.h"
#include "usrc/boundary.h"
#include "usrc/usrc.h"

namespace usrc {

static rc::QpState to_rc(ibv_qp_state s) { return static_cast<rc::QpState>(s); }
static_assert(int(rc::QpState::sqe) == IBV_QPS_SQE && int(rc::QpState::err) == IBV_QPS_ERR);

// A QP of any type: ibpd is null for an XRC target (XRC_RECV), which has
// its XRC domain instead and no CQs or queues of its own; an XRC
// initiator (XRC_SEND) has no receive side.
static ibv_qp *make_qp(ibv_context *ibctx, ibv_pd *ibpd, ibv_qp_init_attr *ia, Xrcd *xrcd) {
  Context &c = impl(ibctx);
  Srq *srq = ia->srq ? to_srq(ia->srq) : nullptr;
  const bool ini = ia->qp_type == IBV_QPT_XRC_SEND, tgt = ia->qp_type == IBV_QPT_XRC_RECV;
  // (A parent domain's QP: its PD's protection, the parent domain's
  // allocators.)
  ibv_qp_cap &cap = ia->cap;
  // (On an SRQ the receive capacities are the SRQ's: ignored. An XRC
  // initiator receives nothing, a target has no queues at all.)
  if (srq || ini || tgt) cap.max_recv_wr = cap.max_recv_sge = 0;
  if (tgt) cap = {};
  if (ini && !ia->recv_cq) ia->recv_cq = ia->send_cq;   // (never given a receive completion)
  if (tgt != !ibpd || (tgt && (ia->send_cq || ia->recv_cq || srq)) || ((ini || tgt) && srq) ||
      (!tgt && (!ia->send_cq || !ia->recv_cq)) || cap.max_send_wr > rc::kMaxWr ||
      cap.max_recv_wr > rc::kMaxWr || cap.max_send_sge > rc::kMaxSge ||
      cap.max_recv_sge > rc::kMaxSge || cap.max_inline_data > rc::kMaxInline ||
      (srq && srq->ctx != &c)) {
    errno = EINVAL;
    return nullptr;
  }
  // Tag matching is RC's only (IBV_TM_CAP_RC).
  if (srq && srq->tm && ia->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  auto *qp = new (std::nothrow) Qp{};
  if (!qp) {
    errno = ENOMEM;
    return nullptr;
  }
  // Report what the QP really has (the caller reads it back).
  if (!tgt) {
    cap.max_send_wr = std::max(cap.max_send_wr, 1u);
    cap.max_recv_wr = srq || ini ? 0 : std::max(cap.max_recv_wr, 1u);
    cap.max_send_sge = rc::kMaxSge;
    cap.max_recv_sge = srq || ini ? 0 : rc::kMaxSge;
    cap.max_inline_data = rc::kMaxInline;
  }
  // The WQE arrays, from the parent domain's allocators if it has them,
  // made (and, if no QP comes of it, freed) outside the engine's lock.
  rc::QpStorage st;
  int e = ENOMEM;
  // (On a TM SRQ: room for the rendezvous's own WQEs too, rc/tm.h.)
  if (!no_throw([&] { st = rc::QpStorage(std::max(cap.max_send_wr, 1u), std::max(cap.max_recv_wr, 1u),
                                         ibpd ? to_pd(ibpd)->buffers() : nullptr, srq && srq->tm ? rc::kTmWqes : 0); }, &e)) {
    delete qp;
    errno = e;
    return nullptr;
  }
  {
    std::lock_guard g(c.engine().mu);
    qp->t = nullptr;
    if (!no_throw([&] { qp->t = c.engine().create_qp(std::max(cap.max_send_wr, 1u), std::max(cap.max_recv_wr, 1u), &st); }, &e) ||
        !qp->t) {
      delete qp;
      errno = e;
      return nullptr;
    }
    qp->t->user = qp;
    qp->t->pd = ibpd ? prot_pd(ibpd) : nullptr;   // (a target's: the SRQ's, per request)
    qp->t->send_cq = ia->send_cq ? &to_cq(ia->send_cq)->ring : nullptr;
    qp->t->recv_cq = ia->recv_cq ? &to_cq(ia->recv_cq)->ring : nullptr;
    qp->t->xrc = ini ? rc::XrcRole::ini : tgt ? rc::XrcRole::tgt : rc::XrcRole::none;
    qp->t->xrcd = xrcd ? xrcd->dom : nullptr;
    qp->t->sq_sig_all = ia->sq_sig_all;
    qp->t->type = ia->qp_type == IBV_QPT_UD   ? rc::QpType::ud
                  : ia->qp_type == IBV_QPT_UC ? rc::QpType::uc
                                              : rc::QpType::rc;
    if (srq) c.engine().use_srq(*qp->t, &srq->q);
  }
  qp->ctx = &c;
  qp->init = *ia;
  ibv_qp &q = qp->vqp.qp;
  q.context = ibctx;
  q.qp_context = ia->qp_context;
  q.pd = ibpd;
  q.send_cq = ia->send_cq;
  q.recv_cq = ia->recv_cq;
  q.srq = ia->srq;
  q.qp_num = qp->t->qpn;
  q.qp_type = ia->qp_type;
  q.state = IBV_QPS_RESET;
  q.events_completed = 0;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  qp->attr.qp_state = qp->attr.cur_qp_state = IBV_QPS_RESET;
  qp->attr.cap = cap;
  if (xrcd) {
    qp->vqp.xrcd = &xrcd->vx;
    qp->vqp.comp_mask |= VERBS_QP_XRCD;
    qp->xrcd = xrcd;
    xrcd->users++;
  }
  if (ibpd) to_pd(ibpd)->users++;
  if (ia->send_cq) to_cq(ia->send_cq)->qps++;
  if (ia->recv_cq) to_cq(ia->recv_cq)->qps++;
  if (srq) srq->qps++;
  if (tgt && !add_tgt(qp)) {   // (out of memory)
    destroy_qp(&q);
    errno = ENOMEM;
    return nullptr;
  }
  return &q;
}

ibv_qp *create_qp(ibv_pd *ibpd, ibv_qp_init_attr *ia) {
  if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC && ia->qp_type != IBV_QPT_UD &&
      ia->qp_type != IBV_QPT_XRC_SEND) {
    errno = ia->qp_type == IBV_QPT_XRC_RECV ? EINVAL : EOPNOTSUPP;   // (a target needs its XRC domain: _ex)
    return nullptr;
  }
  return make_qp(ibpd->context, ibpd, ia, nullptr);
}

ibv_qp *create_qp_ex(ibv_context *ibctx, ibv_qp_init_attr_ex *ia) {
  // The plain attributes, XRC and the extended send API; the other
  // extensions (create flags other than none, RSS, TSO, ...) are not
  // implemented.
  constexpr uint32_t kKnown = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                              IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if ((ia->comp_mask & ~kKnown) || ((ia->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ia->create_flags) ||
      (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC && ia->qp_type != IBV_QPT_UD &&
       ia->qp_type != IBV_QPT_XRC_SEND && ia->qp_type != IBV_QPT_XRC_RECV)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // An XRC target: of its XRC domain, no PD.
  const bool tgt = ia->qp_type == IBV_QPT_XRC_RECV;
  Xrcd *xrcd = tgt && (ia->comp_mask & IBV_QP_INIT_ATTR_XRCD) && ia->xrcd ? to_xrcd(ia->xrcd) : nullptr;
  if (tgt ? !xrcd || ia->xrcd->context != ibctx : !(ia->comp_mask & IBV_QP_INIT_ATTR_PD) || !ia->pd) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr a{};
  a.qp_context = ia->qp_context;
  a.send_cq = ia->send_cq;
  a.recv_cq = ia->recv_cq;
  a.srq = ia->srq;
  a.cap = ia->cap;
  a.qp_type = ia->qp_type;
  a.sq_sig_all = ia->sq_sig_all;
  ibv_qp *q = make_qp(ibctx, tgt ? nullptr : ia->pd, &a, xrcd);
  if (!q) return nullptr;
  ia->cap = a.cap;
  if (ia->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    if (int e = init_qp_ex(to_qp(q), ia->send_ops_flags)) {
      destroy_qp(q);
      errno = e;
      return nullptr;
    }
  }
  return q;
}

int destroy_qp(ibv_qp *ibqp) {
  Qp *qp = to_qp(ibqp);
  // (An XRC target's handle: the QP goes with its last one, xrc.cpp.)
  if (ibqp->qp_type == IBV_QPT_XRC_RECV) return close_tgt_handle(qp);
  destroy_qp_now(qp);
  return 0;
}

void destroy_qp_now(Qp *qp) {
  ibv_qp *ibqp = &qp->vqp.qp;
  rc::QpStorage back;   // (the allocators' arrays: freed at the end, outside the lock)
  {
    std::lock_guard g(qp->ctx->engine().mu);
    qp->ctx->engine().destroy_qp(qp->t, &back);
  }
  qp->ctx->kick();   // a lingering QP has a timer
  if (ibqp->pd) unuse(to_pd(ibqp->pd));
  if (ibqp->send_cq) to_cq(ibqp->send_cq)->qps--;
  if (ibqp->recv_cq) to_cq(ibqp->recv_cq)->qps--;
  if (ibqp->srq) to_srq(ibqp->srq)->qps--;
  delete qp;
}

static bool ipv4_mapped(const ibv_gid &g, uint32_t *ip) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g.raw, prefix, 12) != 0) return false;
  uint32_t be;
  std::memcpy(&be, g.raw + 12, 4);
  *ip = ntohl(be);
  return *ip != 0;
}

// The peer's IP from an address vector: from the DGID (IPv4-mapped) or, on
// InfiniBand link layer, from the DLID (include/usrc/device.h: the LID scheme,
// or the port's subnet administrator).
int resolve_ip(const DeviceConfig &cfg, const ibv_ah_attr &ah, uint32_t *ip_out) {
  // The port's LMC is 0: no source path bits (IBA 7.11.1).
  if (ah.port_num != 1 || ah.sl > 15 || ah.src_path_bits != 0 ||
      (ah.static_rate && ibv_rate_to_mbps(ibv_rate(ah.static_rate)) <= 0) ||
      (ah.is_global && ah.grh.flow_label > 0xfffff))
    return EINVAL;
  uint32_t ip = 0;
  if (ah.is_global) {
    if (ah.grh.sgid_index >= cfg.gid_tbl_len) return EINVAL;
    if (!ipv4_mapped(ah.grh.dgid, &ip) && cfg.link_layer == LinkLayer::roce) return EINVAL;
  } else if (cfg.link_layer == LinkLayer::roce) {
    return EINVAL;   // RoCE is GID-routed: the GRH is required
  }
  if (!ip) {
    if (ah.dlid == 0 || ah.dlid >= 0xc000) return EINVAL;
    if (!cfg.sa_ip) ip = ipv4_for_lid(cfg.ipv4, ah.dlid);
    else if (ah.dlid == cfg.lid) ip = cfg.ipv4;
    // LIDs from a subnet administrator: ask it (docs/sa.md).
    else if (int e = sa::resolve_lid({cfg.sa_ip, cfg.sa_port}, cfg.ipv4, ah.dlid, &ip)) return e;
  }
  *ip_out = ip;
  return 0;
}

// A QP's UDP port: on another host the RoCE v2 port (IBA A17.2.1), every
// QP's; else (or in the slot scheme) from its QPN's slot (0: no QP can
// have that QPN). docs/design.md "Addressing".
static uint16_t port_of_qpn(const DeviceConfig &cfg, uint32_t ip, uint32_t qpn) {
  if (cfg.roce_port && (ip >> 24) != 127 && ip != cfg.ipv4) return cfg.roce_port;
  const uint32_t slot = slot_of_qpn(qpn & wire::kMask24);
  return slot == 0 || slot > kMaxSlots || cfg.base_port + slot > 65535 ? 0 : uint16_t(cfg.base_port + slot);
}

// The peer's UDP endpoint from the address vector and the destination QPN.
static int resolve_peer(const DeviceConfig &cfg, const ibv_ah_attr &ah, uint32_t dest_qpn,
                        net::Endpoint *peer) {
  uint32_t ip;
  if (int e = resolve_ip(cfg, ah, &ip)) return e;
  const uint16_t port = port_of_qpn(cfg, ip, dest_qpn);
  if (!port) return EINVAL;
  *peer = {ip, port};
  return 0;
}

void path_of(const ibv_ah_attr &ah, uint8_t *tos, uint8_t *ttl, uint16_t *sport) {
  // With a GRH, its traffic class is the IP TOS byte, its hop limit the
  // TTL, its flow label the UDP source port (RoCE v2); without one, the SL
  // is the DSCP.
  *tos = ah.is_global ? ah.grh.traffic_class : uint8_t(ah.sl << 2);
  *ttl = ah.is_global ? ah.grh.hop_limit : 0;
  *sport = ah.is_global && ah.grh.flow_label ? uint16_t(0xc000 | (ah.grh.flow_label & 0x3fff)) : 0;
}

static uint32_t mtu_bytes(ibv_mtu m) { return 128u << m; }

int modify_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int mask) {
  Qp *qp = to_qp(ibqp)->real;   // (an XRC target's handle: the QP's state)
  Context &c = *qp->ctx;
  const DeviceConfig &cfg = c.cfg();
  std::unique_lock g(c.engine().mu);
  rc::Qp &t = *qp->t;
  auto cur = static_cast<ibv_qp_state>(t.state);
  ibv_qp_state next;
  if (int e = check_modify_qp(ibqp->qp_type, cur, *attr, mask, &next)) return e;

  // Values (checked before anything changes: a failed modify leaves the QP
  // as it was).
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return EINVAL;
  // (An MR's on-demand and relaxed-ordering bits mean nothing to a QP and
  // are let through, as the kernel does.)
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (attr->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_RELAXED_ORDERING)))
    return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) &&
      (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096 ||
       mtu_bytes(attr->path_mtu) > cfg.active_mtu))
    return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > rc::kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > rc::kMaxRdAtomic)
    return EINVAL;
  if ((mask & IBV_QP_RATE_LIMIT) && attr->rate_limit &&
      (attr->rate_limit < kMinRateLimitKbps || attr->rate_limit > kMaxRateLimitKbps))
    return EINVAL;
  net::Endpoint peer = t.attr.peer;
  if (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) {
    const ibv_ah_attr &ah = (mask & IBV_QP_AV) ? attr->ah_attr : qp->attr.ah_attr;
    uint32_t dqpn = (mask & IBV_QP_DEST_QPN) ? attr->dest_qp_num : qp->attr.dest_qp_num;
    if (int e = resolve_peer(cfg, ah, dqpn, &peer)) return e;
  }

  // Apply: the verbs attributes kept for query_qp, the transport's handed
  // to the engine in one change.
  ibv_qp_attr &s = qp->attr;
  rc::Engine::QpChange ch;
  rc::QpAttrs &ta = ch.attr;
  ta = t.attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = attr->pkey_index;
  if (mask & IBV_QP_QKEY) ta.qkey = s.qkey = attr->qkey;
  if (mask & IBV_QP_PORT) s.port_num = attr->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) ta.access = s.qp_access_flags = attr->qp_access_flags;
  if (mask & IBV_QP_AV) {
    s.ah_attr = attr->ah_attr;
    ta.dlid = attr->ah_attr.dlid;
    path_of(attr->ah_attr, &ta.tos, &ta.ttl, &ta.sport);   // the path on the wire
  }
  if (mask & IBV_QP_RATE_LIMIT) s.rate_limit = attr->rate_limit;
  if (mask & (IBV_QP_AV | IBV_QP_RATE_LIMIT)) {
    // Pacing: the lower of the static rate and the rate limit.
    uint64_t bps = 0;
    if (s.ah_attr.static_rate)
      bps = uint64_t(ibv_rate_to_mbps(ibv_rate(s.ah_attr.static_rate))) * 1000000;
    if (s.rate_limit && (!bps || uint64_t(s.rate_limit) * 1000 < bps)) bps = uint64_t(s.rate_limit) * 1000;
    ta.rate_bps = bps;
  }
  if (mask & IBV_QP_DEST_QPN) ta.dest_qpn = s.dest_qp_num = attr->dest_qp_num & wire::kMask24;
  ta.peer = peer;
  ch.new_peer = mask & (IBV_QP_AV | IBV_QP_DEST_QPN);
  if (mask & IBV_QP_PATH_MTU) {
    s.path_mtu = attr->path_mtu;
    ta.pmtu = mtu_bytes(attr->path_mtu);
  }
  if (mask & IBV_QP_RQ_PSN) ch.set_rq_psn = true, ch.rq_psn = s.rq_psn = attr->rq_psn & rc::kPsnMask;
  if (mask & IBV_QP_SQ_PSN) ch.set_sq_psn = true, ch.sq_psn = s.sq_psn = attr->sq_psn & rc::kPsnMask;
  if (mask & IBV_QP_TIMEOUT) ta.timeout = s.timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) ta.retry_cnt = s.retry_cnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) ta.rnr_retry = s.rnr_retry = attr->rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) ta.min_rnr_timer = s.min_rnr_timer = attr->min_rnr_timer;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) ta.max_rd_atomic = s.max_rd_atomic = attr->max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
    ta.max_dest_rd_atomic = s.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = attr->en_sqd_async_notify;
  if (next == IBV_QPS_SQD && cur != IBV_QPS_SQD)
    ta.sqd_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && attr->en_sqd_async_notify;
  if (next == IBV_QPS_RESET) {
    // Back to RESET forgets the connection (IBA 10.3.1.1).
    ibv_qp_cap cap = s.cap;
    s = {};
    s.cap = cap;
  }
  s.qp_state = s.cur_qp_state = next;
  ch.state = to_rc(next);
  c.engine().modify(t, ch);
  g.unlock();
  c.kick();
  return 0;
}

int query_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int, ibv_qp_init_attr *init) {
  Qp *qp = to_qp(ibqp)->real;
  std::lock_guard g(qp->ctx->engine().mu);
  *attr = qp->attr;
  // The transport may have moved the QP to ERR on its own.
  attr->qp_state = attr->cur_qp_state = static_cast<ibv_qp_state>(qp->t->state);
  attr->sq_draining = qp->t->state == rc::QpState::sqd && !qp->t->sq.empty();
  if (init) {
    *init = qp->init;
    init->qp_context = ibqp->qp_context;   // (an opened handle's own)
    init->cap = qp->attr.cap;
  }
  return 0;
}

// One SGE's memory: its MR (by lkey, of this PD, with local write access
// if write), the range within it; nullptr if any of that fails.
static inline uint8_t *map_sge(Context &c, const Pd *pd, const ibv_sge &in, bool write) {
  const Mr *mr = c.find_mr(in.lkey);
  if (!mr || mr->pd != pd) return nullptr;
  if (write && !(mr->access & IBV_ACCESS_LOCAL_WRITE)) return nullptr;
  return mr->map(in.addr, in.length);
}

// Local checks of one scatter/gather list (IBA 10.7.2.2): the lkey
// names an MR of the QP's PD that covers the range, with local write access
// where data will be written. Fills the transport's SGEs.
// *total: the bytes they add up to.
[[gnu::always_inline]] static inline bool map_sges(Context &c, const Pd *pd, const ibv_sge *in, int n, rc::Sge *out,
                                             bool write, uint64_t *total = nullptr) {
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    out[i] = {reinterpret_cast<uint8_t *>(in[i].addr), in[i].length, in[i].lkey};
    sum += in[i].length;
    if (in[i].length == 0) continue;
    out[i].addr = map_sge(c, pd, in[i], write);
    if (!out[i].addr) return false;
  }
  if (total) *total = sum;
  return true;
}

// A lone small SEND (ib_send_bw's, an MPI eager message's): one WR of one
// SGE or of inline data that the QP builds in place (rc::Engine::
// small_ready), checked for that case only and written straight into its
// send queue slot. False if it is not that case or fails a check: nothing
// is done then, and the general path posts it or says why not.
static inline bool post_small_send(Qp *qp, const ibv_send_wr *wr) {
  constexpr unsigned kFlags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;
  if (!wr || wr->next || wr->num_sge != 1 || (wr->send_flags & ~kFlags) ||
      (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM))
    return false;
  const uint32_t len = wr->sg_list[0].length;
  rc::Engine &e = qp->ctx->engine();
  rc::Qp &t = *qp->t;
  if (!t.send_room() || !e.small_ready(t, len)) return false;   // (inline: small_ready's limit is within kMaxInline)
  rc::SendWqe &w = t.sq.back();
  if (wr->send_flags & IBV_SEND_INLINE) w.wr.sge[0] = {reinterpret_cast<uint8_t *>(wr->sg_list[0].addr), len};
  else if (!map_sges(*qp->ctx, prot_pd(qp->vqp.qp.pd), wr->sg_list, 1, w.wr.sge, false)) return false;
  w.wr.wr_id = wr->wr_id;
  w.wr.opcode = static_cast<rc::WrOpcode>(wr->opcode);
  w.wr.flags = wr->send_flags;   // (the same bits: see the static_asserts)
  w.wr.imm_be = wr->imm_data;
  w.wr.num_sge = 1;
  e.post_small(t, w, len);
  return true;
}

static_assert(unsigned(rc::kSignaled) == IBV_SEND_SIGNALED && unsigned(rc::kSolicited) == IBV_SEND_SOLICITED &&
              unsigned(rc::kInline) == IBV_SEND_INLINE && unsigned(rc::kFence) == IBV_SEND_FENCE);

int post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad) {
  Qp *qp = to_qp(ibqp);
  int err = 0;
  {
    std::lock_guard g(qp->ctx->engine().mu);
    if (!post_small_send(qp, wr)) err = post_send_locked(qp, wr, bad);
  }
  qp->ctx->kick();
  return err;
}

// The checks that make ibv_post_send fail with an errno (this WR and the
// rest of the list are not posted). ibv_wr_complete runs them over its
// whole batch before posting any of it.
// *len: the message's length.
static inline int check_wr(const Qp *qp, const ibv_send_wr &wr, uint64_t *len_out) {
  if (qp->t->state <= rc::QpState::rtr) return EINVAL;   // RESET, INIT, RTR
  if (qp->t->xrc == rc::XrcRole::tgt) return EINVAL;     // an XRC target sends nothing
  // The supported opcodes: those in the WR opcode table (numbered as the
  // verbs number them, see the static_assert below).
  const rc::WrOpcodeInfo *op = rc::wr_opcode_info(static_cast<unsigned>(wr.opcode));
  if (!op) return EINVAL;
  const bool atomic = op->mask & rc::WR_ATOMIC;
  // UC carries SENDs and RDMA WRITEs only (IBA 9.8.2); SEND with
  // Invalidate is RC's here.
  if (qp->t->type == rc::QpType::uc &&
      (atomic || (op->mask & rc::WR_SINGLE) || wr.opcode == IBV_WR_RDMA_READ || wr.opcode == IBV_WR_SEND_WITH_INV))
    return EINVAL;
  if (op->mask & rc::WR_LOCAL) {   // (no SGEs, no inline data)
    if (wr.opcode == IBV_WR_BIND_MW && (!wr.bind_mw.mw || wr.bind_mw.mw->context != qp->vqp.qp.context))
      return EINVAL;
    *len_out = 0;
    return (wr.send_flags & IBV_SEND_INLINE) ? EINVAL : 0;
  }
  if (wr.num_sge < 0 || wr.num_sge > static_cast<int>(rc::kMaxSge)) return EINVAL;
  const bool inl = wr.send_flags & IBV_SEND_INLINE;
  // READ and ATOMIC write local memory: no inline data.
  if (inl && !(op->mask & rc::WR_INLINE_OK)) return EINVAL;
  // One 8-byte SGE receives an ATOMIC's original value (IBA 10.7.2.2).
  if (atomic && (wr.num_sge != 1 || wr.sg_list[0].length != 8)) return EINVAL;
  uint64_t len = 0;
  for (int i = 0; i < wr.num_sge; i++) len += wr.sg_list[i].length;
  if (len > rc::kMaxMsgSize || (inl && len > rc::kMaxInline)) return EINVAL;
  if ((op->mask & rc::WR_SINGLE) && len != 8) return EINVAL;   // an ATOMIC WRITE's word
  *len_out = len;
  return 0;
}

// A UD WR's own checks: a SEND of one packet at most, an AH of the QP's PD
// (a parent domain counting as its PD),
// a QPN that some QP can have (*port: its UDP port).
static int check_ud_wr(const Qp *qp, const ibv_send_wr &wr, uint64_t len, uint16_t *port) {
  const DeviceConfig &cfg = qp->ctx->cfg();
  *port = port_of_qpn(cfg, wr.wr.ud.ah ? to_ah(wr.wr.ud.ah)->dest.peer.ip : 0, wr.wr.ud.remote_qpn);
  if ((wr.opcode != IBV_WR_SEND && wr.opcode != IBV_WR_SEND_WITH_IMM) || len > cfg.active_mtu || !wr.wr.ud.ah ||
      prot_pd(wr.wr.ud.ah->pd) != prot_pd(qp->vqp.qp.pd) || !*port)
    return EINVAL;
  return 0;
}

int check_send_wr(const Qp *qp, const ibv_send_wr &wr) {
  uint64_t len;
  uint16_t port;
  if (int e = check_wr(qp, wr, &len)) return e;
  return qp->t->type == rc::QpType::ud ? check_ud_wr(qp, wr, len, &port) : 0;
}

static_assert(int(rc::WrOpcode::rdma_write) == IBV_WR_RDMA_WRITE &&
              int(rc::WrOpcode::rdma_write_imm) == IBV_WR_RDMA_WRITE_WITH_IMM &&
              int(rc::WrOpcode::send) == IBV_WR_SEND && int(rc::WrOpcode::send_imm) == IBV_WR_SEND_WITH_IMM &&
              int(rc::WrOpcode::rdma_read) == IBV_WR_RDMA_READ &&
              int(rc::WrOpcode::atomic_cmp_swp) == IBV_WR_ATOMIC_CMP_AND_SWP &&
              int(rc::WrOpcode::atomic_fetch_add) == IBV_WR_ATOMIC_FETCH_AND_ADD &&
              int(rc::WrOpcode::local_inv) == IBV_WR_LOCAL_INV && int(rc::WrOpcode::bind_mw) == IBV_WR_BIND_MW &&
              int(rc::WrOpcode::send_inv) == IBV_WR_SEND_WITH_INV &&
              int(rc::WrOpcode::atomic_write) == IBV_WR_ATOMIC_WRITE &&
              int(rc::WcOpcode::atomic_write) == IBV_WC_ATOMIC_WRITE);

// A send WR's SGEs into w (flags set): inline data is read at post time
// and needs no lkey (IBA 10.7.2.1); other SGEs are checked and mapped
// (write: the WR writes them, a READ or ATOMIC). False: a check failed.
static inline bool send_sges(Context &c, const Pd *pd, const ibv_send_wr &wr, rc::SendWr *w, bool write) {
  if (!(w->flags & rc::kInline)) return map_sges(c, pd, wr.sg_list, wr.num_sge, w->sge, write);
  for (int i = 0; i < wr.num_sge; i++)
    w->sge[i] = {reinterpret_cast<uint8_t *>(wr.sg_list[i].addr), wr.sg_list[i].length};
  return true;
}

// UD: SENDs of one packet at most (the port's MTU), each sent at once to
// its WR's address handle (of the QP's PD), QPN and Q_Key. A controlled
// Q_Key (its high bit set) in the WR means the QP's own (IBA 10.2.4).
static int post_ud_send(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
  Context &c = *qp->ctx;
  rc::Engine &e = c.engine();
  const Pd *pd = prot_pd(qp->vqp.qp.pd);
  int err = 0;
  for (; wr; wr = wr->next) {
    uint64_t len;
    uint16_t port;
    if ((err = check_wr(qp, *wr, &len)) || (err = check_ud_wr(qp, *wr, len, &port))) break;
    rc::SendWr w;
    w.wr_id = wr->wr_id;
    w.opcode = static_cast<rc::WrOpcode>(wr->opcode);
    w.flags = wr->send_flags & (rc::kSignaled | rc::kSolicited | rc::kInline);
    w.imm_be = wr->imm_data;
    w.num_sge = static_cast<uint32_t>(wr->num_sge);
    if (!send_sges(c, pd, *wr, &w, false)) {
      e.post_error(*qp->t, wr->wr_id, rc::WcOpcode::send, rc::WcStatus::loc_prot_err, false);
      continue;
    }
    rc::Engine::UdDest d = to_ah(wr->wr.ud.ah)->dest;
    d.peer.port = port;
    d.qpn = wr->wr.ud.remote_qpn & wire::kMask24;
    d.qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? qp->t->attr.qkey : wr->wr.ud.remote_qkey;
    e.post_datagram(*qp->t, w, static_cast<uint32_t>(len), d);
  }
  if (err && bad) *bad = wr;
  return err;
}

// Each WR is written straight into its send queue slot (Engine::send_slot).
int post_send_locked(Qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
  if (qp->t->type == rc::QpType::ud) return post_ud_send(qp, wr, bad);
  Context &c = *qp->ctx;
  rc::Engine &e = c.engine();
  const Pd *pd = prot_pd(qp->vqp.qp.pd);
  int err = 0;
  for (; wr; wr = wr->next) {
    uint64_t len;
    if ((err = check_wr(qp, *wr, &len))) break;   // (inlined here: the per-message path)
    if (rc::wr_info(static_cast<rc::WrOpcode>(wr->opcode)).mask & rc::WR_LOCAL) [[unlikely]] {
      if ((err = post_local_wr(qp, *wr, false))) break;
      continue;
    }
    rc::SendWr *w = e.send_slot(*qp->t);
    if (!w) {
      err = ENOMEM;
      break;
    }
    w->opcode = static_cast<rc::WrOpcode>(wr->opcode);   // (checked: a supported one)
    w->wr_id = wr->wr_id;
    w->flags = wr->send_flags & (rc::kFence | rc::kSignaled | rc::kSolicited | rc::kInline);
    w->imm_be = wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : wr->imm_data;
    w->xrc_srqn = wr->qp_type.xrc.remote_srqn;   // (an XRC initiator's: the XRCETH)
    w->num_sge = static_cast<uint32_t>(wr->num_sge);
    const bool rd = rc::is_rd_atomic(w->opcode);
    if (rc::wr_info(w->opcode).mask & rc::WR_ATOMIC) {
      w->remote_va = wr->wr.atomic.remote_addr;
      w->rkey = wr->wr.atomic.rkey;
      w->compare_add = wr->wr.atomic.compare_add;
      w->swap = wr->wr.atomic.swap;
    } else {
      w->remote_va = wr->wr.rdma.remote_addr;
      w->rkey = wr->wr.rdma.rkey;
    }
    if (!send_sges(c, pd, *wr, w, rd)) {
      e.post_error(*qp->t, wr->wr_id, rc::wr_info(w->opcode).wc_opcode, rc::WcStatus::loc_prot_err, false);
      continue;
    }
    e.post_slot(*qp->t, len);
  }
  if (err && bad) *bad = wr;
  return err;
}

// A receive's SGEs are checked at post time as a send's are, but one that
// fails is not an error yet: the WQE is posted marked bad (rc::RecvWqe::
// bad) and completes with a local protection error when a message uses it
// (the requester sees a remote operational error), as an lkey checked when
// the data arrives would. Returns false for such a WQE.
bool map_recv_sges(Context &c, const Pd *pd, const ibv_recv_wr &wr, rc::RecvWr *w, uint64_t *len) {
  w->wr_id = wr.wr_id;
  w->num_sge = static_cast<uint32_t>(wr.num_sge);
  uint64_t sum = 0;
  bool ok = true;
  for (int i = 0; i < wr.num_sge; i++) {
    const ibv_sge &g = wr.sg_list[i];
    w->sge[i] = {reinterpret_cast<uint8_t *>(g.addr), g.length, g.lkey};
    sum += g.length;
    if (!g.length) continue;
    w->sge[i].addr = map_sge(c, pd, g, true);
    ok &= w->sge[i].addr != nullptr;
  }
  *len = sum;
  return ok;
}

// The general path: a list of WRs, any number of SGEs, and every error.
[[gnu::noinline]] static int post_recv_list(Qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
  Context &c = *qp->ctx;
  rc::Engine &e = c.engine();
  const Pd *pd = prot_pd(qp->vqp.qp.pd);
  int err = 0;
  {
    std::lock_guard g(e.mu);
    for (; wr; wr = wr->next) {
      // (A QP on an SRQ takes the SRQ's receives: ibv_post_srq_recv.)
      if (wr->num_sge < 0 || wr->num_sge > static_cast<int>(rc::kMaxSge) ||
          qp->t->state == rc::QpState::reset || qp->vqp.qp.srq || qp->t->xrc != rc::XrcRole::none) {
        err = EINVAL;
        break;
      }
      rc::RecvWr *w = e.recv_slot(*qp->t);   // (written in place)
      if (!w) {
        err = ENOMEM;
        break;
      }
      uint64_t len;
      const bool ok = map_recv_sges(c, pd, *wr, w, &len);
      e.post_recv_slot(*qp->t, len, !ok);
    }
  }
  // (No kick: a receive arms no timer.)
  if (err && bad) *bad = wr;
  return err;
}

// A lone receive of one SGE (every receive of a stream's far end):
// checked for that case only (map_sge) and written straight into its
// slot. Anything else, and any check that fails, goes the general way,
// which says why.
int post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
  Qp *qp = to_qp(ibqp);
  // (XRC QPs have no receive queue: the general path refuses them.)
  if (!wr || wr->next || wr->num_sge != 1 || ibqp->srq || qp->t->xrc != rc::XrcRole::none)
    return post_recv_list(qp, wr, bad);
  Context &c = *qp->ctx;
  const ibv_sge &sge = wr->sg_list[0];
  rc::Engine &e = c.engine();
  rc::Qp &t = *qp->t;
  bool done = false;
  {
    std::lock_guard g(e.mu);   // (the MR table's lock too)
    rc::RecvWr *w = t.state != rc::QpState::reset ? e.recv_slot(t) : nullptr;   // (ERR: posted, then flushed)
    uint8_t *addr;
    if (w && (addr = map_sge(c, prot_pd(ibqp->pd), sge, true))) {
      w->wr_id = wr->wr_id;
      w->num_sge = 1;
      w->sge[0] = {addr, sge.length, sge.lkey};
      e.post_recv_slot(t, sge.length);
      done = true;
    }
  }
  return done ? 0 : post_recv_list(qp, wr, bad);
}

}  // namespace usrc
