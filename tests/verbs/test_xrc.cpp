// XRC: domains opened on a file, XRC SRQs, initiator (XRC_SEND) and target
// (XRC_RECV) QPs; each WR of an initiator names the target's SRQ that takes
// it, and the SRQ's CQ and PD serve it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

// A temporary file whose inode names an XRC domain.
struct TempFile {
  char path[32] = "/tmp/usrc-xrcd.XXXXXX";
  int fd = mkstemp(path);
  ~TempFile() {
    close(fd);
    unlink(path);
  }
};

ibv_xrcd *open_xrcd(Dev &d, int fd, int oflags) {
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = oflags;
  return ibv_open_xrcd(d.ctx, &a);
}

ibv_srq *xrc_srq(Dev &d, ibv_xrcd *x, ibv_cq *cq, uint32_t depth = 64) {
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = depth;
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  a.srq_type = IBV_SRQT_XRC;
  a.pd = d.pd;
  a.xrcd = x;
  a.cq = cq;
  return ibv_create_srq_ex(d.ctx, &a);
}

ibv_qp *xrc_qp(Dev &d, ibv_qp_type type, ibv_cq *cq, ibv_xrcd *x) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = type;
  if (type == IBV_QPT_XRC_SEND) {
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = d.pd;
    a.send_cq = cq;
    a.cap.max_send_wr = 64;
    a.cap.max_send_sge = 1;
  } else {
    a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    a.xrcd = x;
  }
  return ibv_create_qp_ex(d.ctx, &a);
}

// An initiator connected to a target of domain x on this device.
struct XrcPair {
  Dev &d;
  ibv_cq *scq;
  ibv_qp *ini, *tgt;
  XrcPair(Dev &dev, ibv_xrcd *x) : d(dev) {
    scq = ibv_create_cq(d.ctx, 256, nullptr, nullptr, 0);
    REQUIRE(scq);
    ini = xrc_qp(d, IBV_QPT_XRC_SEND, scq, x);
    tgt = xrc_qp(d, IBV_QPT_XRC_RECV, nullptr, x);
    REQUIRE(ini);
    REQUIRE(tgt);
    Params p;
    p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
    REQUIRE(to_init(tgt, p.access) == 0);
    REQUIRE(to_rtr(d, tgt, ini->qp_num, p) == 0);
    REQUIRE(to_init(ini, 0) == 0);
    REQUIRE(to_rtr(d, ini, tgt->qp_num, p) == 0);
    REQUIRE(to_rts(ini, p) == 0);
  }
  ~XrcPair() {
    ibv_destroy_qp(ini);
    ibv_destroy_qp(tgt);
    ibv_destroy_cq(scq);
  }
  // One WR to the target's SRQ srqn: its completion.
  ibv_wc post(ibv_wr_opcode op, ibv_sge *sge, uint32_t srqn, uint64_t raddr = 0, uint32_t rkey = 0) {
    ibv_send_wr wr{}, *bad;
    wr.wr_id = op;
    wr.opcode = op;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic = {raddr, 5, 0, rkey};
    } else {
      wr.wr.rdma = {raddr, rkey};
    }
    REQUIRE(ibv_post_send(ini, &wr, &bad) == 0);
    auto w = poll(scq, 1);
    REQUIRE(w.size() == 1);
    return w[0];
  }
};

// A domain (fd's file's, or a new one) with n XRC SRQs, each on a CQ of
// its own, and their numbers; what the test has not destroyed goes with
// its scope.
struct XrcSrqs {
  ibv_xrcd *x = nullptr;
  std::vector<ibv_cq *> cq;
  std::vector<ibv_srq *> srq;
  std::vector<uint32_t> num;
  XrcSrqs(Dev &d, int n, int fd = -1) {
    x = open_xrcd(d, fd, O_CREAT);
    REQUIRE(x);
    for (int i = 0; i < n; i++) {
      cq.push_back(ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0));
      REQUIRE(cq.back());
      srq.push_back(xrc_srq(d, x, cq.back()));
      REQUIRE(srq.back());
      num.push_back(0);
      REQUIRE(ibv_get_srq_num(srq.back(), &num.back()) == 0);
    }
  }
  // SRQ i, then its CQ.
  void destroy(size_t i) {
    CHECK(ibv_destroy_srq(srq[i]) == 0);
    srq[i] = nullptr;
    CHECK(ibv_destroy_cq(cq[i]) == 0);
    cq[i] = nullptr;
  }
  int close() { return ibv_close_xrcd(std::exchange(x, nullptr)); }
  ~XrcSrqs() {
    for (size_t i = 0; i < srq.size(); i++) {
      if (srq[i]) ibv_destroy_srq(srq[i]);
      if (cq[i]) ibv_destroy_cq(cq[i]);
    }
    if (x) ibv_close_xrcd(x);
  }
};

