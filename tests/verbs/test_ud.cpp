// UD QPs and address handles: datagrams, the GRH area, Q_Keys, drops.
#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

// A UD QP on a CQ of its own, taken to RTS with Q_Key kQkey (or qkey).
struct UdQp {
  ibv_cq *cq = nullptr;
  ibv_qp *qp = nullptr;
  explicit UdQp(Dev &d, uint32_t qkey = kQkey, ibv_srq *srq = nullptr) {
    cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.srq = srq;
    ia.cap = {16, 16, 2, 2, 64};
    qp = ibv_create_qp(d.pd, &ia);
    REQUIRE(qp);
    ud_to_rts(qp, qkey);
  }
  ~UdQp() {
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
  }
};

bool roce(Dev &d) { return d.port.link_layer == IBV_LINK_LAYER_ETHERNET; }

struct Buf {
  std::vector<uint8_t> b;
  ibv_mr *mr;
  Buf(Dev &d, size_t n, uint8_t fill = 0) : b(n, fill) {
    mr = ibv_reg_mr(d.pd, b.data(), n, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr);
  }
  ~Buf() { ibv_dereg_mr(mr); }
  ibv_sge sge(size_t off, uint32_t len) { return {uintptr_t(b.data() + off), len, mr->lkey}; }
};

}  // namespace

