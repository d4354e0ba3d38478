// UC QPs: SENDs and RDMA WRITEs without acknowledgement; what cannot be
// taken is dropped, and the QP goes on.
#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

// An RC-shaped QP pair made UC: created as UC, connected with UC's
// attributes (the path and PSNs; nothing of RC's ACKs and retries).
struct UcQp {
  ibv_cq *cq = nullptr;
  ibv_qp *qp = nullptr;
  explicit UcQp(Dev &d) {
    cq = ibv_create_cq(d.ctx, 256, nullptr, nullptr, 0);
    REQUIRE(cq);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UC;
    ia.cap = {64, 64, 2, 2, 64};
    qp = ibv_create_qp(d.pd, &ia);
    REQUIRE(qp);
  }
  ~UcQp() {
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
  }
};

void uc_connect(Dev &d, UcQp &q, uint32_t dest_qpn) {
  REQUIRE(to_init(q.qp, IBV_ACCESS_REMOTE_WRITE) == 0);
  ibv_qp_attr a = rtr_attr(d, dest_qpn, Params{});
  REQUIRE(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN) == 0);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  REQUIRE(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

struct Mem {
  std::vector<uint8_t> b;
  ibv_mr *mr;
  Mem(Dev &d, size_t n) : b(n, 0) {
    mr = ibv_reg_mr(d.pd, b.data(), n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    REQUIRE(mr);
  }
  ~Mem() { ibv_dereg_mr(mr); }
  ibv_sge sge(size_t off, uint32_t len) { return {uintptr_t(b.data() + off), len, mr->lkey}; }
};

}  // namespace

TEST_CASE("UC: multi-packet SEND and RDMA WRITE with immediate, byte-exact, done once sent, no ACK", "[verbs][uc][unreliable]") {
  Dev d;
  UcQp a(d), b(d);
  uc_connect(d, a, b.qp->qp_num);
  uc_connect(d, b, a.qp->qp_num);
  const size_t len = 50000;   // 49 packets at 1 KB
  Mem tx(d, len), rx(d, 2 * len);
  for (size_t i = 0; i < len; i++) tx.b[i] = uint8_t(i * 7 + 3);
  const uint64_t acks = device_counter(usrc::Counter::acks_sent);
  ibv_sge r = rx.sge(0, len), s = tx.sge(0, len);
  REQUIRE(post_recv(b.qp, 1, &r, 1) == 0);
  REQUIRE(post_send(a.qp, 10, IBV_WR_SEND_WITH_IMM, &s, 1, IBV_SEND_SIGNALED, 0, 0, 0x1234) == 0);
  auto ws = poll(a.cq, 1);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].status == IBV_WC_SUCCESS);
  auto wr = poll(b.cq, 1);
  REQUIRE(wr.size() == 1);
  CHECK(wr[0].status == IBV_WC_SUCCESS);
  CHECK(wr[0].byte_len == len);
  CHECK(ntohl(wr[0].imm_data) == 0x1234);
  CHECK(std::memcmp(rx.b.data(), tx.b.data(), len) == 0);
  // A WRITE with immediate into the second half: its data and a receive.
  ibv_sge r2 = rx.sge(0, 0);
  REQUIRE(post_recv(b.qp, 2, &r2, 1) == 0);
  REQUIRE(post_send(a.qp, 11, IBV_WR_RDMA_WRITE_WITH_IMM, &s, 1, IBV_SEND_SIGNALED,
                    uintptr_t(rx.b.data() + len), rx.mr->rkey, 0x99) == 0);
  REQUIRE(poll(a.cq, 1).size() == 1);
  wr = poll(b.cq, 1);
  REQUIRE(wr.size() == 1);
  CHECK(wr[0].status == IBV_WC_SUCCESS);
  CHECK(wr[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(wr[0].byte_len == len);
  CHECK(std::memcmp(rx.b.data() + len, tx.b.data(), len) == 0);
  CHECK(device_counter(usrc::Counter::acks_sent) == acks);   // UC acknowledges nothing
}

TEST_CASE("UC drops what it cannot take (no receive, a bad rkey), counted; the QP goes on", "[verbs][uc][unreliable]") {
  Dev d;
  UcQp a(d), b(d);
  uc_connect(d, a, b.qp->qp_num);
  uc_connect(d, b, a.qp->qp_num);
  Mem tx(d, 4096), rx(d, 8192);
  for (size_t i = 0; i < 4096; i++) tx.b[i] = uint8_t(i + 1);
  ibv_sge s = tx.sge(0, 3000);
  const uint64_t none = device_counter(usrc::Counter::no_recv_drops);
  const uint64_t uc = device_counter(usrc::Counter::uc_drops);
  // No receive posted: the SEND is dropped (no RNR on UC).
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  REQUIRE(poll(a.cq, 1).size() == 1);
  CHECK(poll(b.cq, 1, 0.2).empty());
  CHECK(device_counter(usrc::Counter::no_recv_drops) == none + 1);
  // A WRITE with a wrong rkey: dropped, the memory untouched.
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(rx.b.data()),
                    rx.mr->rkey ^ 0x100) == 0);
  auto w = poll(a.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].status == IBV_WC_SUCCESS);   // (the requester cannot know)
  for (int i = 0; i < 100 && device_counter(usrc::Counter::uc_drops) < uc + 3; i++) usleep(10000);
  CHECK(device_counter(usrc::Counter::uc_drops) >= uc + 3);   // its 3 packets
  CHECK(std::all_of(rx.b.begin(), rx.b.end(), [](uint8_t v) { return v == 0; }));
  // Both QPs go on.
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(b.qp, &qa, IBV_QP_STATE, &qi) == 0);
  CHECK(qa.qp_state == IBV_QPS_RTS);
  CHECK(qi.qp_type == IBV_QPT_UC);
  ibv_sge r = rx.sge(0, 8192);
  REQUIRE(post_recv(b.qp, 3, &r, 1) == 0);
  REQUIRE(post_send(a.qp, 3, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  REQUIRE(poll(a.cq, 1).size() == 1);
  w = poll(b.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].status == IBV_WC_SUCCESS);
  CHECK(w[0].byte_len == 3000);
  CHECK(std::memcmp(rx.b.data(), tx.b.data(), 3000) == 0);
}

TEST_CASE("UC misuse: READ and ATOMIC are EINVAL; RC's ACK attributes are refused at RTR and RTS", "[verbs][uc]") {
  Dev d;
  UcQp a(d), b(d);
  REQUIRE(to_init(a.qp, IBV_ACCESS_REMOTE_WRITE) == 0);
  ibv_qp_attr at = rtr_attr(d, b.qp->qp_num, Params{});
  CHECK(ibv_modify_qp(a.qp, &at, kRtrMask) == EINVAL);   // MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER: RC's
  uc_connect(d, b, a.qp->qp_num);
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.timeout = 14;
  CHECK(ibv_modify_qp(b.qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT) == EINVAL);
  Mem m(d, 64);
  ibv_sge s = m.sge(0, 8);
  CHECK(post_send(b.qp, 1, IBV_WR_RDMA_READ, &s, 1, IBV_SEND_SIGNALED, uintptr_t(m.b.data()), m.mr->rkey) == EINVAL);
  CHECK(post_send(b.qp, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, &s, 1, IBV_SEND_SIGNALED, uintptr_t(m.b.data()),
                  m.mr->rkey) == EINVAL);
}
