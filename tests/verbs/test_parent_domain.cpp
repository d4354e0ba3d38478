// Thread domains and parent domains: their errors and busy rules, traffic
// on QPs, SRQs and CQs created on parent domains, and the parent domain's
// allocators (what they are asked for, and that all is given back).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <mutex>

#include "verbs_util.h"

using namespace verbs_test;

namespace {


// The resource types usrc passes to a parent domain's allocators
// (docs/design.md, "Protection, thread and parent domains"), and the alignment it asks for.
constexpr uint64_t kSendQueue = 1, kRecvQueue = 2, kSrqType = 3, kCqType = 4;
constexpr size_t kAlign = 64;

// An allocator that counts: every call, what it was asked for, and what is
// still out. Its memory is filled with garbage: the provider must not
// count on it being zeroed.
struct Counting {
  std::mutex mu;
  bool use_default = false;
  ibv_pd *expect_pd = nullptr;   // the parent domain the calls must name
  int allocs = 0, frees = 0, wrong = 0;
  std::map<uint64_t, int> by_type;       // alloc calls per resource type
  std::map<void *, uint64_t> live;       // memory out, and its type

  static void *alloc(ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type) {
    auto *c = static_cast<Counting *>(ctx);
    std::lock_guard g(c->mu);
    c->allocs++;
    c->by_type[type]++;
    if (align != kAlign || size == 0 || (c->expect_pd && pd != c->expect_pd)) c->wrong++;
    if (c->use_default) return IBV_ALLOCATOR_USE_DEFAULT;
    void *p = nullptr;
    if (posix_memalign(&p, align, size) != 0) return nullptr;
    std::memset(p, 0xa5, size);
    c->live[p] = type;
    return p;
  }
  static void free(ibv_pd *pd, void *ctx, void *p, uint64_t type) {
    auto *c = static_cast<Counting *>(ctx);
    std::lock_guard g(c->mu);
    c->frees++;
    auto it = c->live.find(p);
    if (it == c->live.end() || it->second != type || (c->expect_pd && pd != c->expect_pd)) {
      c->wrong++;
      return;
    }
    c->live.erase(it);
    ::free(p);
  }
  size_t out() {
    std::lock_guard g(mu);
    return live.size();
  }
};

// A parent domain over d.pd, with the counting allocators (or none).
ibv_pd *parent_domain(Dev &d, Counting *alloc, ibv_td *td = nullptr) {
  ibv_parent_domain_init_attr a{};
  a.pd = d.pd;
  a.td = td;
  if (alloc) {
    a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    a.alloc = Counting::alloc;
    a.free = Counting::free;
    a.pd_context = alloc;
  }
  ibv_pd *pd = ibv_alloc_parent_domain(d.ctx, &a);
  if (pd && alloc) alloc->expect_pd = pd;
  return pd;
}

// An extended CQ on a parent domain.
ibv_cq *cq_on(Dev &d, ibv_pd *domain, uint32_t cqe = 64) {
  ibv_cq_init_attr_ex a{};
  a.cqe = cqe;
  a.wc_flags = IBV_WC_STANDARD_FLAGS;
  a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  a.parent_domain = domain;
  ibv_cq_ex *cq = ibv_create_cq_ex(d.ctx, &a);
  return cq ? ibv_cq_ex_to_cq(cq) : nullptr;
}

// A QP of type t on pd (a parent domain here) and a CQ_ex on cq_domain.
struct PdQp {
  ibv_cq *cq = nullptr;
  ibv_qp *qp = nullptr;
  PdQp(Dev &d, ibv_pd *pd, ibv_pd *cq_domain, ibv_qp_type t = IBV_QPT_RC, ibv_srq *srq = nullptr) {
    cq = cq_on(d, cq_domain);
    REQUIRE(cq);
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = t;
    ia.srq = srq;
    ia.cap = {16, 16, 2, 2, 64};
    ia.comp_mask = IBV_QP_INIT_ATTR_PD;
    ia.pd = pd;
    qp = ibv_create_qp_ex(d.ctx, &ia);
    REQUIRE(qp);
    CHECK(qp->pd == pd);
  }
  ~PdQp() { destroy(); }
  void destroy() {
    if (qp) CHECK(ibv_destroy_qp(qp) == 0);
    if (cq) CHECK(ibv_destroy_cq(cq) == 0);
    qp = nullptr;
    cq = nullptr;
  }
};

void connect_rc(Dev &d, ibv_qp *a, ibv_qp *b) {
  Params p;
  p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  for (auto [q, peer] : {std::pair{a, b}, std::pair{b, a}}) {
    REQUIRE(to_init(q, p.access) == 0);
    REQUIRE(to_rtr(d, q, peer->qp_num, p) == 0);
    REQUIRE(to_rts(q, p) == 0);
  }
}

ibv_wc poll_one(ibv_cq *cq) {
  auto w = poll(cq, 1, 60);
  REQUIRE(w.size() == 1);
  return w[0];
}

// SEND and RDMA WRITE from a to b, data checked. a's buffer is registered
// on pa, b's on pb (a PD or a parent domain of it: one protection domain).
void rc_traffic(PdQp &a, PdQp &b, ibv_pd *pa, ibv_pd *pb) {
  std::vector<uint8_t> src(4096), dst(8192, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 7 + 3);
  ibv_mr *ma = ibv_reg_mr(pa, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mb = ibv_reg_mr(pb, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(ma);
  REQUIRE(mb);
  CHECK(ma->pd == pa);
  ibv_sge rs{uintptr_t(dst.data()), 4096, mb->lkey};
  REQUIRE(post_recv(b.qp, 7, &rs, 1) == 0);
  ibv_sge ss{uintptr_t(src.data()), 4096, ma->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED) == 0);
  ibv_wc w = poll_one(a.cq);
  CHECK(w.status == IBV_WC_SUCCESS);
  w = poll_one(b.cq);
  CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(w.wr_id == 7);
  CHECK(w.byte_len == 4096);
  CHECK(std::memcmp(dst.data(), src.data(), 4096) == 0);
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data() + 4096), mb->rkey) == 0);
  w = poll_one(a.cq);
  CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(w.opcode == IBV_WC_RDMA_WRITE);
  CHECK(std::memcmp(dst.data() + 4096, src.data(), 4096) == 0);
  CHECK(ibv_dereg_mr(ma) == 0);
  CHECK(ibv_dereg_mr(mb) == 0);
}

}  // namespace