TEST_CASE("UD: SEND and SEND_WITH_IMM, the GRH area, the source, and a reply through ibv_create_ah_from_wc", "[verbs][ud][unreliable]") {
  Dev d;
  UdQp a(d), b(d);
  ibv_ah *ah = ah_to_self(d, d.pd);
  REQUIRE(ah);
  Buf tx(d, 1000), rx(d, 2 * (40 + 1000));
  for (size_t i = 0; i < 1000; i++) tx.b[i] = uint8_t(i * 13 + 1);
  ibv_sge r0 = rx.sge(0, 40 + 1000), r1 = rx.sge(1040, 40 + 1000);
  REQUIRE(post_recv(b.qp, 10, &r0, 1) == 0);
  REQUIRE(post_recv(b.qp, 11, &r1, 1) == 0);
  ibv_sge s = tx.sge(0, 1000);
  REQUIRE(send_ud(a.qp, 1, &s, ah, b.qp->qp_num, kQkey) == 0);
  REQUIRE(send_ud(a.qp, 2, &s, ah, b.qp->qp_num, kQkey, IBV_WR_SEND_WITH_IMM, 0xabcd) == 0);
  auto ws = poll(a.cq, 2);
  REQUIRE(ws.size() == 2);
  for (auto &w : ws) {
    CHECK(w.status == IBV_WC_SUCCESS);
    CHECK(w.opcode == IBV_WC_SEND);
  }
  auto wr = poll(b.cq, 2);
  REQUIRE(wr.size() == 2);
  for (size_t k = 0; k < 2; k++) {
    const ibv_wc &w = wr[k];
    INFO("receive " << k);
    REQUIRE(w.status == IBV_WC_SUCCESS);
    CHECK(w.wr_id == 10 + k);
    CHECK(w.opcode == IBV_WC_RECV);
    CHECK(w.byte_len == 40 + 1000);
    CHECK(w.qp_num == b.qp->qp_num);
    CHECK(w.src_qp == a.qp->qp_num);
    CHECK(bool(w.wc_flags & IBV_WC_WITH_IMM) == (k == 1));
    if (k == 1) CHECK(ntohl(w.imm_data) == 0xabcd);
    CHECK(std::memcmp(rx.b.data() + 1040 * k + 40, tx.b.data(), 1000) == 0);
    if (roce(d)) {
      // RoCE v2 over IPv4: the IPv4 header in the GRH area's last 20 bytes.
      CHECK((w.wc_flags & IBV_WC_GRH));
      const uint8_t *ip = rx.b.data() + 1040 * k + 20;
      ibv_gid g;
      REQUIRE(ibv_query_gid(d.ctx, 1, 0, &g) == 0);
      CHECK(ip[0] == 0x45);
      CHECK(ip[9] == 17);
      CHECK(std::memcmp(ip + 12, g.raw + 12, 4) == 0);   // source: this host
      CHECK(std::memcmp(ip + 16, g.raw + 12, 4) == 0);
      CHECK((ip[2] << 8 | ip[3]) == 20 + 8 + 12 + 8 + (k ? 4 : 0) + 1000 + 4);
    } else {
      CHECK_FALSE((w.wc_flags & IBV_WC_GRH));
      CHECK(w.slid == d.port.lid);
    }
  }
  // The reply: an AH from the completion (and its GRH).
  ibv_ah *back = ibv_create_ah_from_wc(d.pd, &wr[0], reinterpret_cast<ibv_grh *>(rx.b.data()), 1);
  REQUIRE(back);
  Buf rb(d, 40 + 16);
  ibv_sge rr = rb.sge(0, 40 + 16);
  REQUIRE(post_recv(a.qp, 20, &rr, 1) == 0);
  ibv_sge s2 = tx.sge(0, 16);
  REQUIRE(send_ud(b.qp, 3, &s2, back, wr[0].src_qp, kQkey) == 0);
  auto wa = poll(a.cq, 2);   // b's send completes on b's CQ; a's receive here
  REQUIRE(wa.size() == 1);
  CHECK(wa[0].status == IBV_WC_SUCCESS);
  CHECK(wa[0].src_qp == b.qp->qp_num);
  CHECK(std::memcmp(rb.b.data() + 40, tx.b.data(), 16) == 0);
  REQUIRE(poll(b.cq, 1).size() == 1);
  CHECK(ibv_destroy_ah(back) == 0);
  CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("UD Q_Keys: a wrong one is dropped and counted; a controlled one in the WR means the QP's own", "[verbs][ud][unreliable]") {
  Dev d;
  UdQp a(d), b(d);
  ibv_ah *ah = ah_to_self(d, d.pd);
  REQUIRE(ah);
  Buf tx(d, 64, 0x42), rx(d, 4 * 104);
  for (int i = 0; i < 2; i++) {
    ibv_sge r = rx.sge(104 * i, 104);
    REQUIRE(post_recv(b.qp, i, &r, 1) == 0);
  }
  const uint64_t drops = device_counter(usrc::Counter::qkey_drops);
  ibv_sge s = tx.sge(0, 64);
  REQUIRE(send_ud(a.qp, 1, &s, ah, b.qp->qp_num, kQkey + 1) == 0);
  REQUIRE(poll(a.cq, 1).size() == 1);   // (sent: a datagram's WR is done then)
  CHECK(poll(b.cq, 1, 0.3).empty());
  CHECK(device_counter(usrc::Counter::qkey_drops) == drops + 1);
  // 0x80000000 set: the sending QP's Q_Key (kQkey), which b has.
  REQUIRE(send_ud(a.qp, 2, &s, ah, b.qp->qp_num, 0x80000000u | 0x1234) == 0);
  auto w = poll(b.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].status == IBV_WC_SUCCESS);
  CHECK(w[0].wr_id == 0);   // the first receive: the dropped datagram took none
  REQUIRE(poll(a.cq, 1).size() == 1);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(b.qp, &qa, IBV_QP_QKEY, &qi) == 0);
  CHECK(qa.qkey == kQkey);
  CHECK(qi.qp_type == IBV_QPT_UD);
  ibv_destroy_ah(ah);
}