constexpr uint32_t kOpenMask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;

ibv_qp *open_tgt(ibv_context *ctx, ibv_xrcd *x, uint32_t qpn, void *qp_context = nullptr,
                 uint32_t mask = kOpenMask | IBV_QP_OPEN_ATTR_CONTEXT, ibv_qp_type type = IBV_QPT_XRC_RECV) {
  ibv_qp_open_attr a{};
  a.comp_mask = mask;
  a.qp_num = qpn;
  a.xrcd = x;
  a.qp_context = qp_context;
  a.qp_type = type;
  return ibv_open_qp(ctx, &a);
}

ibv_qp_state state_of(ibv_qp *qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  REQUIRE(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0);
  return a.qp_state;
}

}  // namespace

TEST_CASE("XRC domains: one per file inode, O_CREAT and O_EXCL as the kernel's, busy while used", "[verbs][xrc]") {
  Dev d;
  TempFile f;
  REQUIRE(f.fd >= 0);
  errno = 0;
  CHECK(open_xrcd(d, f.fd, 0) == nullptr);   // none yet, and not to be made
  CHECK(errno == EINVAL);
  ibv_xrcd *a = open_xrcd(d, f.fd, O_CREAT);
  REQUIRE(a);
  errno = 0;
  CHECK(open_xrcd(d, f.fd, O_CREAT | O_EXCL) == nullptr);
  CHECK(errno == EEXIST);
  ibv_xrcd *b = open_xrcd(d, f.fd, 0);   // the same domain
  REQUIRE(b);
  CHECK(open_xrcd(d, -1, 0) == nullptr);
  ibv_xrcd *own = open_xrcd(d, -1, O_CREAT);
  REQUIRE(own);
  // An SRQ of the domain opened through a serves targets opened through b.
  ibv_cq *cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_srq *s = xrc_srq(d, a, cq);
  REQUIRE(s);
  uint32_t n = 0;
  CHECK(ibv_get_srq_num(s, &n) == 0);
  CHECK(n != 0);
  CHECK(ibv_close_xrcd(a) == EBUSY);
  {
    XrcPair x(d, b);
    std::vector<uint8_t> src(64, 0x71), dst(64, 0);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), 64, 0), *md = ibv_reg_mr(d.pd, dst.data(), 64, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge rs{uintptr_t(dst.data()), 64, md->lkey};
    ibv_recv_wr rw = recv_wr(9, &rs, 1), *bad;
    REQUIRE(ibv_post_srq_recv(s, &rw, &bad) == 0);
    ibv_sge ss{uintptr_t(src.data()), 64, ms->lkey};
    CHECK(x.post(IBV_WR_SEND, &ss, n).status == IBV_WC_SUCCESS);
    auto w = poll(cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_SUCCESS);
    CHECK(w[0].qp_num == x.tgt->qp_num);
    CHECK(dst == src);
    // Targets of another domain do not reach it.
    XrcPair y(d, own);
    CHECK(remote_error(y.post(IBV_WR_SEND, &ss, n).status, IBV_WC_REM_INV_REQ_ERR));
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
  }
  CHECK(ibv_destroy_srq(s) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_close_xrcd(a) == 0);
  CHECK(ibv_close_xrcd(b) == 0);
  CHECK(ibv_close_xrcd(own) == 0);
}