TEST_CASE("thread domains: comp_mask checked; one in use by a parent domain is EBUSY", "[verbs][pd][parent]") {
  Dev d;
  ibv_td_init_attr ta{};
  ta.comp_mask = 1;
  errno = 0;
  CHECK(ibv_alloc_td(d.ctx, &ta) == nullptr);
  CHECK(errno == EINVAL);
  ta.comp_mask = 0;
  ibv_td *td = ibv_alloc_td(d.ctx, &ta);
  REQUIRE(td);
  CHECK(td->context == d.ctx);
  ibv_pd *pd = parent_domain(d, nullptr, td);
  REQUIRE(pd);
  CHECK(ibv_dealloc_td(td) == EBUSY);
  CHECK(ibv_dealloc_pd(d.pd) == EBUSY);   // (the parent domain is on it)
  CHECK(ibv_dealloc_pd(pd) == 0);
  CHECK(ibv_dealloc_td(td) == 0);
  // A TD with nothing on it goes at once.
  td = ibv_alloc_td(d.ctx, &ta);
  REQUIRE(td);
  CHECK(ibv_dealloc_td(td) == 0);
}

TEST_CASE("parent domains: the EINVAL cases of ibv_alloc_parent_domain and of a CQ's parent domain", "[verbs][pd][parent]") {
  Dev d, other;
  ibv_parent_domain_init_attr a{};
  const auto fails = [&](ibv_context *ctx) {
    errno = 0;
    ibv_pd *pd = ibv_alloc_parent_domain(ctx, &a);
    if (pd) ibv_dealloc_pd(pd);
    return !pd && errno == EINVAL;
  };
  CHECK(fails(d.ctx));                          // no PD
  a.pd = d.pd;
  a.comp_mask = 1 << 2;                         // an unknown bit
  CHECK(fails(d.ctx));
  a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;   // without the functions
  CHECK(fails(d.ctx));
  a.comp_mask = 0;
  CHECK(fails(other.ctx));                      // a PD of another context
  ibv_td_init_attr ta{};
  ibv_td *otd = ibv_alloc_td(other.ctx, &ta);
  REQUIRE(otd);
  a.td = otd;                                   // a TD of another context
  CHECK(fails(d.ctx));
  a.td = nullptr;
  ibv_pd *pd = ibv_alloc_parent_domain(d.ctx, &a);
  REQUIRE(pd);
  CHECK(pd->context == d.ctx);
  a.pd = pd;                                    // a parent domain is no PD for another
  CHECK(fails(d.ctx));
  // A CQ's parent domain must be one (not a PD, not missing).
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 8;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  for (ibv_pd *p : {d.pd, static_cast<ibv_pd *>(nullptr)}) {
    ca.parent_domain = p;
    errno = 0;
    CHECK(ibv_create_cq_ex(d.ctx, &ca) == nullptr);
    CHECK(errno == EINVAL);
  }
  ca.parent_domain = pd;
  CHECK(ibv_create_cq_ex(other.ctx, &ca) == nullptr);   // of another context
  CHECK(errno == EINVAL);
  CHECK(ibv_dealloc_pd(pd) == 0);
  CHECK(ibv_dealloc_td(otd) == 0);
}