TEST_CASE("UD receives: too small a buffer is LOC_LEN_ERR (the QP goes on); none posted drops the datagram, counted", "[verbs][ud][unreliable]") {
  Dev d;
  UdQp a(d), b(d);
  ibv_ah *ah = ah_to_self(d, d.pd);
  REQUIRE(ah);
  Buf tx(d, 512, 0x17), rx(d, 1024);
  ibv_sge s = tx.sge(0, 512);
  // No receive posted: dropped.
  const uint64_t none = device_counter(usrc::Counter::no_recv_drops);
  REQUIRE(send_ud(a.qp, 1, &s, ah, b.qp->qp_num, kQkey) == 0);
  REQUIRE(poll(a.cq, 1).size() == 1);
  CHECK(poll(b.cq, 1, 0.3).empty());
  CHECK(device_counter(usrc::Counter::no_recv_drops) == none + 1);
  // 512 bytes do not fit 40 + 500.
  ibv_sge small = rx.sge(0, 40 + 500);
  REQUIRE(post_recv(b.qp, 5, &small, 1) == 0);
  REQUIRE(send_ud(a.qp, 2, &s, ah, b.qp->qp_num, kQkey) == 0);
  auto w = poll(b.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].wr_id == 5);
  CHECK(w[0].status == IBV_WC_LOC_LEN_ERR);
  // The QP is still in RTS and takes the next.
  ibv_sge big = rx.sge(0, 40 + 512);
  REQUIRE(post_recv(b.qp, 6, &big, 1) == 0);
  REQUIRE(send_ud(a.qp, 3, &s, ah, b.qp->qp_num, kQkey) == 0);
  w = poll(b.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].wr_id == 6);
  CHECK(w[0].status == IBV_WC_SUCCESS);
  CHECK(w[0].byte_len == 40 + 512);
  CHECK(std::memcmp(rx.b.data() + 40, tx.b.data(), 512) == 0);
  REQUIRE(poll(a.cq, 2).size() == 2);
  ibv_destroy_ah(ah);
}

TEST_CASE("UD misuse: clean errnos (message over the MTU, RDMA on UD, bad AHs, another PD's AH, a path at RTR)", "[verbs][ud][unreliable]") {
  Dev d;
  UdQp a(d);
  ibv_ah *ah = ah_to_self(d, d.pd);
  REQUIRE(ah);
  const uint32_t mtu = 128u << d.port.active_mtu;
  Buf tx(d, mtu + 1);
  ibv_sge over = tx.sge(0, mtu + 1), ok = tx.sge(0, mtu);
  CHECK(send_ud(a.qp, 1, &over, ah, a.qp->qp_num, kQkey) == EINVAL);
  CHECK(send_ud(a.qp, 1, &ok, ah, a.qp->qp_num, kQkey, IBV_WR_RDMA_WRITE) == EINVAL);
  CHECK(send_ud(a.qp, 1, &ok, nullptr, a.qp->qp_num, kQkey) == EINVAL);
  CHECK(send_ud(a.qp, 1, &ok, ah, 0x5, kQkey) == EINVAL);   // a QPN no QP can have
  // Address vectors: port 2, an SL over 15, a GID index out of the table, no GRH on RoCE.
  ibv_ah_attr bad{};
  bad.port_num = 2;
  bad.dlid = d.port.lid;
  errno = 0;
  CHECK(ibv_create_ah(d.pd, &bad) == nullptr);
  CHECK(errno == EINVAL);
  bad.port_num = 1;
  bad.sl = 16;
  CHECK(ibv_create_ah(d.pd, &bad) == nullptr);
  bad.sl = 0;
  bad.is_global = 1;
  bad.grh.sgid_index = 200;
  CHECK(ibv_create_ah(d.pd, &bad) == nullptr);
  if (roce(d)) {
    bad.is_global = 0;
    CHECK(ibv_create_ah(d.pd, &bad) == nullptr);
  }
  // An AH of another PD.
  ibv_pd *pd2 = ibv_alloc_pd(d.ctx);
  REQUIRE(pd2);
  ibv_ah *ah2 = ah_to_self(d, pd2);
  REQUIRE(ah2);
  CHECK(send_ud(a.qp, 1, &ok, ah2, a.qp->qp_num, kQkey) == EINVAL);
  CHECK(ibv_dealloc_pd(pd2) == EBUSY);   // the AH uses it
  ibv_destroy_ah(ah2);
  CHECK(ibv_dealloc_pd(pd2) == 0);
  // UD has no path to set: an AV at RTR, an RC attribute at RTS.
  ibv_cq *cq = ibv_create_cq(d.ctx, 8, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {4, 4, 1, 1, 0};
  ibv_qp *q = ibv_create_qp(d.pd, &ia);
  REQUIRE(q);
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == EINVAL);
  at.qkey = kQkey;
  REQUIRE(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  at.qp_state = IBV_QPS_RTR;
  at.ah_attr.port_num = 1;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_AV) == EINVAL);
  // Posting before RTS: EINVAL.
  CHECK(send_ud(q, 1, &ok, ah, a.qp->qp_num, kQkey) == EINVAL);
  ibv_destroy_qp(q);
  ibv_destroy_cq(cq);
  ibv_destroy_ah(ah);
}

