// Shared receive queues: QPs on one SRQ, its limit event, its errors.
#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

// An SRQ of the test's device, destroyed with its scope (declared before
// the QPs on it, it outlives them).
struct Srq {
  ibv_srq *srq = nullptr;
  explicit Srq(Dev &d, uint32_t max_wr = 256) {
    ibv_srq_init_attr a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 2;
    srq = ibv_create_srq(d.pd, &a);
    REQUIRE(srq);
    CHECK(a.attr.max_wr >= max_wr);
  }
  ~Srq() { CHECK(ibv_destroy_srq(srq) == 0); }
};

int post_srq(ibv_srq *srq, uint64_t id, ibv_sge *sge, int nsge, ibv_recv_wr **bad = nullptr) {
  ibv_recv_wr wr = recv_wr(id, sge, nsge), *b;
  return ibv_post_srq_recv(srq, &wr, bad ? bad : &b);
}

// The next async event of type t (others, such as COMM_EST, are passed
// over): false if none came in time.
bool wait_event(Dev &d, ibv_event_type t, ibv_async_event *ev) {
  for (int i = 0; i < 16; i++) {
    if (!next_async_event(d, ev)) return false;
    if (ev->event_type == t) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("SRQ: two QPs take their receives from one SRQ, multi-packet SENDs interleaved, byte-exact", "[verbs][srq]") {
  Dev d;
  Srq s(d);
  Qp a1(d), a2(d), b1(d, 256, nullptr, s.srq), b2(d, 256, nullptr, s.srq);
  connect_pair(d, a1, b1);
  connect_pair(d, a2, b2);
  // 64 KB messages at 1 KB MTU: each is 64 packets, and the two QPs'
  // streams interleave at the receiver.
  constexpr size_t kLen = 65536, kPerQp = 8, kMsgs = 2 * kPerQp;
  std::vector<uint8_t> tx(kLen * kMsgs), rx(kLen * kMsgs, 0);
  for (size_t m = 0; m < kMsgs; m++)
    for (size_t i = 0; i < kLen; i++) tx[m * kLen + i] = uint8_t(m * 37 + i * 7 + (i >> 10));
  ibv_mr *mt = ibv_reg_mr(d.pd, tx.data(), tx.size(), 0);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mt);
  REQUIRE(mr);
  for (size_t m = 0; m < kMsgs; m++) {
    ibv_sge r{uintptr_t(rx.data() + m * kLen), uint32_t(kLen), mr->lkey};
    REQUIRE(post_srq(s.srq, m, &r, 1) == 0);
  }
  // Message m goes out on a1 (even m) or a2 (odd m).
  for (size_t m = 0; m < kMsgs; m++) {
    ibv_sge g{uintptr_t(tx.data() + m * kLen), uint32_t(kLen), mt->lkey};
    REQUIRE(post_send((m % 2 ? a2 : a1).qp, m, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  }
  auto w1 = poll(a1.cq, kPerQp), w2 = poll(a2.cq, kPerQp);
  REQUIRE(w1.size() == kPerQp);
  REQUIRE(w2.size() == kPerQp);
  for (auto &w : w1) CHECK(w.status == IBV_WC_SUCCESS);
  for (auto &w : w2) CHECK(w.status == IBV_WC_SUCCESS);
  auto r1 = poll(b1.cq, kPerQp), r2 = poll(b2.cq, kPerQp);
  REQUIRE(r1.size() == kPerQp);
  REQUIRE(r2.size() == kPerQp);
  // Each receive holds one whole message, in its buffer (wr_id), and the
  // two QPs' messages each arrive in order.
  std::vector<int> seen(kMsgs, 0);
  for (auto *rs : {&r1, &r2}) {
    size_t want_parity = rs == &r1 ? 0 : 1, last = 0;
    for (auto &w : *rs) {
      INFO("receive " << w.wr_id << " on QP " << w.qp_num);
      REQUIRE(w.status == IBV_WC_SUCCESS);
      CHECK(w.opcode == IBV_WC_RECV);
      CHECK(w.byte_len == kLen);
      CHECK(w.qp_num == (rs == &r1 ? b1 : b2).qp->qp_num);
      CHECK(w.src_qp == (rs == &r1 ? a1 : a2).qp->qp_num);
      REQUIRE(w.wr_id < kMsgs);
      const uint8_t *got = rx.data() + w.wr_id * kLen;
      // Which message it holds: its first byte names it.
      size_t m = kMsgs;
      for (size_t k = 0; k < kMsgs; k++)
        if (std::memcmp(got, tx.data() + k * kLen, kLen) == 0) m = k;
      REQUIRE(m < kMsgs);
      CHECK(m % 2 == want_parity);
      CHECK((last == 0 || m > last));
      last = m;
      seen[m]++;
    }
  }
  for (size_t m = 0; m < kMsgs; m++) CHECK(seen[m] == 1);
  ibv_dereg_mr(mt);
  ibv_dereg_mr(mr);
}

TEST_CASE("SRQ limit: armed by ibv_modify_srq, IBV_EVENT_SRQ_LIMIT_REACHED once when fewer WQEs remain", "[verbs][srq]") {
  Dev d;
  Srq s(d, 16);
  Qp a(d), b(d, 256, nullptr, s.srq);
  connect_pair(d, a, b);
  std::vector<uint8_t> buf(64 * 16);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m);
  for (int i = 0; i < 10; i++) {
    ibv_sge r{uintptr_t(buf.data() + 64 * i), 64, m->lkey};
    REQUIRE(post_srq(s.srq, i, &r, 1) == 0);
  }
  ibv_srq_attr at{};
  at.srq_limit = 11;   // above what is posted: it would be reached at once
  CHECK(ibv_modify_srq(s.srq, &at, IBV_SRQ_LIMIT) == EINVAL);
  at.srq_limit = 5;
  REQUIRE(ibv_modify_srq(s.srq, &at, IBV_SRQ_LIMIT) == 0);
  ibv_srq_attr q{};
  REQUIRE(ibv_query_srq(s.srq, &q) == 0);
  CHECK(q.srq_limit == 5);
  CHECK(q.max_wr >= 16);
  // Five SENDs leave five WQEs: not below the limit yet.
  ibv_sge g{uintptr_t(buf.data()), 8, m->lkey};
  for (int i = 0; i < 5; i++) REQUIRE(post_send(a.qp, i, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  REQUIRE(poll(b.cq, 5).size() == 5);
  ibv_async_event ev{};
  CHECK_FALSE(next_async_event(d, &ev, 0));
  REQUIRE(ibv_query_srq(s.srq, &q) == 0);
  CHECK(q.srq_limit == 5);
  // The sixth leaves four: the event, and the limit disarmed.
  REQUIRE(post_send(a.qp, 5, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  REQUIRE(poll(b.cq, 1).size() == 1);
  REQUIRE(wait_event(d, IBV_EVENT_SRQ_LIMIT_REACHED, &ev));
  CHECK(ev.element.srq == s.srq);
  REQUIRE(ibv_query_srq(s.srq, &q) == 0);
  CHECK(q.srq_limit == 0);
  // Once only: the seventh raises nothing.
  REQUIRE(post_send(a.qp, 6, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  REQUIRE(poll(b.cq, 1).size() == 1);
  CHECK_FALSE(next_async_event(d, &ev, 0));
  REQUIRE(poll(a.cq, 7).size() == 7);
  ibv_dereg_mr(m);
}

TEST_CASE("SRQ misuse: clean errors (EBUSY, EINVAL, ENOMEM), nothing posted by a refused WR", "[verbs][srq]") {
  Dev d;
  Srq s(d, 4);
  std::vector<uint8_t> buf(256);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m);
  ibv_sge r{uintptr_t(buf.data()), 64, m->lkey};
  {
    Qp b(d, 16, nullptr, s.srq);
    // Destroyed while a QP takes from it: EBUSY.
    CHECK(ibv_destroy_srq(s.srq) == EBUSY);
    // A QP on an SRQ has no receive queue of its own.
    CHECK(post_recv(b.qp, 1, &r, 1) == EINVAL);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(b.qp, &qa, IBV_QP_CAP, &qi) == 0);
    CHECK(qi.srq == s.srq);
    CHECK(b.qp->srq == s.srq);
  }
  // Too many SGEs: EINVAL and the WR named. (A wrong lkey is posted: the
  // WQE fails when a message uses it, see the [mr] tests.)
  ibv_recv_wr *bad = nullptr;
  ibv_sge many[9];
  for (auto &g : many) g = r;
  CHECK(post_srq(s.srq, 1, many, 9, &bad) == EINVAL);
  // Full: ENOMEM for the WR beyond it.
  for (int i = 0; i < 4; i++) REQUIRE(post_srq(s.srq, i, &r, 1) == 0);
  CHECK(post_srq(s.srq, 9, &r, 1) == ENOMEM);
  // Resizing below what it holds, or above the device's limit: EINVAL;
  // growing keeps what is posted.
  ibv_device_attr da{};
  REQUIRE(ibv_query_device(d.ctx, &da) == 0);
  CHECK(da.max_srq > 0);
  CHECK(da.max_srq_sge >= 2);
  ibv_srq_attr at{};
  at.max_wr = 2;
  CHECK(ibv_modify_srq(s.srq, &at, IBV_SRQ_MAX_WR) == EINVAL);
  at.max_wr = uint32_t(da.max_srq_wr) + 1;
  CHECK(ibv_modify_srq(s.srq, &at, IBV_SRQ_MAX_WR) == EINVAL);
  at.max_wr = 8;
  REQUIRE(ibv_modify_srq(s.srq, &at, IBV_SRQ_MAX_WR) == 0);
  for (int i = 4; i < 8; i++) REQUIRE(post_srq(s.srq, i, &r, 1) == 0);
  CHECK(post_srq(s.srq, 9, &r, 1) == ENOMEM);
  // Too large at creation: EINVAL.
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = uint32_t(da.max_srq_wr) + 1;
  ia.attr.max_sge = 1;
  errno = 0;
  CHECK(ibv_create_srq(d.pd, &ia) == nullptr);
  CHECK(errno == EINVAL);
  // An SRQ of another context: EINVAL.
  Dev d2;
  ibv_cq *cq2 = ibv_create_cq(d2.ctx, 8, nullptr, nullptr, 0);
  REQUIRE(cq2);
  ibv_qp_init_attr qi{};
  qi.send_cq = qi.recv_cq = cq2;
  qi.qp_type = IBV_QPT_RC;
  qi.srq = s.srq;
  qi.cap = {4, 0, 1, 0, 0};
  errno = 0;
  CHECK(ibv_create_qp(d2.pd, &qi) == nullptr);
  CHECK(errno == EINVAL);
  ibv_destroy_cq(cq2);
  ibv_dereg_mr(m);
}

TEST_CASE("SRQ empty: the SEND waits (RNR) and lands once a receive is posted", "[verbs][srq]") {
  Dev d;
  Srq s(d);
  Qp a(d), b(d, 256, nullptr, s.srq);
  Params p;
  p.min_rnr = 1;   // 0.01 ms: retried often
  connect_pair(d, a, b, p, p);
  std::vector<uint8_t> tx(5000, 0x6b), rx(5000, 0);
  ibv_mr *mt = ibv_reg_mr(d.pd, tx.data(), tx.size(), 0);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge g{uintptr_t(tx.data()), 5000, mt->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  // rnr_retry 7 retries forever: nothing completes while the SRQ is empty.
  CHECK(poll(a.cq, 1, 0.2).empty());
  ibv_sge r{uintptr_t(rx.data()), 5000, mr->lkey};
  REQUIRE(post_srq(s.srq, 7, &r, 1) == 0);
  auto ws = poll(a.cq, 1), wr = poll(b.cq, 1);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].status == IBV_WC_SUCCESS);
  REQUIRE(wr.size() == 1);
  CHECK(wr[0].wr_id == 7);
  CHECK(wr[0].byte_len == 5000);
  CHECK(rx == tx);
  CHECK(device_counter(usrc::Counter::rnr_naks_sent) > 0);
  ibv_dereg_mr(mt);
  ibv_dereg_mr(mr);
}

TEST_CASE("SRQ: a QP on it moved to ERR raises LAST_WQE_REACHED; the SRQ's WQEs stay for the others", "[verbs][srq]") {
  Dev d;
  Srq s(d);
  Qp a1(d), a2(d), b1(d, 256, nullptr, s.srq), b2(d, 256, nullptr, s.srq);
  connect_pair(d, a1, b1);
  connect_pair(d, a2, b2);
  std::vector<uint8_t> buf(4096);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m);
  for (int i = 0; i < 4; i++) {
    ibv_sge r{uintptr_t(buf.data() + 1024 * i), 1024, m->lkey};
    REQUIRE(post_srq(s.srq, i, &r, 1) == 0);
  }
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  REQUIRE(ibv_modify_qp(b1.qp, &e, IBV_QP_STATE) == 0);
  ibv_async_event ev{};
  REQUIRE(wait_event(d, IBV_EVENT_QP_LAST_WQE_REACHED, &ev));
  CHECK(ev.element.qp == b1.qp);
  // Nothing of the SRQ was flushed to b1's CQ.
  CHECK(poll(b1.cq, 1, 0.1).empty());
  ibv_sge g{uintptr_t(buf.data()), 100, m->lkey};
  for (int i = 0; i < 4; i++) REQUIRE(post_send(a2.qp, i, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  auto wr = poll(b2.cq, 4);
  REQUIRE(wr.size() == 4);
  for (size_t i = 0; i < 4; i++) {
    CHECK(wr[i].status == IBV_WC_SUCCESS);
    CHECK(wr[i].wr_id == i);   // in the order they were posted
  }
  REQUIRE(poll(a2.cq, 4).size() == 4);
  ibv_dereg_mr(m);
}