TEST_CASE("XRC traffic: SENDs to two SRQs by number, RDMA WRITE, READ and ATOMIC through a target; misuse refused", "[verbs][xrc]") {
  Dev d;
  XrcSrqs xs(d, 2);
  ibv_xrcd *x = xs.x;
  ibv_cq *cq1 = xs.cq[0], *cq2 = xs.cq[1];
  ibv_srq *s1 = xs.srq[0], *s2 = xs.srq[1];
  const uint32_t n1 = xs.num[0], n2 = xs.num[1];
  CHECK(n1 != n2);
  {
    XrcPair p(d, x);
    // A multi-packet SEND to each SRQ, completed on that SRQ's CQ.
    std::vector<uint8_t> src(5000), d1(5000), d2(5000);
    for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 7);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr *m1 = ibv_reg_mr(d.pd, d1.data(), d1.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    ibv_mr *m2 = ibv_reg_mr(d.pd, d2.data(), d2.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_sge r1{uintptr_t(d1.data()), 5000, m1->lkey}, r2{uintptr_t(d2.data()), 5000, m2->lkey};
    ibv_recv_wr w1 = recv_wr(1, &r1, 1), w2 = recv_wr(2, &r2, 1), *bad;
    REQUIRE(ibv_post_srq_recv(s1, &w1, &bad) == 0);
    REQUIRE(ibv_post_srq_recv(s2, &w2, &bad) == 0);
    ibv_sge ss{uintptr_t(src.data()), 5000, ms->lkey};
    CHECK(p.post(IBV_WR_SEND, &ss, n2).status == IBV_WC_SUCCESS);
    CHECK(p.post(IBV_WR_SEND, &ss, n1).status == IBV_WC_SUCCESS);
    auto c2 = poll(cq2, 1), c1 = poll(cq1, 1);
    REQUIRE(c1.size() == 1);
    REQUIRE(c2.size() == 1);
    CHECK(c1[0].wr_id == 1);
    CHECK(c2[0].wr_id == 2);
    CHECK(c1[0].byte_len == 5000);
    CHECK(d1 == src);
    CHECK(d2 == src);
    // RDMA through the target (the SRQ's PD checks the key).
    std::fill(d1.begin(), d1.end(), 0);
    CHECK(p.post(IBV_WR_RDMA_WRITE, &ss, n1, uintptr_t(d1.data()), m1->rkey).status == IBV_WC_SUCCESS);
    CHECK(d1 == src);
    std::vector<uint8_t> back(5000, 0);
    ibv_mr *mb = ibv_reg_mr(d.pd, back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_sge bs{uintptr_t(back.data()), 5000, mb->lkey};
    CHECK(p.post(IBV_WR_RDMA_READ, &bs, n1, uintptr_t(d1.data()), m1->rkey).status == IBV_WC_SUCCESS);
    CHECK(back == src);
    alignas(8) uint64_t word = 10, old = 0;
    ibv_mr *mw = ibv_reg_mr(d.pd, &word, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
    ibv_mr *mo = ibv_reg_mr(d.pd, &old, 8, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge os{uintptr_t(&old), 8, mo->lkey};
    CHECK(p.post(IBV_WR_ATOMIC_FETCH_AND_ADD, &os, n1, uintptr_t(&word), mw->rkey).status == IBV_WC_SUCCESS);
    CHECK(old == 10);
    CHECK(word == 15);
    // No receive queue on either side, no sends from a target.
    CHECK(post_recv(p.ini, 3, &r1, 1) == EINVAL);
    CHECK(post_recv(p.tgt, 3, &r1, 1) == EINVAL);
    CHECK(post_send(p.tgt, 3, IBV_WR_SEND, &ss, 1, 0) == EINVAL);
    // An SRQ number the target's domain does not have: an invalid request.
    CHECK(remote_error(p.post(IBV_WR_SEND, &ss, (n1 ^ n2) | 1).status, IBV_WC_REM_INV_REQ_ERR));
    for (ibv_mr *m : {ms, m1, m2, mb, mw, mo}) ibv_dereg_mr(m);
  }
  // A target is created with its domain only (ibv_create_qp_ex).
  ibv_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_XRC_RECV;
  errno = 0;
  CHECK(ibv_create_qp(d.pd, &ia) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(ibv_destroy_cq(cq1) == EBUSY);   // (the SRQ's)
  xs.destroy(0);
  xs.destroy(1);
  CHECK(xs.close() == 0);
}

TEST_CASE("XRC: an SRQ and its CQ destroyed under the target that served them; the target goes on", "[verbs][xrc]") {
  Dev d;
  XrcSrqs xs(d, 2);
  ibv_xrcd *x = xs.x;
  ibv_cq *cq1 = xs.cq[0], *cq2 = xs.cq[1];
  ibv_srq *s1 = xs.srq[0], *s2 = xs.srq[1];
  const uint32_t n1 = xs.num[0], n2 = xs.num[1];
  {
    XrcPair p(d, x);
    std::vector<uint8_t> src(100, 9), dst(100, 0);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_sge ss{uintptr_t(src.data()), 100, ms->lkey}, rs{uintptr_t(dst.data()), 100, md->lkey};
    ibv_recv_wr w = recv_wr(1, &rs, 1), *bad;
    REQUIRE(ibv_post_srq_recv(s1, &w, &bad) == 0);
    REQUIRE(ibv_post_srq_recv(s1, &w, &bad) == 0);   // (one left when s1 goes)
    CHECK(p.post(IBV_WR_SEND, &ss, n1).status == IBV_WC_SUCCESS);
    REQUIRE(poll(cq1, 1).size() == 1);
    // The target last took s1's queue, CQ and PD: both go while it lives.
    xs.destroy(0);
    // s1's number is now unknown to the target; s2 still serves.
    CHECK(remote_error(p.post(IBV_WR_SEND, &ss, n1).status, IBV_WC_REM_INV_REQ_ERR));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(p.tgt, &a, IBV_QP_STATE) == 0);
    a.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(p.tgt, &a, IBV_QP_STATE) == 0);
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
  }
  {
    XrcPair p(d, x);
    std::vector<uint8_t> src(100, 5), dst(100, 0);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_sge ss{uintptr_t(src.data()), 100, ms->lkey}, rs{uintptr_t(dst.data()), 100, md->lkey};
    ibv_recv_wr w = recv_wr(2, &rs, 1), *bad;
    REQUIRE(ibv_post_srq_recv(s2, &w, &bad) == 0);
    CHECK(p.post(IBV_WR_SEND, &ss, n2).status == IBV_WC_SUCCESS);
    auto c = poll(cq2, 1);
    REQUIRE(c.size() == 1);
    CHECK(c[0].wr_id == 2);
    CHECK(dst == src);
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
  }
  xs.destroy(1);
  CHECK(xs.close() == 0);
}

TEST_CASE("ibv_open_qp: a target's handles in its context and in another; each modifies, queries and gets its events; the QP lives while any handle does", "[verbs][xrc]") {
  TempFile f;
  auto d = std::make_unique<Dev>();   // the target's context, closed before its last handle
  Dev d2;                             // another context of this process
  ibv_xrcd *x = open_xrcd(*d, f.fd, O_CREAT), *x2 = open_xrcd(d2, f.fd, 0);   // (one domain)
  REQUIRE(x);
  REQUIRE(x2);
  ibv_cq *cq = ibv_create_cq(d->ctx, 64, nullptr, nullptr, 0), *cq2 = ibv_create_cq(d2.ctx, 64, nullptr, nullptr, 0);
  REQUIRE(cq);
  REQUIRE(cq2);
  ibv_srq *srq = xrc_srq(*d, x, cq);
  REQUIRE(srq);
  uint32_t srqn;
  REQUIRE(ibv_get_srq_num(srq, &srqn) == 0);
  ibv_qp *tgt = xrc_qp(*d, IBV_QPT_XRC_RECV, nullptr, x), *ini = xrc_qp(d2, IBV_QPT_XRC_SEND, cq2, nullptr);
  REQUIRE(tgt);
  REQUIRE(ini);
  const uint32_t n = tgt->qp_num;
  int m1, m2;
  ibv_qp *h1 = open_tgt(d->ctx, x, tgt->qp_num, &m1), *h2 = open_tgt(d2.ctx, x2, tgt->qp_num, &m2);
  REQUIRE(h1);
  REQUIRE(h2);
  CHECK(h1 != tgt);
  CHECK(h1->qp_num == tgt->qp_num);
  CHECK(h1->qp_type == IBV_QPT_XRC_RECV);
  CHECK(h1->qp_context == &m1);
  CHECK(h1->context == d->ctx);
  CHECK(h1->pd == nullptr);
  CHECK(h2->context == d2.ctx);
  CHECK(h2->qp_context == &m2);

  // One QP whichever handle takes it through its states.
  Params p;
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  REQUIRE(to_init(h1, 0) == 0);
  REQUIRE(to_rtr(d2, h2, ini->qp_num, p) == 0);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(tgt, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi) == 0);
  CHECK(qa.qp_state == IBV_QPS_RTR);
  CHECK(qa.dest_qp_num == ini->qp_num);
  REQUIRE(ibv_query_qp(h2, &qa, IBV_QP_STATE, &qi) == 0);
  CHECK(qi.qp_context == &m2);
  CHECK(state_of(h1) == IBV_QPS_RTR);
  REQUIRE(to_init(ini, 0) == 0);
  REQUIRE(to_rtr(d2, ini, tgt->qp_num, p) == 0);
  REQUIRE(to_rts(ini, p) == 0);

  std::vector<uint8_t> src(300, 3), dst(300, 0);
  ibv_mr *ms = ibv_reg_mr(d2.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *md = ibv_reg_mr(d->pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(ms);
  REQUIRE(md);
  auto send = [&](uint64_t id) {
    ibv_sge rs{uintptr_t(dst.data()), 300, md->lkey}, ss{uintptr_t(src.data()), 300, ms->lkey};
    ibv_recv_wr rw = recv_wr(id, &rs, 1), *rbad;
    REQUIRE(ibv_post_srq_recv(srq, &rw, &rbad) == 0);
    ibv_send_wr wr{}, *bad;
    wr.wr_id = id;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &ss;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    REQUIRE(ibv_post_send(ini, &wr, &bad) == 0);
    auto w = poll(cq2, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_SUCCESS);
    auto r = poll(cq, 1);
    REQUIRE(r.size() == 1);
    CHECK(r[0].wr_id == id);
  };
  send(1);
  // The first request established it: an event for each handle, in its
  // own context.
  ibv_async_event ev;
  std::vector<ibv_qp *> got;
  for (int i = 0; i < 2 && next_async_event(*d, &ev); i++) {
    CHECK(ev.event_type == IBV_EVENT_COMM_EST);
    got.push_back(ev.element.qp);
  }
  std::sort(got.begin(), got.end());
  std::vector<ibv_qp *> want{tgt, h1};
  std::sort(want.begin(), want.end());
  CHECK(got == want);
  REQUIRE(next_async_event(d2, &ev));
  CHECK(ev.event_type == IBV_EVENT_COMM_EST);
  CHECK(ev.element.qp == h2);

  // The creator's handle goes first: the QP stays, and serves.
  CHECK(ibv_destroy_qp(tgt) == 0);
  CHECK(state_of(h1) == IBV_QPS_RTR);
  send(2);
  CHECK(ibv_destroy_qp(h1) == 0);
  send(3);
  CHECK(dst == src);

  // Its context closes (its objects gone first); the last handle, another
  // context's, still drives the QP.
  CHECK(ibv_dereg_mr(md) == 0);
  CHECK(ibv_destroy_srq(srq) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_close_xrcd(x) == 0);
  d.reset();
  CHECK(state_of(h2) == IBV_QPS_RTR);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  CHECK(ibv_modify_qp(h2, &err, IBV_QP_STATE) == 0);
  CHECK(state_of(h2) == IBV_QPS_ERR);
  CHECK(ibv_close_xrcd(x2) == EBUSY);   // (h2 is of it)
  CHECK(ibv_destroy_qp(h2) == 0);
  // Gone with its last handle.
  errno = 0;
  CHECK(open_tgt(d2.ctx, x2, n) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(ibv_dereg_mr(ms) == 0);
  CHECK(ibv_destroy_qp(ini) == 0);
  CHECK(ibv_destroy_cq(cq2) == 0);
  CHECK(ibv_close_xrcd(x2) == 0);
}

TEST_CASE("ibv_open_qp: misuse refused (attributes, numbers, domains); an opened handle posts nothing", "[verbs][xrc]") {
  Dev d, d2;
  ibv_xrcd *x = open_xrcd(d, -1, O_CREAT), *xo = open_xrcd(d, -1, O_CREAT), *x2 = open_xrcd(d2, -1, O_CREAT);
  REQUIRE(x);
  REQUIRE(xo);
  REQUIRE(x2);
  ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_qp *tgt = xrc_qp(d, IBV_QPT_XRC_RECV, nullptr, x), *ini = xrc_qp(d, IBV_QPT_XRC_SEND, cq, nullptr);
  REQUIRE(tgt);
  REQUIRE(ini);
  const uint32_t n = tgt->qp_num;
  auto refused = [](ibv_qp *q, int e) {
    const int got = errno;
    if (q) ibv_destroy_qp(q);
    CHECK(q == nullptr);
    CHECK(got == e);
  };
  errno = 0;
  refused(ibv_open_qp(d.ctx, nullptr), EINVAL);
  for (uint32_t missing : {IBV_QP_OPEN_ATTR_NUM, IBV_QP_OPEN_ATTR_XRCD, IBV_QP_OPEN_ATTR_TYPE}) {
    errno = 0;
    refused(open_tgt(d.ctx, x, n, nullptr, kOpenMask & ~missing), EINVAL);
  }
  errno = 0;
  refused(open_tgt(d.ctx, x, n, nullptr, kOpenMask | IBV_QP_OPEN_ATTR_RESERVED), EOPNOTSUPP);
  errno = 0;
  refused(open_tgt(d.ctx, x, n, nullptr, kOpenMask, IBV_QPT_RC), EINVAL);
  errno = 0;
  refused(open_tgt(d.ctx, x, ini->qp_num), EINVAL);   // an initiator
  errno = 0;
  refused(open_tgt(d.ctx, x, 0xffffff), EINVAL);      // none
  errno = 0;
  refused(open_tgt(d.ctx, xo, n), EINVAL);            // another domain's
  errno = 0;
  refused(open_tgt(d.ctx, x2, n), EINVAL);            // a domain of another context
  errno = 0;
  refused(open_tgt(d2.ctx, x2, n), EINVAL);           // (and not in that one)

  ibv_qp *h = open_tgt(d.ctx, x, n, nullptr, kOpenMask);
  REQUIRE(h);
  CHECK(h->qp_context == nullptr);
  std::vector<uint8_t> buf(16);
  ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge sge{uintptr_t(buf.data()), 16, mr->lkey};
  CHECK(post_recv(h, 1, &sge, 1) == EINVAL);
  CHECK(post_send(h, 1, IBV_WR_SEND, &sge, 1, 0) == EINVAL);
  ibv_qp_attr bad{};
  bad.qp_state = IBV_QPS_RTS;   // (RESET to RTS)
  CHECK(ibv_modify_qp(h, &bad, IBV_QP_STATE) == EINVAL);
  CHECK(ibv_close_xrcd(x) == EBUSY);
  // A handle destroyed before the creator's: the QP stays.
  CHECK(ibv_destroy_qp(h) == 0);
  CHECK(state_of(tgt) == IBV_QPS_RESET);
  ibv_qp *again = open_tgt(d.ctx, x, n);
  REQUIRE(again);
  CHECK(ibv_destroy_qp(tgt) == 0);
  CHECK(ibv_destroy_qp(again) == 0);
  errno = 0;
  refused(open_tgt(d.ctx, x, n), EINVAL);   // gone with its last handle
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_qp(ini) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  for (ibv_xrcd *c : {x, xo, x2}) CHECK(ibv_close_xrcd(c) == 0);
}

namespace {

// The child of the two-process test (no Catch2 in a forked child): opens
// the device and the domain file, creates an XRC SRQ and sends its number
// up `up`; then waits for the parent's target and initiator QPNs on
// `down`, posts two receives (the parent's SENDs, forwarded by its target,
// wait for them here meanwhile), checks what completes and sends its
// verdict up (0: good, else which check failed); then waits for the word
// to go and leaves without cleaning up (as a process killed would).
int xrc_child(const char *path, int up, int down) {
  const auto wait_read = [](int fd, void *p, size_t n) {
    pollfd pf{fd, POLLIN, 0};
    return ::poll(&pf, 1, 20000) == 1 && read(fd, p, n) == ssize_t(n);
  };
  const char *name = getenv("USRC_TEST_DEV");
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  ibv_context *ctx = nullptr;
  for (int i = 0; list && i < n; i++)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  if (!ctx) return 1;
  ibv_pd *pd = ibv_alloc_pd(ctx);
  ibv_cq *cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  const int fd = open(path, O_RDONLY);
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = fd;
  xa.oflags = O_CREAT;
  ibv_xrcd *x = pd && cq ? ibv_open_xrcd(ctx, &xa) : nullptr;
  if (!x) return 2;
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  sa.srq_type = IBV_SRQT_XRC;
  sa.pd = pd;
  sa.xrcd = x;
  sa.cq = cq;
  ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
  uint32_t srqn = 0;
  if (!srq || ibv_get_srq_num(srq, &srqn) || write(up, &srqn, 4) != 4) return 3;
  uint32_t qpns[2];
  if (!wait_read(down, qpns, sizeof qpns)) return 4;
  static uint8_t buf[2][8192];
  ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return 5;
  for (int i = 0; i < 2; i++) {
    ibv_sge s{uintptr_t(buf[i]), 8192, mr->lkey};
    ibv_recv_wr w = recv_wr(i + 1, &s, 1), *bad;
    if (ibv_post_srq_recv(srq, &w, &bad)) return 6;
  }
  ibv_wc wc[2];
  int got = 0;
  for (int i = 0; i < 20000 && got < 2; i++) {
    const int k = ibv_poll_cq(cq, 2 - got, wc + got);
    if (k < 0) return 7;
    got += k;
    if (!k) usleep(1000);
  }
  uint8_t verdict = 0;
  const auto expect = [&](bool ok, uint8_t code) {
    if (!ok && !verdict) verdict = code;
  };
  expect(got == 2, 10);
  for (int i = 0; i < got; i++) {
    expect(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV, 11);
    expect(wc[i].wr_id == uint64_t(i + 1), 12);
    expect(wc[i].qp_num == qpns[0] && wc[i].src_qp == qpns[1], 13);   // the target, its initiator
  }
  if (got == 2) {
    expect(wc[0].byte_len == 5000 && !(wc[0].wc_flags & IBV_WC_WITH_IMM), 14);
    for (int i = 0; i < 5000; i++) expect(buf[0][i] == uint8_t(i * 13), 15);
    expect(wc[1].byte_len == 100 && (wc[1].wc_flags & IBV_WC_WITH_IMM) && wc[1].imm_data == htonl(0x1234), 16);
    for (int i = 0; i < 100; i++) expect(buf[1][i] == 0x5a, 17);
  }
  if (write(up, &verdict, 1) != 1) return 8;
  uint8_t go;
  (void)wait_read(down, &go, 1);
  return 0;
}

}  // namespace

TEST_CASE("XRC: a target delivers into the SRQ another process created in the same domain (forwarded)",
          "[verbs][xrc]") {
  TempFile f;
  REQUIRE(f.fd >= 0);
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(xrc_child(f.path, up[1], down[0]));
  }
  close(up[1]);
  close(down[0]);
  const auto wait_read = [](int fd, void *p, size_t n) {
    pollfd pf{fd, POLLIN, 0};
    return ::poll(&pf, 1, 30000) == 1 && read(fd, p, n) == ssize_t(n);
  };
  int status = -1;
  const auto reap = [&] {
    for (int i = 0; i < 3000 && waitpid(pid, &status, WNOHANG) == 0; i++) usleep(10000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  };
  {
    Dev d;
    ibv_xrcd *x = open_xrcd(d, f.fd, O_CREAT);
    REQUIRE(x);
    uint32_t srqn = 0;
    const bool have = wait_read(up[0], &srqn, 4);
    if (!have) reap();
    INFO("child exit status " << status);
    REQUIRE(have);
    std::vector<uint8_t> big(5000), small(100, 0x5a);
    for (size_t i = 0; i < big.size(); i++) big[i] = uint8_t(i * 13);
    ibv_mr *mb = ibv_reg_mr(d.pd, big.data(), big.size(), 0), *ms = ibv_reg_mr(d.pd, small.data(), 100, 0);
    REQUIRE(mb);
    REQUIRE(ms);
    ibv_sge bs{uintptr_t(big.data()), 5000, mb->lkey}, ss{uintptr_t(small.data()), 100, ms->lkey};
    {
      XrcPair p(d, x);
      // Sent (and acknowledged by our target) before the child posts its
      // receives: they wait in the child for them.
      CHECK(p.post(IBV_WR_SEND, &bs, srqn).status == IBV_WC_SUCCESS);
      ibv_send_wr wr{}, *bad;
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htonl(0x1234);
      wr.sg_list = &ss;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.qp_type.xrc.remote_srqn = srqn;
      REQUIRE(ibv_post_send(p.ini, &wr, &bad) == 0);
      auto w = poll(p.scq, 1);
      REQUIRE(w.size() == 1);
      CHECK(w[0].status == IBV_WC_SUCCESS);
      const uint32_t qpns[2] = {p.tgt->qp_num, p.ini->qp_num};
      REQUIRE(write(down[1], qpns, sizeof qpns) == sizeof qpns);
      uint8_t verdict = 0xff;
      CHECK(wait_read(up[0], &verdict, 1));
      CHECK(verdict == 0);
    }
    {
      // RDMA to another process's SRQ: an invalid request.
      XrcPair p(d, x);
      CHECK(remote_error(p.post(IBV_WR_RDMA_WRITE, &ss, srqn, uintptr_t(small.data()), 1).status,
                         IBV_WC_REM_INV_REQ_ERR));
    }
    // The owner gone (without cleaning up): its SRQ is no more.
    REQUIRE(write(down[1], "x", 1) == 1);
    reap();
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    {
      XrcPair p(d, x);
      CHECK(remote_error(p.post(IBV_WR_SEND, &ss, srqn).status, IBV_WC_REM_INV_REQ_ERR));
    }
    ibv_dereg_mr(mb);
    ibv_dereg_mr(ms);
    CHECK(ibv_close_xrcd(x) == 0);
  }
  close(up[0]);
  close(down[1]);
}

TEST_CASE("XRC: records on a shared SRQ's socket that are not good ones are dropped and counted", "[verbs][xrc]") {
  Dev d;
  TempFile f;
  REQUIRE(f.fd >= 0);
  XrcSrqs xs(d, 1, f.fd);
  ibv_xrcd *x = xs.x;
  ibv_cq *cq = xs.cq[0];
  const uint32_t n = xs.num[0];
  // Where the SRQ is published (docs/xrc.md): root/xrc/uid/device/dev-ino/srqn.
  struct stat st;
  REQUIRE(fstat(f.fd, &st) == 0);
  char leaf[80];
  snprintf(leaf, sizeof leaf, "/%llx-%llx/%x", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, n);
  const std::string path = usrc::xrc_dir() + "/" + std::to_string(geteuid()) + "/" + getenv("USRC_TEST_DEV") + leaf;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof a.sun_path);
  memcpy(a.sun_path, path.c_str(), path.size());
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const uint64_t before = device_counter(usrc::Counter::xrc_drops);
  std::vector<uint8_t> one(1, 1), zeros(48, 0), ones(100, 0xff), big(9000, 0x31);
  for (auto *b : {&one, &zeros, &ones, &big})
    CHECK(sendto(fd, b->data(), b->size(), 0, reinterpret_cast<sockaddr *>(&a), sizeof a) == ssize_t(b->size()));
  close(fd);
  for (int i = 0; i < 100 && device_counter(usrc::Counter::xrc_drops) < before + 4; i++) poll(cq, 1, 0.05);
  CHECK(device_counter(usrc::Counter::xrc_drops) >= before + 4);
  CHECK(poll(cq, 1, 0.1).empty());   // (nothing came of them)
  {
    // The SRQ serves as before.
    XrcPair p(d, x);
    std::vector<uint8_t> src(64, 0x33), dst(64, 0);
    ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), 64, 0), *md = ibv_reg_mr(d.pd, dst.data(), 64, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge rs{uintptr_t(dst.data()), 64, md->lkey}, ss{uintptr_t(src.data()), 64, ms->lkey};
    ibv_recv_wr rw = recv_wr(4, &rs, 1), *bad;
    REQUIRE(ibv_post_srq_recv(xs.srq[0], &rw, &bad) == 0);
    CHECK(p.post(IBV_WR_SEND, &ss, n).status == IBV_WC_SUCCESS);
    auto w = poll(cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_SUCCESS);
    CHECK(dst == src);
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
  }
  xs.destroy(0);
  CHECK(access(path.c_str(), F_OK) != 0);   // withdrawn
  CHECK(xs.close() == 0);
}