TEST_CASE("RC on parent domains with allocators: SEND and RDMA WRITE; every array asked for aligned, and given back", "[verbs][pd][parent]") {
  Dev d;
  Counting ca, cb;
  ibv_pd *pa = parent_domain(d, &ca), *pb = parent_domain(d, &cb);
  REQUIRE(pa);
  REQUIRE(pb);
  {
    PdQp a(d, pa, pa), b(d, pb, pb);
    // Each QP's send and receive queues and its CQ's array.
    for (Counting *c : {&ca, &cb}) {
      CHECK(c->allocs == 3);
      CHECK(c->by_type[kSendQueue] == 1);
      CHECK(c->by_type[kRecvQueue] == 1);
      CHECK(c->by_type[kCqType] == 1);
      CHECK(c->out() == 3);
    }
    connect_rc(d, a.qp, b.qp);
    // MRs on the parent domains, then on the PD under them: one domain.
    rc_traffic(a, b, pa, pb);
    rc_traffic(a, b, d.pd, d.pd);
    rc_traffic(a, b, pa, d.pd);
    // The QP's parent domain is busy while they stand.
    CHECK(ibv_dealloc_pd(pa) == EBUSY);
    // A CQ resized on its parent domain: a new array, the old one freed.
    CHECK(ibv_resize_cq(a.cq, 200) == 0);
    CHECK(ca.by_type[kCqType] == 2);
    CHECK(ca.out() == 3);
    rc_traffic(a, b, pa, pb);
    // Destroyed after traffic (the QPs linger for the peer's sake, but
    // the application's memory is back when ibv_destroy_qp returns).
    a.destroy();
    CHECK(ca.out() == 0);
  }
  for (Counting *c : {&ca, &cb}) {
    CHECK(c->out() == 0);
    CHECK(c->frees == c->allocs);
    CHECK(c->wrong == 0);
  }
  CHECK(ibv_dealloc_pd(pa) == 0);
  CHECK(ibv_dealloc_pd(pb) == 0);
}