TEST_CASE("UD on an SRQ: datagrams for two UD QPs take the SRQ's receives", "[verbs][ud][srq][unreliable]") {
  Dev d;
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq *srq = ibv_create_srq(d.pd, &sa);
  REQUIRE(srq);
  {
    UdQp a(d), b1(d, kQkey, srq), b2(d, kQkey, srq);
    ibv_ah *ah = ah_to_self(d, d.pd);
    REQUIRE(ah);
    Buf tx(d, 100, 0x33), rx(d, 4 * 140);
    for (int i = 0; i < 4; i++) {
      ibv_sge r = rx.sge(140 * i, 140);
      ibv_recv_wr w = recv_wr(i, &r, 1), *bad;
      REQUIRE(ibv_post_srq_recv(srq, &w, &bad) == 0);
    }
    ibv_sge s = tx.sge(0, 100);
    for (int i = 0; i < 4; i++) REQUIRE(send_ud(a.qp, i, &s, ah, (i % 2 ? b2 : b1).qp->qp_num, kQkey) == 0);
    REQUIRE(poll(a.cq, 4).size() == 4);
    auto w1 = poll(b1.cq, 2), w2 = poll(b2.cq, 2);
    REQUIRE(w1.size() == 2);
    REQUIRE(w2.size() == 2);
    for (auto *ws : {&w1, &w2})
      for (auto &w : *ws) {
        CHECK(w.status == IBV_WC_SUCCESS);
        CHECK(w.byte_len == 140);
        CHECK(w.src_qp == a.qp->qp_num);
      }
    ibv_destroy_ah(ah);
  }
  CHECK(ibv_destroy_srq(srq) == 0);
}

TEST_CASE("UD through the extended send API: ibv_wr_send with ibv_wr_set_ud_addr", "[verbs][ud][unreliable]") {
  Dev d;
  UdQp b(d);
  ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_qp_init_attr_ex ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {8, 8, 1, 1, 64};
  ia.pd = d.pd;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ia.create_flags = 0;   // (the mask bit with no flag: accepted)
  ibv_qp *qp = ibv_create_qp_ex(d.ctx, &ia);
  REQUIRE(qp);
  ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
  ibv_ah *ah = ah_to_self(d, d.pd);
  REQUIRE(ah);
  Buf tx(d, 300, 0x61), rx(d, 340);
  // In RESET: the batch is refused with EINVAL.
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_ud_addr(x, ah, b.qp->qp_num, kQkey);
  ibv_wr_set_sge(x, tx.mr->lkey, uintptr_t(tx.b.data()), 300);
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  a.qp_state = IBV_QPS_RTR;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  a.qp_state = IBV_QPS_RTS;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
  ibv_sge r = rx.sge(0, 340);
  REQUIRE(post_recv(b.qp, 9, &r, 1) == 0);
  ibv_wr_start(x);
  x->wr_id = 2;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(0x77));
  ibv_wr_set_ud_addr(x, ah, b.qp->qp_num, kQkey);
  ibv_wr_set_sge(x, tx.mr->lkey, uintptr_t(tx.b.data()), 300);
  REQUIRE(ibv_wr_complete(x) == 0);
  auto ws = poll(cq, 1);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].status == IBV_WC_SUCCESS);
  auto wr = poll(b.cq, 1);
  REQUIRE(wr.size() == 1);
  CHECK(wr[0].status == IBV_WC_SUCCESS);
  CHECK(wr[0].byte_len == 340);
  CHECK(ntohl(wr[0].imm_data) == 0x77);
  CHECK(std::memcmp(rx.b.data() + 40, tx.b.data(), 300) == 0);
  // Create flags other than none: not implemented.
  ia.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  errno = 0;
  CHECK(ibv_create_qp_ex(d.ctx, &ia) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  ibv_destroy_qp(qp);
  ibv_destroy_ah(ah);
  ibv_destroy_cq(cq);
}