TEST_CASE("a parent domain's QP is checked against its PD: an MR of another PD fails with a protection error", "[verbs][pd][parent]") {
  Dev d;
  ibv_pd *pd = parent_domain(d, nullptr), *stranger = ibv_alloc_pd(d.ctx);
  REQUIRE(pd);
  REQUIRE(stranger);
  {
    PdQp a(d, pd, pd), b(d, d.pd, pd);
    connect_rc(d, a.qp, b.qp);
    std::vector<uint8_t> buf(64, 1);
    ibv_mr *mr = ibv_reg_mr(stranger, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr);
    ibv_sge s{uintptr_t(buf.data()), 64, mr->lkey};
    REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    CHECK(poll_one(a.cq).status == IBV_WC_LOC_PROT_ERR);
    CHECK(ibv_dereg_mr(mr) == 0);
  }
  CHECK(ibv_dealloc_pd(stranger) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("IBV_ALLOCATOR_USE_DEFAULT: the provider allocates, and frees nothing through the allocator", "[verbs][pd][parent]") {
  Dev d;
  Counting c;
  c.use_default = true;
  ibv_pd *pd = parent_domain(d, &c);
  REQUIRE(pd);
  {
    PdQp a(d, pd, pd), b(d, pd, pd);
    CHECK(c.allocs == 6);
    connect_rc(d, a.qp, b.qp);
    rc_traffic(a, b, pd, pd);
  }
  CHECK(c.allocs == 6);
  CHECK(c.frees == 0);
  CHECK(c.wrong == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("a CQ_ex on a parent domain: extended polling, and its allocator", "[verbs][pd][parent]") {
  Dev d;
  Counting c;
  ibv_pd *pd = parent_domain(d, &c);
  REQUIRE(pd);
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 32;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD | IBV_CQ_INIT_ATTR_MASK_FLAGS;
  ca.parent_domain = pd;
  ibv_cq_ex *cq = ibv_create_cq_ex(d.ctx, &ca);
  REQUIRE(cq);
  CHECK(c.by_type[kCqType] == 1);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);   // the CQ is on it
  {
    // QPs on the plain PD, completing into the parent domain's CQ.
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(cq);
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {8, 8, 1, 1, 0};
    ibv_qp *a = ibv_create_qp(d.pd, &ia), *b = ibv_create_qp(d.pd, &ia);
    REQUIRE(a);
    REQUIRE(b);
    connect_rc(d, a, b);
    std::vector<uint8_t> src(100, 0x5c), dst(100, 0);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), 100, 0), *md = ibv_reg_mr(pd, dst.data(), 100, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(ms);
    REQUIRE(md);
    ibv_sge rs{uintptr_t(dst.data()), 100, md->lkey}, ss{uintptr_t(src.data()), 100, ms->lkey};
    REQUIRE(post_recv(b, 9, &rs, 1) == 0);
    REQUIRE(post_send(a, 8, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED) == 0);
    std::map<uint64_t, ibv_wc_status> got;
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (got.size() < 2 && Clock::now() < end) {
      ibv_poll_cq_attr pa{};
      if (ibv_start_poll(cq, &pa) != 0) continue;
      do {
        got[cq->wr_id] = cq->status;
        if (cq->wr_id == 9) CHECK(ibv_wc_read_byte_len(cq) == 100);
      } while (ibv_next_poll(cq) == 0);
      ibv_end_poll(cq);
    }
    CHECK(got == std::map<uint64_t, ibv_wc_status>{{8, IBV_WC_SUCCESS}, {9, IBV_WC_SUCCESS}});
    CHECK(dst == src);
    CHECK(ibv_dereg_mr(ms) == 0);
    CHECK(ibv_dereg_mr(md) == 0);
    CHECK(ibv_destroy_qp(a) == 0);
    CHECK(ibv_destroy_qp(b) == 0);
  }
  CHECK(c.out() == 1);
  CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
  CHECK(c.out() == 0);
  CHECK(c.frees == c.allocs);
  CHECK(c.wrong == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("an SRQ on a parent domain: its WQE array from the allocator, resized, and SENDs through it", "[verbs][pd][parent]") {
  Dev d;
  Counting c;
  ibv_pd *pd = parent_domain(d, &c);
  REQUIRE(pd);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  ibv_srq *srq = ibv_create_srq(pd, &sa);
  REQUIRE(srq);
  CHECK(c.by_type[kSrqType] == 1);
  ibv_srq_attr ma{};
  ma.max_wr = 32;
  CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_MAX_WR) == 0);
  CHECK(c.by_type[kSrqType] == 2);
  CHECK(c.out() == 1);
  {
    PdQp a(d, pd, pd), b(d, pd, pd, IBV_QPT_RC, srq);
    connect_rc(d, a.qp, b.qp);
    std::vector<uint8_t> src(256), dst(256, 0);
    for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i ^ 0x3c);
    ibv_mr *ms = ibv_reg_mr(pd, src.data(), 256, 0), *md = ibv_reg_mr(d.pd, dst.data(), 256, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(ms);
    REQUIRE(md);
    ibv_sge rs{uintptr_t(dst.data()), 256, md->lkey}, ss{uintptr_t(src.data()), 256, ms->lkey};
    ibv_recv_wr rw = recv_wr(4, &rs, 1), *bad;
    REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0);
    REQUIRE(post_send(a.qp, 3, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED) == 0);
    // (a and b share nothing but the parent domain: two CQs.)
    CHECK(poll_one(a.cq).status == IBV_WC_SUCCESS);
    ibv_wc w = poll_one(b.cq);
    CHECK(w.status == IBV_WC_SUCCESS);
    CHECK(w.wr_id == 4);
    CHECK(dst == src);
    CHECK(ibv_dereg_mr(ms) == 0);
    CHECK(ibv_dereg_mr(md) == 0);
  }
  CHECK(c.out() == 1);
  CHECK(ibv_destroy_srq(srq) == 0);
  CHECK(c.out() == 0);
  CHECK(c.frees == c.allocs);
  CHECK(c.wrong == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("UD on a parent domain: datagrams through AHs of the parent domain and of its PD", "[verbs][pd][parent][unreliable]") {
  Dev d;
  Counting c;
  ibv_pd *pd = parent_domain(d, &c), *stranger = ibv_alloc_pd(d.ctx);
  REQUIRE(pd);
  REQUIRE(stranger);
  {
    PdQp a(d, pd, pd, IBV_QPT_UD), b(d, pd, pd, IBV_QPT_UD);
    CHECK(c.allocs == 6);
    ud_to_rts(a.qp);
    ud_to_rts(b.qp);
    ibv_ah *on_pd = ah_to_self(d, d.pd), *on_parent = ah_to_self(d, pd), *other = ah_to_self(d, stranger);
    REQUIRE(on_pd);
    REQUIRE(on_parent);
    REQUIRE(other);
    std::vector<uint8_t> src(512), dst(2 * (40 + 512), 0);
    for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 5 + 1);
    ibv_mr *ms = ibv_reg_mr(pd, src.data(), src.size(), 0);
    ibv_mr *md = ibv_reg_mr(pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(ms);
    REQUIRE(md);
    ibv_sge ss{uintptr_t(src.data()), 512, ms->lkey};
    int k = 0;
    for (ibv_ah *ah : {on_parent, on_pd}) {
      INFO("datagram " << k);
      ibv_sge rs{uintptr_t(dst.data() + k * (40 + 512)), 40 + 512, md->lkey};
      REQUIRE(post_recv(b.qp, 20 + k, &rs, 1) == 0);
      REQUIRE(send_ud(a.qp, 10 + k, &ss, ah, b.qp->qp_num) == 0);
      CHECK(poll_one(a.cq).status == IBV_WC_SUCCESS);
      ibv_wc w = poll_one(b.cq);
      CHECK(w.status == IBV_WC_SUCCESS);
      CHECK(w.wr_id == uint64_t(20 + k));
      CHECK(w.byte_len == 40 + 512);
      CHECK(w.src_qp == a.qp->qp_num);
      CHECK(std::memcmp(dst.data() + k * (40 + 512) + 40, src.data(), 512) == 0);
      k++;
    }
    // An AH of another PD is refused.
    CHECK(send_ud(a.qp, 12, &ss, other, b.qp->qp_num) == EINVAL);
    CHECK(ibv_dealloc_pd(pd) == EBUSY);
    CHECK(ibv_dereg_mr(ms) == 0);
    CHECK(ibv_dereg_mr(md) == 0);
    CHECK(ibv_destroy_ah(on_pd) == 0);
    CHECK(ibv_destroy_ah(on_parent) == 0);
    CHECK(ibv_destroy_ah(other) == 0);
  }
  CHECK(c.out() == 0);
  CHECK(c.frees == c.allocs);
  CHECK(c.wrong == 0);
  CHECK(ibv_dealloc_pd(stranger) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("parent domains: EBUSY while an MR, QP, SRQ, AH or CQ uses one, and for the PD under one", "[verbs][pd][parent]") {
  Dev d;
  ibv_pd *pd = parent_domain(d, nullptr);
  REQUIRE(pd);
  CHECK(ibv_dealloc_pd(d.pd) == EBUSY);
  std::vector<uint8_t> buf(64);
  ibv_mr *mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  CHECK(ibv_dereg_mr(mr) == 0);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq *srq = ibv_create_srq(pd, &sa);
  REQUIRE(srq);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  CHECK(ibv_destroy_srq(srq) == 0);
  ibv_ah *ah = ah_to_self(d, pd);
  REQUIRE(ah);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  CHECK(ibv_destroy_ah(ah) == 0);
  {
    ibv_cq *cq = ibv_create_cq(d.ctx, 8, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {4, 4, 1, 1, 0};
    ibv_qp *qp = ibv_create_qp(pd, &ia);
    REQUIRE(qp);
    CHECK(qp->pd == pd);
    CHECK(ibv_dealloc_pd(pd) == EBUSY);
    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
  }
  ibv_cq *cq = cq_on(d, pd);
  REQUIRE(cq);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
  // The PD is free again once its parent domain is gone (Dev deallocates it).
}
