// Our own verbs test program, against the public libibverbs API only (and
// the device's counters file, as `usrc stats` reads it), run through
// `usrc exec` on a usrc device on loopback (USRC_TEST_DEV names it).
// Two QPs of one context are connected to each other over real UDP.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include "usrc/device.h"
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "verbs_util.h"

using namespace verbs_test;

TEST_CASE("SEND across the PSN rollover, byte-exact", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  Params pa, pb;
  pa.sq_psn = 0xffffff - 100;   // 64 KB messages at 1 KB MTU: wraps at once
  pb.sq_psn = 0xfffff0;
  connect_pair(d, a, b, pa, pb);
  const size_t len = 65536, n = 20;
  std::vector<uint8_t> tx(len * n), rx(len * n, 0);
  for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 131 + 7);
  ibv_mr *mt = ibv_reg_mr(d.pd, tx.data(), tx.size(), 0);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mt);
  REQUIRE(mr);
  for (size_t i = 0; i < n; i++) {
    ibv_sge s{uintptr_t(rx.data() + i * len), uint32_t(len), mr->lkey};
    REQUIRE(post_recv(b.qp, 100 + i, &s, 1) == 0);
  }
  for (size_t i = 0; i < n; i++) {
    ibv_sge s{uintptr_t(tx.data() + i * len), uint32_t(len), mt->lkey};
    REQUIRE(post_send(a.qp, i, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  }
  auto wc = poll(a.cq, n);   // a.cq gets the sends, b.cq the receives
  auto rc = poll(b.cq, n);
  REQUIRE(wc.size() == n);
  REQUIRE(rc.size() == n);
  for (size_t i = 0; i < n; i++) {
    CHECK(wc[i].status == IBV_WC_SUCCESS);
    CHECK(wc[i].opcode == IBV_WC_SEND);
    CHECK(rc[i].status == IBV_WC_SUCCESS);
    CHECK(rc[i].wr_id == 100 + i);
    CHECK(rc[i].byte_len == len);
    CHECK(rc[i].opcode == IBV_WC_RECV);
    CHECK(rc[i].qp_num == b.qp->qp_num);
    CHECK(rc[i].src_qp == a.qp->qp_num);
  }
  CHECK(rx == tx);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_SQ_PSN, &qi) == 0);
  CHECK(qa.sq_psn == pa.sq_psn);   // what was set
  ibv_dereg_mr(mt);
  ibv_dereg_mr(mr);
}

// A poll that finds its CQ empty receives in the caller's thread and may
// write what it receives straight into the caller's array; whatever the
// pieces a poller asks for, and with send completions on the same CQ, every
// completion comes once, in order, with all its fields.
TEST_CASE("small SENDs polled in pieces of any size: completions in order, every field", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  const size_t n = 600, len = 64;
  std::vector<uint8_t> tx(n * len), rx(n * len, 0), back(8);
  for (size_t i = 0; i < tx.size(); i++) tx[i] = uint8_t(i * 7 + 3);
  ibv_mr *mt = ibv_reg_mr(d.pd, tx.data(), tx.size(), 0);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mb = ibv_reg_mr(d.pd, back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE((mt && mr && mb));
  for (size_t i = 0; i < 200; i++) {   // (b's queue takes 256: reposted as they complete)
    ibv_sge s{uintptr_t(rx.data() + i * len), uint32_t(len), mr->lkey};
    REQUIRE(post_recv(b.qp, 1000 + i, &s, 1) == 0);
  }
  for (size_t i = 0; i < 8; i++) {
    ibv_sge s{uintptr_t(back.data()), 8, mb->lkey};
    REQUIRE(post_recv(a.qp, 5000 + i, &s, 1) == 0);
  }
  size_t sent = 0, posted = 200, recvs = 0, b_sends = 0, b_posted = 0, a_done = 0;
  uint64_t next_recv = 1000, next_b_send = 9000;
  unsigned piece = 1;
  auto end = Clock::now() + std::chrono::seconds(20);
  while ((recvs < n || b_sends < 8) && Clock::now() < end) {
    // a streams, as far as its queue and b's receives allow; b answers
    // now and then on the same CQ its receives complete on.
    while (sent < n && sent < posted && sent - a_done < 200) {
      ibv_sge s{uintptr_t(tx.data() + sent * len), uint32_t(len), mt->lkey};
      const bool imm = sent % 3 == 0;
      REQUIRE(post_send(a.qp, sent, imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, &s, 1,
                        sent % 50 == 49 || sent + 1 == n ? IBV_SEND_SIGNALED : 0, 0, 0, uint32_t(sent)) == 0);
      sent++;
    }
    ibv_wc aw[16];
    int k = ibv_poll_cq(a.cq, 16, aw);
    REQUIRE(k >= 0);
    for (int i = 0; i < k; i++) {
      REQUIRE(aw[i].status == IBV_WC_SUCCESS);
      if (aw[i].opcode == IBV_WC_SEND) a_done = aw[i].wr_id + 1;
    }
    ibv_wc wc[9];
    piece = piece % 9 + 1;   // 1, 2, ... 9, 1, ...
    k = ibv_poll_cq(b.cq, int(piece), wc);
    REQUIRE(k >= 0);
    REQUIRE(k <= int(piece));
    for (int i = 0; i < k; i++) {
      const ibv_wc &w = wc[i];
      REQUIRE(w.status == IBV_WC_SUCCESS);
      CHECK(w.qp_num == b.qp->qp_num);
      CHECK(w.vendor_err == 0);
      if (w.opcode == IBV_WC_SEND) {
        CHECK(w.wr_id == next_b_send++);
        b_sends++;
        continue;
      }
      REQUIRE(w.opcode == IBV_WC_RECV);
      REQUIRE(w.wr_id == next_recv);
      const size_t m = next_recv++ - 1000;
      CHECK(w.byte_len == len);
      CHECK(w.src_qp == a.qp->qp_num);
      CHECK(w.pkey_index == 0);
      CHECK(w.sl == 0);
      CHECK(w.dlid_path_bits == 0);
      if (m % 3 == 0) {
        CHECK(w.wc_flags == IBV_WC_WITH_IMM);
        CHECK(ntohl(w.imm_data) == m);
      } else {
        CHECK(w.wc_flags == 0);
      }
      recvs++;
      if (posted < n) {
        ibv_sge s{uintptr_t(rx.data() + posted * len), uint32_t(len), mr->lkey};
        REQUIRE(post_recv(b.qp, 1000 + posted, &s, 1) == 0);
        posted++;
      }
      if (m % 75 == 74 && b_posted < 8) {
        ibv_sge s{uintptr_t(back.data()), 8, mb->lkey};
        REQUIRE(post_send(b.qp, 9000 + b_posted++, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
      }
    }
  }
  CHECK(recvs == n);
  CHECK(b_sends == 8);
  CHECK(rx == tx);
  ibv_dereg_mr(mt);
  ibv_dereg_mr(mr);
  ibv_dereg_mr(mb);
}

TEST_CASE("inline, several SGEs, immediate data, unsignaled sends", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  std::vector<uint8_t> rx(4096, 0), big(3000);
  for (size_t i = 0; i < big.size(); i++) big[i] = uint8_t(i);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mb = ibv_reg_mr(d.pd, big.data(), big.size(), 0);
  for (int i = 0; i < 3; i++) {
    ibv_sge s[2] = {{uintptr_t(rx.data() + i * 1024), 100, mr->lkey},
                    {uintptr_t(rx.data() + i * 1024 + 512), 400, mr->lkey}};
    REQUIRE(post_recv(b.qp, 10 + i, s, 2) == 0);
  }
  char msg[] = "inline hello";
  ibv_sge si{uintptr_t(msg), sizeof msg, 0};   // inline: no lkey needed
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND_WITH_IMM, &si, 1, IBV_SEND_INLINE | IBV_SEND_SIGNALED, 0, 0, 0xfeed) == 0);
  msg[0] = 'X';   // the data was taken at post time
  ibv_sge s2[2] = {{uintptr_t(big.data()), 50, mb->lkey}, {uintptr_t(big.data() + 1000), 150, mb->lkey}};
  REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, s2, 2, 0) == 0);   // unsignaled
  ibv_sge s3{uintptr_t(big.data()), 500, mb->lkey};
  REQUIRE(post_send(a.qp, 3, IBV_WR_SEND, &s3, 1, IBV_SEND_SIGNALED) == 0);
  auto rc = poll(b.cq, 3, 5);
  auto wc = poll(a.cq, 2, 5);
  REQUIRE(wc.size() == 2);      // the unsignaled send makes no completion
  CHECK(wc[0].wr_id == 1);
  CHECK(wc[1].wr_id == 3);
  REQUIRE(rc.size() == 3);
  CHECK((rc[0].wc_flags & IBV_WC_WITH_IMM));
  CHECK(ntohl(rc[0].imm_data) == 0xfeed);
  CHECK(rc[0].byte_len == sizeof msg);
  CHECK(memcmp(rx.data(), "inline hello", sizeof msg) == 0);
  CHECK(!(rc[1].wc_flags & IBV_WC_WITH_IMM));
  CHECK(rc[1].byte_len == 200);
  CHECK(memcmp(rx.data() + 1024, big.data(), 50) == 0);
  CHECK(memcmp(rx.data() + 1024 + 50, big.data() + 1000, 50) == 0);    // rest of SGE 0
  CHECK(memcmp(rx.data() + 1024 + 512, big.data() + 1050, 100) == 0);  // spills into SGE 1
  CHECK(rc[2].byte_len == 500);
  CHECK(memcmp(rx.data() + 2048, big.data(), 100) == 0);
  CHECK(memcmp(rx.data() + 2048 + 512, big.data() + 100, 400) == 0);
  ibv_dereg_mr(mr);
  ibv_dereg_mr(mb);
}

TEST_CASE("RDMA WRITE and WRITE with immediate; bad rkey gives REM_ACCESS_ERR", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  std::vector<uint8_t> src(200000), dst(300000, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i ^ (i >> 8));
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), 0);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(post_recv(b.qp, 77, nullptr, 0) == 0);
  ibv_sge s{uintptr_t(src.data()), 150000, ms->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()) + 10, md->rkey) == 0);
  ibv_sge s2{uintptr_t(src.data() + 150000), 50000, ms->lkey};
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE_WITH_IMM, &s2, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()) + 200000, md->rkey, 42) == 0);
  ibv_sge z{0, 0, 0};
  REQUIRE(post_send(a.qp, 3, IBV_WR_RDMA_WRITE, &z, 0, IBV_SEND_SIGNALED, 0, 0) == 0);   // zero length
  auto wc = poll(a.cq, 3);
  auto rc = poll(b.cq, 1);
  REQUIRE(wc.size() == 3);
  for (auto &w : wc) CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(wc[0].opcode == IBV_WC_RDMA_WRITE);
  REQUIRE(rc.size() == 1);
  CHECK(rc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(rc[0].wr_id == 77);
  CHECK(ntohl(rc[0].imm_data) == 42);
  CHECK(rc[0].byte_len == 50000);
  CHECK(memcmp(dst.data() + 10, src.data(), 150000) == 0);
  CHECK(memcmp(dst.data() + 200000, src.data() + 150000, 50000) == 0);
  CHECK(dst[9] == 0);
  CHECK(dst[150010] == 0);
  // A wrong rkey: the responder NAKs, nothing is written, the QP fails.
  std::fill(dst.begin(), dst.end(), 0);
  REQUIRE(post_send(a.qp, 4, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()), md->rkey + 1000) == 0);
  REQUIRE(post_send(a.qp, 5, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()), md->rkey) == 0);
  wc = poll(a.cq, 2);
  REQUIRE(wc.size() == 2);
  CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
  CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0; }));
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0);
  CHECK(qa.qp_state == IBV_QPS_ERR);
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

TEST_CASE("a dead peer: RETRY_EXC_ERR after retry_cnt+1 Local ACK Timeouts", "[verbs]") {
  const uint64_t timeouts = device_counter(usrc::Counter::timeouts);
  {
    Dev d;
    Qp a(d);
    Params p;
    // 67 ms: long enough that a slow machine's scheduling delays (tens of
    // ms on a loaded two-core runner) do not blur four timeouts into five.
    p.timeout = 14;
    p.retry = 3;
    // A QPN of a slot no process has: nothing answers.
    connect(d, a, (4000u << 12) | 5, p);
    std::vector<uint8_t> buf(64);
    ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), 0);
    ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
    auto t0 = Clock::now();
    REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, &s, 1, 0) == 0);
    auto wc = poll(a.cq, 1, 5);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    REQUIRE(!wc.empty());
    CHECK(wc[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(wc[0].wr_id == 1);
    double t = 4.096e-3 * (1 << 14);
    INFO("elapsed " << ms << " ms, timeout " << t << " ms");
    CHECK(ms >= 4 * t * 0.95);   // (no upper bound: a loaded machine is only slower)
    if (wc.size() == 1) wc.push_back(poll(a.cq, 1, 1).at(0));
    REQUIRE(wc.size() == 2);
    CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR);   // flushed, though unsignaled
    CHECK(wc[1].wr_id == 2);
    ibv_dereg_mr(m);
  }
  // Four timeouts, not five: counted by the provider (flushed as the
  // context closed), whatever the machine's load. (In virtual time:
  // test_transport_sim.cpp, "a vanished peer".)
  if (timeouts != UINT64_MAX) CHECK(device_counter(usrc::Counter::timeouts) - timeouts == 4);
}

TEST_CASE("RNR: no receive posted, rnr_retry exhausted", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  Params pa, pb;
  pa.rnr_retry = 2;
  pb.min_rnr = 1;   // 0.01 ms
  connect_pair(d, a, b, pa, pb);
  std::vector<uint8_t> buf(64);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), 0);
  ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  auto wc = poll(a.cq, 1, 5);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
  ibv_dereg_mr(m);
}

TEST_CASE("local checks: bad lkey, MR of another PD, range", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  std::vector<uint8_t> buf(4096);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), 1024, 0);
  SECTION("unknown lkey") {
    ibv_sge s{uintptr_t(buf.data()), 64, m->lkey + 12345};
    REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  }
  SECTION("beyond the MR") {
    ibv_sge s{uintptr_t(buf.data()) + 1000, 64, m->lkey};
    REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  }
  SECTION("receive into an MR without local write: fails when a message uses it") {
    ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
    REQUIRE(post_recv(a.qp, 1, &s, 1) == 0);
    uint8_t msg[16] = {};
    ibv_sge inl{uintptr_t(msg), sizeof msg, 0};
    REQUIRE(post_send(b.qp, 9, IBV_WR_SEND, &inl, 1, IBV_SEND_INLINE) == 0);
  }
  auto wc = poll(a.cq, 1, 2);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_LOC_PROT_ERR);
  CHECK(wc[0].wr_id == 1);
  ibv_dereg_mr(m);
}

// A lone receive of one SGE takes a short cut; every case it does not
// cover must still get the general path's answer.
TEST_CASE("a lone receive of one buffer: errors as for any receive", "[verbs]") {
  Dev d;
  std::vector<uint8_t> buf(4096);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), 1024, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m);
  ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
  SECTION("RESET QP: EINVAL, bad_wr set") {
    Qp a(d);
    ibv_recv_wr wr = recv_wr(1, &s, 1), *bad = nullptr;
    CHECK(ibv_post_recv(a.qp, &wr, &bad) == EINVAL);
    CHECK(bad == &wr);
  }
  SECTION("full receive queue: ENOMEM, bad_wr set, nothing lost") {
    Qp a(d, 4);
    REQUIRE(to_init(a.qp, 0) == 0);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0);
    const uint32_t cap = qa.cap.max_recv_wr;
    for (uint32_t i = 0; i < cap; i++) REQUIRE(post_recv(a.qp, i, &s, 1) == 0);
    ibv_recv_wr wr = recv_wr(99, &s, 1), *bad = nullptr;
    CHECK(ibv_post_recv(a.qp, &wr, &bad) == ENOMEM);
    CHECK(bad == &wr);
    // Moved to ERR, every posted receive completes flushed, in order.
    ibv_qp_attr e{};
    e.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(a.qp, &e, IBV_QP_STATE) == 0);
    auto wc = poll(a.cq, cap, 2);
    REQUIRE(wc.size() == cap);
    for (uint32_t i = 0; i < cap; i++) {
      CHECK(wc[i].wr_id == i);
      CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR);
    }
  }
  SECTION("unknown lkey, outside the MR: completes with LOC_PROT_ERR when a message uses it") {
    Qp a(d), b(d);
    connect_pair(d, a, b);
    ibv_sge bad_key{uintptr_t(buf.data()), 64, m->lkey + 777};
    ibv_sge outside{uintptr_t(buf.data()) + 1000, 64, m->lkey};
    REQUIRE(post_recv(a.qp, 1, &bad_key, 1) == 0);
    REQUIRE(post_recv(a.qp, 2, &outside, 1) == 0);
    uint8_t msg[16] = {};
    ibv_sge inl{uintptr_t(msg), sizeof msg, 0};
    REQUIRE(post_send(b.qp, 9, IBV_WR_SEND, &inl, 1, IBV_SEND_INLINE) == 0);
    auto wc = poll(a.cq, 2, 2);
    REQUIRE(wc.size() >= 1);
    CHECK(wc[0].wr_id == 1);
    CHECK(wc[0].status == IBV_WC_LOC_PROT_ERR);
  }
  SECTION("QP in ERR: the receive completes flushed") {
    Qp a(d);
    REQUIRE(to_init(a.qp, 0) == 0);
    ibv_qp_attr e{};
    e.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(a.qp, &e, IBV_QP_STATE) == 0);
    REQUIRE(post_recv(a.qp, 5, &s, 1) == 0);
    auto wc = poll(a.cq, 1, 2);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].wr_id == 5);
    CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR);
  }
  ibv_dereg_mr(m);
}

TEST_CASE("misuse of verbs gets errors, not crashes", "[verbs]") {
  Dev d;
  Qp a(d);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  // Posting to a RESET QP.
  ibv_sge s{0, 0, 0};
  CHECK(post_send(a.qp, 1, IBV_WR_SEND, &s, 0, 0) == EINVAL);
  CHECK(post_recv(a.qp, 1, &s, 0) == EINVAL);
  // Skipping INIT; missing required attributes; out-of-range values.
  Params p;
  CHECK(to_rtr(d, a.qp, 0x1000, p) == EINVAL);
  CHECK(to_init(a.qp, 0) == 0);
  ibv_qp_attr bad{};
  bad.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(a.qp, &bad, IBV_QP_STATE | IBV_QP_PATH_MTU) == EINVAL);
  p.timeout = 40;
  CHECK(to_rts(a.qp, p) == EINVAL);
  Params big;
  big.mtu = static_cast<ibv_mtu>(6);
  CHECK(to_rtr(d, a.qp, 0x1000, big) == EINVAL);
  CHECK(to_rtr(d, a.qp, 0x5, p) == EINVAL);   // QPN 5: slot 0 is no usrc process
  REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0);
  CHECK(qa.qp_state == IBV_QPS_INIT);           // failed modifies changed nothing
  // Unsupported operations and QP types.
  Params ok;
  REQUIRE(to_rtr(d, a.qp, a.qp->qp_num, ok) == 0);
  REQUIRE(to_rts(a.qp, ok) == 0);
  alignas(8) uint64_t scratch = 0;
  ibv_sge seven{uintptr_t(&scratch), 7, 0};
  CHECK(post_send(a.qp, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, &seven, 1, 0) == EINVAL);   // not 8 bytes
  CHECK(post_send(a.qp, 1, IBV_WR_RDMA_READ, &seven, 1, IBV_SEND_INLINE) == EINVAL);
  ibv_sge eight{uintptr_t(&scratch), 8, 0};
  CHECK(post_send(a.qp, 1, IBV_WR_ATOMIC_CMP_AND_SWP, &eight, 1, IBV_SEND_INLINE) == EINVAL);   // writes local memory
  CHECK(post_send(a.qp, 1, IBV_WR_TSO, &eight, 1, 0) == EINVAL);      // not in the WR opcode table
  CHECK(post_send(a.qp, 1, IBV_WR_DRIVER1, &eight, 1, 0) == EINVAL);
  CHECK(post_send(a.qp, 1, IBV_WR_LOCAL_INV, &eight, 1, IBV_SEND_INLINE) == EINVAL);   // no data at all
  ibv_sge many[9] = {};
  CHECK(post_send(a.qp, 1, IBV_WR_SEND, many, 9, 0) == EINVAL);
  ibv_qp_init_attr raw{};
  raw.send_cq = raw.recv_cq = a.cq;
  raw.qp_type = IBV_QPT_RAW_PACKET;
  raw.cap = {1, 1, 1, 1, 0};
  errno = 0;
  CHECK(ibv_create_qp(d.pd, &raw) == nullptr);   // (not implemented)
  CHECK(errno == EOPNOTSUPP);
  ibv_qp_init_attr huge{};
  huge.send_cq = huge.recv_cq = a.cq;
  huge.qp_type = IBV_QPT_RC;
  huge.cap = {1u << 20, 1, 1, 1, 0};
  CHECK(ibv_create_qp(d.pd, &huge) == nullptr);
  CHECK(ibv_create_cq(d.ctx, 0, nullptr, nullptr, 0) == nullptr);
  CHECK(ibv_reg_mr(d.pd, &s, 8, IBV_ACCESS_REMOTE_WRITE) == nullptr);   // needs LOCAL_WRITE
  CHECK(ibv_dealloc_pd(d.pd) == EBUSY);   // the QP uses it
  ibv_port_attr pa;
  CHECK(ibv_query_port(d.ctx, 2, &pa) == EINVAL);
}

// While the application polls, the progress thread stays out and only
// looks now and then whether it stopped; once the application stops and
// waits for a completion event, the progress thread takes over and
// delivers it. How rarely it looks (the backoff) and how soon it takes
// over are the policy's, shown in virtual time by
// tests/unit/test_progress_policy.cpp; here, that it all happens with the
// real threads (no wall-clock bound: a loaded machine is only slower).
TEST_CASE("a polling application: the progress thread stays out, and takes over once it stops", "[verbs]") {
  Dev d;
  Channel ch(d);   // (destroyed after the QPs and CQs below)
  Qp a(d, 4, ch.ch), b(d);
  ibv_cq *const acq = a.cq;
  connect_pair(d, a, b);
  ibv_sge s0{0, 0, 0};

  // 700 ms of polling (CQs without a channel: taken for a poller). A
  // message between two other QPs early on wakes the progress thread if
  // it slept on the socket: it finds the application polling and from
  // then on only looks in.
  Qp c(d), e(d);
  connect_pair(d, c, e);
  REQUIRE(post_recv(e.qp, 1, nullptr, 0) == 0);
  ibv_wc wc[4];
  const auto start = Clock::now();
  bool sent = false;
  size_t done = 0;
  for (auto end = start + std::chrono::milliseconds(700); Clock::now() < end;) {
    REQUIRE(ibv_poll_cq(b.cq, 4, wc) == 0);
    if (!sent && Clock::now() - start > std::chrono::milliseconds(20)) {
      REQUIRE(post_send(c.qp, 1, IBV_WR_SEND, &s0, 0, IBV_SEND_SIGNALED) == 0);
      sent = true;
    }
    done += ibv_poll_cq(c.cq, 4, wc) + ibv_poll_cq(e.cq, 4, wc);
  }
  CHECK(done == 2);

  // Then the application stops polling and waits for a completion event:
  // the progress thread must notice, carry the SEND and its ACK, and fire it.
  REQUIRE(ibv_req_notify_cq(acq, 0) == 0);
  REQUIRE(post_recv(b.qp, 7, nullptr, 0) == 0);
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s0, 0, IBV_SEND_SIGNALED) == 0);
  pollfd pf{ch.ch->fd, POLLIN, 0};
  REQUIRE(::poll(&pf, 1, 10000) == 1);
  ibv_cq *ev_cq = nullptr;
  void *ev_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(ch.ch, &ev_cq, &ev_ctx) == 0);
  CHECK(ev_cq == acq);
  ibv_ack_cq_events(acq, 1);
  auto got = poll(acq, 1, 2);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == IBV_WC_SUCCESS);
  CHECK(poll(b.cq, 1, 2).size() == 1);
}

TEST_CASE("an application that waits for completion events: the progress thread takes over as it arms", "[verbs]") {
  Dev d;
  Channel ch(d);
  Qp a(d, 16, ch.ch), b(d);
  connect_pair(d, a, b);
  ibv_sge s0{0, 0, 0};
  // Each round: the receiver's CQ (no channel) polled, a SEND, the
  // sender's CQ armed and polled until empty, then a wait for its event.
  // The polls are no polling loop once the CQ is armed: the progress
  // thread carries the SEND and its ACK at once, not after the last poll
  // is USRC_APP_QUIET_US (1 ms) old. That it does so at once is the
  // policy's (tests/unit/test_progress_policy.cpp, in virtual time); here,
  // every round's event and completions arrive.
  constexpr int kRounds = 200;
  ibv_wc wc[4];
  size_t received = 0;
  for (int i = 0; i < kRounds; i++) {
    REQUIRE(post_recv(b.qp, i, nullptr, 0) == 0);
    int k = ibv_poll_cq(b.cq, 4, wc);
    REQUIRE(k >= 0);
    received += size_t(k);
    REQUIRE(post_send(a.qp, i, IBV_WR_SEND, &s0, 0, IBV_SEND_SIGNALED) == 0);
    REQUIRE(ibv_req_notify_cq(a.cq, 0) == 0);
    int got = ibv_poll_cq(a.cq, 4, wc);
    if (got == 0) {
      pollfd pf{ch.ch->fd, POLLIN, 0};
      REQUIRE(::poll(&pf, 1, 10000) == 1);
      ibv_cq *ev_cq = nullptr;
      void *ev_ctx = nullptr;
      REQUIRE(ibv_get_cq_event(ch.ch, &ev_cq, &ev_ctx) == 0);
      ibv_ack_cq_events(ev_cq, 1);
      got = int(poll(a.cq, 1, 2).size());
    } else {
      // (Taken by the poll: an event may still be pending.)
      pollfd pf{ch.ch->fd, POLLIN, 0};
      if (::poll(&pf, 1, 0) == 1) {
        ibv_cq *ev_cq = nullptr;
        void *ev_ctx = nullptr;
        REQUIRE(ibv_get_cq_event(ch.ch, &ev_cq, &ev_ctx) == 0);
        ibv_ack_cq_events(ev_cq, 1);
      }
    }
    REQUIRE(got == 1);
  }
  received += poll(b.cq, kRounds - received, 2).size();
  CHECK(received == size_t(kRounds));
}

TEST_CASE("completion channel: events for a usrc CQ", "[verbs]") {
  Dev d;
  ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
  REQUIRE(ch);
  CHECK(ch->fd > 2);   // never the application's stdin
  ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
  REQUIRE(cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {4, 4, 1, 1, 0};
  ibv_qp *qp = ibv_create_qp(d.pd, &ia);
  REQUIRE(qp);
  Params p;
  REQUIRE(to_init(qp, 0) == 0);
  REQUIRE(to_rtr(d, qp, qp->qp_num, p) == 0);   // connected to itself
  REQUIRE(to_rts(qp, p) == 0);
  REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
  REQUIRE(post_recv(qp, 9, nullptr, 0) == 0);
  ibv_sge s{0, 0, 0};
  REQUIRE(post_send(qp, 1, IBV_WR_SEND, &s, 0, IBV_SEND_SIGNALED) == 0);
  ibv_cq *ev_cq = nullptr;
  void *ev_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
  CHECK(ev_cq == cq);
  ibv_ack_cq_events(cq, 1);
  auto wc = poll(cq, 2, 2);
  CHECK(wc.size() == 2);
  CHECK(ibv_destroy_comp_channel(ch) == EBUSY);   // a CQ still uses it
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("malformed datagrams to a QP's port are dropped and counted", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  // Our own port: the QPN's slot picks it (base port from usrc link show).
  int base = atoi(getenv("USRC_TEST_PORT") ? getenv("USRC_TEST_PORT") : "20000");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(base + (b.qp->qp_num >> 12)));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<uint8_t> junk(1500);
  srand(3);
  for (int i = 0; i < 2000; i++) {
    size_t n = rand() % junk.size();
    for (size_t k = 0; k < n; k++) junk[k] = uint8_t(rand());
    if (i % 3 == 0 && n >= 12) {   // a plausible BTH aimed at b's QP
      junk[0] = 0x04;
      junk[1] = 0;
      junk[5] = uint8_t(b.qp->qp_num >> 16);
      junk[6] = uint8_t(b.qp->qp_num >> 8);
      junk[7] = uint8_t(b.qp->qp_num);
    }
    sendto(fd, junk.data(), n, 0, reinterpret_cast<sockaddr *>(&to), sizeof to);
  }
  close(fd);
  // The connection still works afterwards.
  std::vector<uint8_t> rx(100), tx(100, 5);
  ibv_mr *mr = ibv_reg_mr(d.pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mt = ibv_reg_mr(d.pd, tx.data(), tx.size(), 0);
  ibv_sge r{uintptr_t(rx.data()), 100, mr->lkey}, t{uintptr_t(tx.data()), 100, mt->lkey};
  REQUIRE(post_recv(b.qp, 1, &r, 1) == 0);
  REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, &t, 1, IBV_SEND_SIGNALED) == 0);
  CHECK(poll(a.cq, 1).size() == 1);
  CHECK(poll(b.cq, 1).size() == 1);
  CHECK(rx == tx);
  ibv_dereg_mr(mr);
  ibv_dereg_mr(mt);
}

TEST_CASE("RDMA READ and ATOMICs through the verbs API", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  Params pa, pb;
  pa.access = pb.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  connect_pair(d, a, b, pa, pb);
  std::vector<uint8_t> remote(1 << 20), local(1 << 20, 0);
  for (size_t i = 0; i < remote.size(); i++) remote[i] = uint8_t(i * 7 + i / 4096);
  alignas(8) uint64_t words[2] = {100, 5};
  ibv_mr *mr = ibv_reg_mr(d.pd, remote.data(), remote.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr *ml = ibv_reg_mr(d.pd, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mw = ibv_reg_mr(d.pd, words, sizeof words, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  alignas(8) uint64_t res[3] = {0, 0, 0};
  ibv_mr *mres = ibv_reg_mr(d.pd, res, sizeof res, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s{uintptr_t(local.data()), uint32_t(local.size()), ml->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_READ, &s, 1, IBV_SEND_SIGNALED, uintptr_t(remote.data()), mr->rkey) == 0);
  auto fa = [&](uint64_t id, uint64_t *out, uint64_t add) {
    ibv_send_wr wr{}, *bad;
    ibv_sge g{uintptr_t(out), 8, mres->lkey};
    wr.wr_id = id;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.sg_list = &g;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic = {uintptr_t(&words[0]), add, 0, mw->rkey};
    return ibv_post_send(a.qp, &wr, &bad);
  };
  REQUIRE(fa(2, &res[0], 11) == 0);
  ibv_send_wr wr{}, *bad;
  ibv_sge g{uintptr_t(&res[1]), 8, mres->lkey};
  wr.wr_id = 3;
  wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.sg_list = &g;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
  wr.wr.atomic = {uintptr_t(&words[1]), 5, 42, mw->rkey};
  REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
  auto wc = poll(a.cq, 3);
  REQUIRE(wc.size() == 3);
  for (auto &w : wc) CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(wc[0].opcode == IBV_WC_RDMA_READ);
  CHECK(wc[0].byte_len == local.size());
  CHECK(wc[1].opcode == IBV_WC_FETCH_ADD);
  CHECK(wc[2].opcode == IBV_WC_COMP_SWAP);
  CHECK(local == remote);
  CHECK(res[0] == 100);
  CHECK(words[0] == 111);
  CHECK(res[1] == 5);
  CHECK(words[1] == 42);
  // A READ beyond the region: REM_ACCESS_ERR, nothing read.
  std::fill(local.begin(), local.end(), 0);
  ibv_sge s2{uintptr_t(local.data()), 100, ml->lkey};
  REQUIRE(post_send(a.qp, 4, IBV_WR_RDMA_READ, &s2, 1, IBV_SEND_SIGNALED, uintptr_t(remote.data()) + remote.size() - 50, mr->rkey) == 0);
  wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
  CHECK(local[0] == 0);
  for (ibv_mr *m : {mr, ml, mw, mres}) ibv_dereg_mr(m);
}

// RDMA ATOMIC WRITE (IBA 1.5): 8 bytes stored whole at an aligned address
// of a region with remote write access; the WR's word, from an SGE or the
// extended API's pointer.
TEST_CASE("ATOMIC WRITE: ibv_post_send and ibv_wr_atomic_write; alignment, access and length checked", "[verbs]") {
  Dev d;
  ibv_device_attr_ex dx{};
  REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &dx) == 0);
  CHECK((dx.device_cap_flags_ex & (1ull << 40)) != 0);   // IB_UVERBS_DEVICE_ATOMIC_WRITE
  QpEx a(d, IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE);
  ibv_qp *qp = a.qp;
  ibv_cq *cq = a.cq;
  Qp b(d);
  connect_pair(d, a, b);
  alignas(8) uint64_t words[3] = {1, 2, 3};
  alignas(8) uint64_t val = 0x1122334455667788ull;
  ibv_mr *mw = ibv_reg_mr(d.pd, words, sizeof words, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr *mv = ibv_reg_mr(d.pd, &val, 8, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mro = ibv_reg_mr(d.pd, &words[2], 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  // Through ibv_post_send: the word is the SGE's 8 bytes.
  ibv_sge g{uintptr_t(&val), 8, mv->lkey};
  REQUIRE(post_send(qp, 1, IBV_WR_ATOMIC_WRITE, &g, 1, IBV_SEND_SIGNALED, uintptr_t(&words[0]), mw->rkey) == 0);
  auto wc = poll(cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(wc[0].opcode == IBV_WC_ATOMIC_WRITE);
  CHECK(words[0] == val);
  CHECK(words[1] == 2);
  // Through the extended API: the word is read at the call.
  ibv_qp_ex *x = a.x;
  uint64_t v2 = 0xa5a5a5a5deadbeefull;
  ibv_wr_start(x);
  x->wr_id = 2;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(x, mw->rkey, uintptr_t(&words[1]), &v2);
  v2 = 0;
  REQUIRE(ibv_wr_complete(x) == 0);
  wc = poll(cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(wc[0].wr_id == 2);
  CHECK(wc[0].opcode == IBV_WC_ATOMIC_WRITE);
  CHECK(words[1] == 0xa5a5a5a5deadbeefull);
  // Not 8 bytes: refused at post.
  ibv_sge g7{uintptr_t(&val), 7, mv->lkey};
  CHECK(post_send(qp, 3, IBV_WR_ATOMIC_WRITE, &g7, 1, IBV_SEND_SIGNALED, uintptr_t(&words[0]), mw->rkey) == EINVAL);
  SECTION("a misaligned address: REM_INV_REQ_ERR, nothing written") {
    REQUIRE(post_send(qp, 4, IBV_WR_ATOMIC_WRITE, &g, 1, IBV_SEND_SIGNALED, uintptr_t(&words[0]) + 4, mw->rkey) == 0);
    wc = poll(cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(remote_error(wc[0].status, IBV_WC_REM_INV_REQ_ERR));
    CHECK(words[1] == 0xa5a5a5a5deadbeefull);
  }
  SECTION("a region without remote write: REM_ACCESS_ERR, nothing written") {
    REQUIRE(post_send(qp, 5, IBV_WR_ATOMIC_WRITE, &g, 1, IBV_SEND_SIGNALED, uintptr_t(&words[2]), mro->rkey) == 0);
    wc = poll(cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
    CHECK(words[2] == 3);
  }
  for (ibv_mr *m : {mw, mv, mro}) ibv_dereg_mr(m);
}

// Two processes hammer the same 8-byte word of a third with FETCH_AND_ADD:
// the final value is the number of adds (atomic across QPs and processes).
TEST_CASE("two processes FETCH_AND_ADD one word", "[verbs]") {
  const int kProcs = 2, kAdds = 2000;
  int to_child[kProcs][2], to_parent[kProcs][2];
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; i++) {
    REQUIRE(pipe(to_child[i]) == 0);
    REQUIRE(pipe(to_parent[i]) == 0);
    pids[i] = fork();
    REQUIRE(pids[i] >= 0);
    if (pids[i] == 0) {
      // Child: own context, one QP, kAdds FETCH_AND_ADDs of 1, 16 in flight.
      int rc = 1;
      {
        Dev d;
        Qp q(d, 64);
        uint32_t my = q.qp->qp_num, peer = 0;
        uint64_t va = 0;
        uint32_t rkey = 0;
        if (write(to_parent[i][1], &my, 4) == 4 && read(to_child[i][0], &peer, 4) == 4 &&
            read(to_child[i][0], &va, 8) == 8 && read(to_child[i][0], &rkey, 4) == 4) {
          Params p;
          REQUIRE(to_init(q.qp, 0) == 0);
          REQUIRE(to_rtr(d, q.qp, peer, p) == 0);
          ibv_qp_attr a{};
          a.qp_state = IBV_QPS_RTS;
          a.timeout = 14;
          a.retry_cnt = 7;
          a.rnr_retry = 7;
          a.max_rd_atomic = 16;
          REQUIRE(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
          alignas(8) static uint64_t out[64];
          ibv_mr *m = ibv_reg_mr(d.pd, out, sizeof out, IBV_ACCESS_LOCAL_WRITE);
          int posted = 0, done = 0, errors = 0;
          while (done < kAdds) {
            while (posted < kAdds && posted - done < 16) {
              ibv_send_wr wr{}, *bad;
              ibv_sge g{uintptr_t(&out[posted % 64]), 8, m->lkey};
              wr.wr_id = posted;
              wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
              wr.sg_list = &g;
              wr.num_sge = 1;
              wr.send_flags = IBV_SEND_SIGNALED;
              wr.wr.atomic = {va, 1, 0, rkey};
              if (ibv_post_send(q.qp, &wr, &bad)) break;
              posted++;
            }
            ibv_wc wc[16];
            int n = ibv_poll_cq(q.cq, 16, wc);
            for (int k = 0; k < n; k++) errors += wc[k].status != IBV_WC_SUCCESS;
            done += n > 0 ? n : 0;
          }
          ibv_dereg_mr(m);
          rc = errors ? 2 : 0;
          char ok = 1;
          (void)!write(to_parent[i][1], &ok, 1);
        }
      }
      _exit(rc);
    }
  }
  Dev d;
  alignas(8) static uint64_t word = 1u << 20;
  ibv_mr *m = ibv_reg_mr(d.pd, &word, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  std::vector<std::unique_ptr<Qp>> qps;
  for (int i = 0; i < kProcs; i++) {
    uint32_t child = 0;
    REQUIRE(read(to_parent[i][0], &child, 4) == 4);
    qps.push_back(std::make_unique<Qp>(d, 64));
    Params p;
    p.access = IBV_ACCESS_REMOTE_ATOMIC;
    REQUIRE(to_init(qps[i]->qp, p.access) == 0);
    REQUIRE(to_rtr(d, qps[i]->qp, child, p) == 0);
    uint32_t mine = qps[i]->qp->qp_num;
    uint64_t va = uintptr_t(&word);
    REQUIRE(write(to_child[i][1], &mine, 4) == 4);
    REQUIRE(write(to_child[i][1], &va, 8) == 8);
    REQUIRE(write(to_child[i][1], &m->rkey, 4) == 4);
  }
  for (int i = 0; i < kProcs; i++) {
    char ok = 0;
    CHECK(read(to_parent[i][0], &ok, 1) == 1);
    int status = 0;
    REQUIRE(waitpid(pids[i], &status, 0) == pids[i]);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // (Read as the provider's progress thread wrote it, atomically: what
  // orders the two is the children's pipe, which a race detector cannot see.)
  CHECK(__atomic_load_n(&word, __ATOMIC_ACQUIRE) == (1u << 20) + uint64_t(kProcs) * kAdds);
  qps.clear();
  ibv_dereg_mr(m);
}

// The extended send API: ibv_wr_* builders, posted all or none.
TEST_CASE("ibv_wr_* send API: every builder, abort, errors", "[verbs]") {
  Dev d;
  Qp b(d);
  // An operation usrc does not do is refused at creation.
  ibv_qp_init_attr_ex ia{};
  ia.qp_type = IBV_QPT_RC;
  ia.send_cq = ia.recv_cq = b.cq;
  ia.cap = {16, 16, 4, 4, 64};
  ia.pd = d.pd;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
  errno = 0;
  CHECK(ibv_create_qp_ex(d.ctx, &ia) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  QpEx a(d, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
  ibv_cq *cq = a.cq;
  ibv_qp_ex *x = a.x;
  CHECK(ibv_qp_to_qp_ex(b.qp) == nullptr);   // a plain QP has no builders
  Params pa, pb;
  pa.access = pb.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  connect_pair(d, a, b, pa, pb);

  std::vector<uint8_t> src(3000), dst(3000, 0), rbuf(3000, 0), rd(3000, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 3 + 1);
  alignas(8) uint64_t word = 7, old[2] = {0, 0};
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr *mr = ibv_reg_mr(d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mrd = ibv_reg_mr(d.pd, rd.data(), rd.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mw = ibv_reg_mr(d.pd, &word, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_mr *mo = ibv_reg_mr(d.pd, old, sizeof old, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge rs{uintptr_t(rbuf.data()), uint32_t(rbuf.size()), mr->lkey};
  REQUIRE(post_recv(b.qp, 9, &rs, 1) == 0);

  // A batch that is aborted posts nothing.
  ibv_wr_start(x);
  x->wr_id = 66;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, ms->lkey, uintptr_t(src.data()), 100);
  ibv_wr_abort(x);
  CHECK(poll(cq, 1, 0.3).empty());

  // One batch: WRITE (inline list), SEND with immediate (SGE list), READ,
  // FETCH_AND_ADD, CMP_AND_SWP.
  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_SIGNALED;
  x->wr_id = 1;
  ibv_wr_rdma_write(x, md->rkey, uintptr_t(dst.data()));
  ibv_data_buf bufs[2] = {{src.data(), 100}, {src.data() + 100, 100}};
  ibv_wr_set_inline_data_list(x, 2, bufs);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(0xabcd));
  ibv_sge two[2] = {{uintptr_t(src.data()), 1000, ms->lkey}, {uintptr_t(src.data()) + 1000, 2000, ms->lkey}};
  ibv_wr_set_sge_list(x, 2, two);
  x->wr_id = 3;
  ibv_wr_rdma_read(x, md->rkey, uintptr_t(dst.data()));
  ibv_wr_set_sge(x, mrd->lkey, uintptr_t(rd.data()), 200);
  x->wr_id = 4;
  ibv_wr_atomic_fetch_add(x, mw->rkey, uintptr_t(&word), 5);
  ibv_wr_set_sge(x, mo->lkey, uintptr_t(&old[0]), 8);
  x->wr_id = 5;
  x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
  ibv_wr_atomic_cmp_swp(x, mw->rkey, uintptr_t(&word), 12, 99);
  ibv_wr_set_sge(x, mo->lkey, uintptr_t(&old[1]), 8);
  REQUIRE(ibv_wr_complete(x) == 0);
  auto wc = poll(cq, 5);
  REQUIRE(wc.size() == 5);
  std::vector<uint64_t> sends;
  for (auto &w : wc) {
    CHECK(w.status == IBV_WC_SUCCESS);
    sends.push_back(w.wr_id);
  }
  auto rw = poll(b.cq, 1);
  REQUIRE(rw.size() == 1);
  CHECK(rw[0].status == IBV_WC_SUCCESS);
  CHECK(rw[0].wr_id == 9);
  CHECK(rw[0].byte_len == 3000);
  CHECK((rw[0].wc_flags & IBV_WC_WITH_IMM));
  CHECK(ntohl(rw[0].imm_data) == 0xabcd);
  CHECK(sends == std::vector<uint64_t>{1, 2, 3, 4, 5});
  CHECK(std::memcmp(dst.data(), src.data(), 200) == 0);
  CHECK(rbuf == src);
  CHECK(std::memcmp(rd.data(), src.data(), 200) == 0);
  CHECK(old[0] == 7);
  CHECK(old[1] == 12);
  CHECK(word == 99);

  // Errors surface at ibv_wr_complete, and nothing of the batch is posted.
  ibv_wr_start(x);
  ibv_wr_set_sge(x, ms->lkey, uintptr_t(src.data()), 1);   // no work request yet
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_wr_start(x);
  x->wr_id = 7;
  ibv_wr_rdma_write(x, md->rkey, uintptr_t(dst.data()));
  std::vector<uint8_t> big(4096);
  ibv_wr_set_inline_data(x, big.data(), big.size());   // above max_inline_data
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_wr_start(x);
  for (int i = 0; i < 17; i++) {   // more than the send queue holds
    ibv_wr_rdma_write(x, md->rkey, uintptr_t(dst.data()));
    ibv_wr_set_sge(x, ms->lkey, uintptr_t(src.data()), 1);
  }
  CHECK(ibv_wr_complete(x) == ENOMEM);
  // A good WRITE before an ATOMIC whose SGE is not 8 bytes: neither goes.
  ibv_wr_start(x);
  x->wr_id = 8;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, md->rkey, uintptr_t(dst.data()));
  ibv_wr_set_sge(x, ms->lkey, uintptr_t(src.data()), 1);
  ibv_wr_atomic_fetch_add(x, mw->rkey, uintptr_t(&word), 1);
  ibv_wr_set_sge(x, mo->lkey, uintptr_t(&old[0]), 4);
  CHECK(ibv_wr_complete(x) == EINVAL);
  CHECK(poll(cq, 1, 0.3).empty());
  CHECK(word == 99);

  for (ibv_mr *m : {ms, md, mr, mrd, mw, mo}) ibv_dereg_mr(m);
}

// On-demand paging: nothing pinned; memory unmapped while registered gives
// an access error, never a crash. Implicit ODP covers the address space.
TEST_CASE("ODP: implicit MR, and memory unmapped while registered", "[verbs][unmapped]") {
  Dev d;
  ibv_device_attr_ex ax{};
  REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &ax) == 0);
  REQUIRE((ax.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT));
  Qp a(d), b(d);
  Params p;
  p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  // (Under loss, one retry is not enough for the WRITE that must succeed:
  // a lost last packet and a lost resend happen about once in a hundred.)
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  connect_pair(d, a, b, p, p);
  const int odp = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                  IBV_ACCESS_REMOTE_READ;
  ibv_mr *all = ibv_reg_mr(d.pd, nullptr, SIZE_MAX, odp);
  REQUIRE(all);
  const size_t len = 64 * 1024;
  auto *region = static_cast<uint8_t *>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(region != MAP_FAILED);
  ibv_mr *mr = ibv_reg_mr(d.pd, region, len, odp);
  REQUIRE(mr);
  // Through the implicit MR: a WRITE from a stack buffer into the region.
  std::vector<uint8_t> src(5000);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i ^ 0x5a);
  ibv_sge s{uintptr_t(src.data()), uint32_t(src.size()), all->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(region), mr->rkey) == 0);
  auto wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(region, src.data(), src.size()) == 0);
  // The region goes away while registered: a WRITE into it is refused by
  // the responder (REM_ACCESS_ERR), and the process lives on.
  REQUIRE(munmap(region, len) == 0);
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(region), mr->rkey) == 0);
  wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
  // Sending from it locally: a local protection error.
  Qp c(d), e(d);
  connect_pair(d, c, e, p, p);
  ibv_sge gone{uintptr_t(region), 100, mr->lkey};
  REQUIRE(post_send(c.qp, 3, IBV_WR_SEND, &gone, 1, IBV_SEND_SIGNALED) == 0);
  wc = poll(c.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_LOC_PROT_ERR);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dereg_mr(all) == 0);
}

// Device memory: memory of the provider, zero-based MRs over it.
TEST_CASE("device memory: alloc, copy, zero-based MR, READ from it", "[verbs]") {
  Dev d;
  ibv_device_attr_ex ax{};
  REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &ax) == 0);
  REQUIRE(ax.max_dm_size > 0);
  ibv_alloc_dm_attr da{};
  da.length = ax.max_dm_size + 1;
  errno = 0;
  CHECK(ibv_alloc_dm(d.ctx, &da) == nullptr);
  CHECK(errno == EINVAL);
  da.length = 8192;
  ibv_dm *dm = ibv_alloc_dm(d.ctx, &da);
  REQUIRE(dm);
  std::vector<uint8_t> pattern(8192), back(8192, 0);
  for (size_t i = 0; i < pattern.size(); i++) pattern[i] = uint8_t(i * 11);
  CHECK(ibv_memcpy_to_dm(dm, 0, pattern.data(), pattern.size()) == 0);
  CHECK(ibv_memcpy_to_dm(dm, 8000, pattern.data(), 200) != 0);   // out of range
  CHECK(ibv_memcpy_to_dm(dm, 3, pattern.data(), 4) == EINVAL);   // 4-byte units
  CHECK(ibv_memcpy_to_dm(dm, 4, pattern.data(), 6) == EINVAL);
  CHECK(ibv_memcpy_from_dm(back.data(), dm, 2, 8) == EINVAL);
  CHECK(ibv_memcpy_from_dm(back.data(), dm, 0, back.size()) == 0);
  CHECK(back == pattern);
  const unsigned acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  CHECK(ibv_reg_dm_mr(d.pd, dm, 0, 4096, acc) == nullptr);   // must be zero based
  ibv_mr *dmr = ibv_reg_dm_mr(d.pd, dm, 4096, 4096, acc | IBV_ACCESS_ZERO_BASED);
  REQUIRE(dmr);
  CHECK(ibv_free_dm(dm) == EBUSY);   // an MR still maps it
  Qp a(d), b(d);
  Params p;
  p.access = IBV_ACCESS_REMOTE_READ;
  connect_pair(d, a, b, p, p);
  std::vector<uint8_t> local(4096, 0);
  ibv_mr *ml = ibv_reg_mr(d.pd, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s{uintptr_t(local.data()), 4096, ml->lkey};
  // Address 0 of the zero-based MR is offset 4096 of the device memory.
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_READ, &s, 1, IBV_SEND_SIGNALED, 0, dmr->rkey) == 0);
  auto wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(local.data(), pattern.data() + 4096, 4096) == 0);
  CHECK(ibv_dereg_mr(ml) == 0);
  CHECK(ibv_dereg_mr(dmr) == 0);
  CHECK(ibv_free_dm(dm) == 0);
}

namespace {
// Connects a and b with a GRH (traffic class, hop limit, flow label) or,
// without one, an SL; sends `n` SENDs of 3000 bytes from a to b.
void path_traffic(Dev &d, bool grh, int n) {
  Qp a(d), b(d);
  Params p;
  REQUIRE(to_init(a.qp, p.access) == 0);
  REQUIRE(to_init(b.qp, p.access) == 0);
  for (Qp *q : {&a, &b}) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = (q == &a ? b : a).qp->qp_num;
    at.min_rnr_timer = 12;
    at.ah_attr.port_num = 1;
    at.ah_attr.dlid = d.port.lid;
    at.ah_attr.sl = 5;
    if (grh || d.port.link_layer == IBV_LINK_LAYER_ETHERNET) {
      at.ah_attr.is_global = 1;
      REQUIRE(ibv_query_gid(d.ctx, 1, d.port.link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : 1,
                            &at.ah_attr.grh.dgid) == 0);
      at.ah_attr.grh.sgid_index = 0;
      at.ah_attr.grh.traffic_class = 0x68;   // DSCP 26 (AF31)
      at.ah_attr.grh.hop_limit = 7;
      at.ah_attr.grh.flow_label = 0x12345;   // UDP source port 0xC000 | 0x2345
    }
    REQUIRE(ibv_modify_qp(q->qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                          IBV_QP_MIN_RNR_TIMER) == 0);
    REQUIRE(to_rts(q->qp, p) == 0);
  }
  std::vector<uint8_t> buf(3000, 7), rbuf(3000 * n);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *rm = ibv_reg_mr(d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < n; i++) {
    ibv_sge r{uintptr_t(rbuf.data()) + 3000 * i, 3000, rm->lkey};
    REQUIRE(post_recv(b.qp, i, &r, 1) == 0);
    ibv_sge s{uintptr_t(buf.data()), 3000, m->lkey};
    REQUIRE(post_send(a.qp, i, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  }
  auto wc = poll(a.cq, n);
  REQUIRE(wc.size() == size_t(n));
  for (auto &w : wc) CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(poll(b.cq, n).size() == size_t(n));
  ibv_dereg_mr(m);
  ibv_dereg_mr(rm);
}
}  // namespace

// Hidden (run by qp_path_test.sh under a capture): the traffic whose IP and
// UDP headers the script checks.
TEST_CASE("QP path attributes on the wire", "[.path]") {
  Dev d;
  path_traffic(d, true, 5);
  if (d.port.link_layer == IBV_LINK_LAYER_INFINIBAND) path_traffic(d, false, 5);
}

TEST_CASE("QP attributes: out-of-range values refused, pacing attributes reported", "[verbs]") {
  Dev d;
  Qp a(d);
  REQUIRE(to_init(a.qp, 0) == 0);
  Params rp;
  rp.rd_atomic = 0;
  ibv_qp_attr at = rtr_attr(d, a.qp->qp_num, rp);
  const int rtr = kRtrMask;
  ibv_qp_attr bad = at;
  bad.ah_attr.sl = 16;
  CHECK(ibv_modify_qp(a.qp, &bad, rtr) == EINVAL);
  bad = at;
  bad.ah_attr.src_path_bits = 1;   // LMC 0: no path bits
  CHECK(ibv_modify_qp(a.qp, &bad, rtr) == EINVAL);
  bad = at;
  bad.ah_attr.static_rate = 99;
  CHECK(ibv_modify_qp(a.qp, &bad, rtr) == EINVAL);
  bad = at;
  bad.path_mtu = IBV_MTU_4096;
  bad.path_mtu = ibv_mtu(int(d.port.active_mtu) + 1);   // above the port's MTU
  CHECK(ibv_modify_qp(a.qp, &bad, rtr) == EINVAL);
  at.ah_attr.static_rate = IBV_RATE_5_GBPS;
  REQUIRE(ibv_modify_qp(a.qp, &at, rtr) == 0);
  Params p;
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.rate_limit = 10;   // kbit/s: below the minimum
  const int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RATE_LIMIT;
  CHECK(ibv_modify_qp(a.qp, &rts, rts_mask) == EINVAL);
  rts.rate_limit = 200000;
  REQUIRE(ibv_modify_qp(a.qp, &rts, rts_mask) == 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a.qp, &q, IBV_QP_AV | IBV_QP_RATE_LIMIT, &qi) == 0);
  CHECK(q.ah_attr.static_rate == IBV_RATE_5_GBPS);
  CHECK(q.rate_limit == 200000);
  CHECK(q.qp_state == IBV_QPS_RTS);
}

// IBV_QP_RATE_LIMIT paces the QP: 4 MB at 200 Mbit/s take at least about
// 0.17 s (a lower bound on time: a loaded machine only makes it slower).
// That the pace is the rate, not slower, is shown in virtual time
// (test_transport_sim.cpp, "a rate-limited QP").
TEST_CASE("IBV_QP_RATE_LIMIT paces the requester", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  ibv_qp_attr rl{};
  rl.rate_limit = 200000;   // kbit/s
  REQUIRE(ibv_modify_qp(a.qp, &rl, IBV_QP_RATE_LIMIT) == 0);
  std::vector<uint8_t> src(1 << 20, 3), dst(1 << 20);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto t0 = Clock::now();
  for (int i = 0; i < 4; i++) {
    ibv_sge s{uintptr_t(src.data()), uint32_t(src.size()), ms->lkey};
    REQUIRE(post_send(a.qp, i, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()), md->rkey) == 0);
  }
  auto wc = poll(a.cq, 4, 20);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE(wc.size() == 4);
  for (auto &w : wc) CHECK(w.status == IBV_WC_SUCCESS);
  double mbps = 4.0 * 8 * (1 << 20) / secs / 1e6;
  INFO("paced at " << mbps << " Mbit/s");
  CHECK(mbps < 200 * 1.1);
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

// min_rnr_timer is the responder's RNR NAK timer: the requester waits that
// long (IBA table 45) before each retry.
TEST_CASE("min_rnr_timer: the requester waits the RNR NAK's time", "[verbs]") {
  const uint64_t naks = device_counter(usrc::Counter::rnr_naks_rcvd);
  {
    Dev d;
    Qp a(d), b(d);
    Params pa, pb;
    pa.rnr_retry = 2;
    pb.min_rnr = 24;   // 40.96 ms
    connect_pair(d, a, b, pa, pb);
    std::vector<uint8_t> buf(64);
    ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), 0);
    ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
    auto t0 = Clock::now();
    REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    auto wc = poll(a.cq, 1, 5);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
    INFO("elapsed " << ms << " ms");
    CHECK(ms >= 2 * 40.96 * 0.95);   // two waits: rnr_retry = 2 (a loaded machine is only slower)
    ibv_dereg_mr(m);
  }
  // Three RNR NAKs and two retries, however long the machine took (the
  // wait's length in virtual time: test_transport_sim.cpp, "RNR: no
  // receive WQE").
  if (naks != UINT64_MAX) CHECK(device_counter(usrc::Counter::rnr_naks_rcvd) - naks == 3);
}

// Start PSNs that do not match: the responder sees every request out of
// sequence and NAKs it; the requester never gets an ACK it can use and ends
// with retry exceeded. Matching PSNs (every other test) work.
TEST_CASE("mismatched start PSNs: PSN sequence NAKs, then RETRY_EXC_ERR", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  Params pa, pb;
  pa.sq_psn = 1000;
  pa.timeout = 10;   // 4.2 ms
  pa.retry = 2;
  connect(d, a, b.qp->qp_num, pa);
  pb.rq_psn = 5000;   // not pa.sq_psn
  connect(d, b, a.qp->qp_num, pb);
  std::vector<uint8_t> buf(64), rbuf(64);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *rm = ibv_reg_mr(d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge r{uintptr_t(rbuf.data()), 64, rm->lkey};
  REQUIRE(post_recv(b.qp, 1, &r, 1) == 0);
  ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  auto wc = poll(a.cq, 1, 5);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(poll(b.cq, 1, 0.2).empty());   // nothing was delivered
  ibv_dereg_mr(m);
  ibv_dereg_mr(rm);
}

// SQD: the send queue drains (what is in flight completes, nothing new
// starts), IBV_EVENT_SQ_DRAINED arrives on the async fd, and SQD -> RTS
// resumes the queued work.
TEST_CASE("SQD: drain, SQ_DRAINED event, resume", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  connect_pair(d, a, b);
  std::vector<uint8_t> buf(100000, 1), rbuf(100000 * 4);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *rm = ibv_reg_mr(d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s{uintptr_t(buf.data()), uint32_t(buf.size()), m->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(rbuf.data()), rm->rkey) == 0);
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_SQD;
  at.en_sqd_async_notify = 1;
  REQUIRE(ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
  // Posted in SQD: queued, not started.
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(rbuf.data()) + 100000, rm->rkey) == 0);
  auto wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].wr_id == 1);
  // The event (the async fd is blocking: wait for it with poll).
  pollfd pf{d.ctx->async_fd, POLLIN, 0};
  REQUIRE(::poll(&pf, 1, 5000) == 1);
  ibv_async_event ev;
  REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
  CHECK(ev.event_type == IBV_EVENT_SQ_DRAINED);
  CHECK(ev.element.qp == a.qp);
  ibv_ack_async_event(&ev);
  CHECK(poll(a.cq, 1, 0.2).empty());   // WR 2 waits for RTS
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a.qp, &q, IBV_QP_STATE, &qi) == 0);
  CHECK(q.qp_state == IBV_QPS_SQD);
  CHECK(q.sq_draining == 1);   // work is queued
  at.qp_state = IBV_QPS_RTS;
  REQUIRE(ibv_modify_qp(a.qp, &at, IBV_QP_STATE) == 0);
  wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].wr_id == 2);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  ibv_dereg_mr(m);
  ibv_dereg_mr(rm);
}

// ibv_query_qp returns every attribute that was set, and the init
// attributes; a refused modify leaves the QP as it was.
TEST_CASE("query_qp returns the whole QP context", "[verbs]") {
  Dev d;
  Qp a(d);
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.pkey_index = 0;
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  REQUIRE(ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = d.port.active_mtu;
  at.dest_qp_num = a.qp->qp_num;
  at.rq_psn = 0x123456;
  at.max_dest_rd_atomic = 8;
  at.min_rnr_timer = 17;
  at.ah_attr.port_num = 1;
  at.ah_attr.dlid = d.port.lid ? d.port.lid : 1;
  at.ah_attr.sl = 3;
  at.ah_attr.src_path_bits = 0;
  at.ah_attr.static_rate = IBV_RATE_10_GBPS;
  at.ah_attr.is_global = 1;
  REQUIRE(ibv_query_gid(d.ctx, 1, d.port.link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : 1, &at.ah_attr.grh.dgid) == 0);
  at.ah_attr.grh.flow_label = 0xabcde;
  at.ah_attr.grh.sgid_index = 0;
  at.ah_attr.grh.hop_limit = 9;
  at.ah_attr.grh.traffic_class = 0x20;
  const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  // A missing required attribute: EINVAL, and the QP stays in INIT.
  CHECK(ibv_modify_qp(a.qp, &at, rtr & ~IBV_QP_RQ_PSN) == EINVAL);
  // A forbidden one (SQ_PSN belongs to RTR -> RTS): EINVAL.
  CHECK(ibv_modify_qp(a.qp, &at, rtr | IBV_QP_SQ_PSN) == EINVAL);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  REQUIRE(ibv_query_qp(a.qp, &q, IBV_QP_STATE, &qi) == 0);
  CHECK(q.qp_state == IBV_QPS_INIT);
  CHECK(q.rq_psn == 0);
  REQUIRE(ibv_modify_qp(a.qp, &at, rtr) == 0);
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = 0xfedcb;
  at.timeout = 18;
  at.retry_cnt = 5;
  at.rnr_retry = 6;
  at.max_rd_atomic = 4;
  REQUIRE(ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
  q = {};
  REQUIRE(ibv_query_qp(a.qp, &q, ~0, &qi) == 0);
  CHECK(q.qp_state == IBV_QPS_RTS);
  CHECK(q.cur_qp_state == IBV_QPS_RTS);
  CHECK(q.path_mtu == d.port.active_mtu);
  CHECK(q.dest_qp_num == a.qp->qp_num);
  CHECK(q.rq_psn == 0x123456);
  CHECK(q.sq_psn == 0xfedcb);
  CHECK(q.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  CHECK(q.pkey_index == 0);
  CHECK(q.port_num == 1);
  CHECK(q.max_rd_atomic == 4);
  CHECK(q.max_dest_rd_atomic == 8);
  CHECK(q.min_rnr_timer == 17);
  CHECK(q.timeout == 18);
  CHECK(q.retry_cnt == 5);
  CHECK(q.rnr_retry == 6);
  CHECK(q.ah_attr.sl == 3);
  CHECK(q.ah_attr.static_rate == IBV_RATE_10_GBPS);
  CHECK(q.ah_attr.is_global == 1);
  CHECK(q.ah_attr.grh.flow_label == 0xabcde);
  CHECK(q.ah_attr.grh.hop_limit == 9);
  CHECK(q.ah_attr.grh.traffic_class == 0x20);
  CHECK(q.sq_draining == 0);
  CHECK(q.cap.max_send_wr >= 256);
  CHECK(q.cap.max_inline_data >= 64);
  CHECK(qi.qp_type == IBV_QPT_RC);
  CHECK(qi.send_cq == a.cq);
  CHECK(qi.recv_cq == a.cq);
}

// Responder resources: a QP with max_dest_rd_atomic 0 takes no READ.
TEST_CASE("max_dest_rd_atomic 0: READ gets REM_INV_REQ_ERR", "[verbs]") {
  Dev d;
  Qp a(d), b(d);
  Params pa, pb;
  pa.access = pb.access = IBV_ACCESS_REMOTE_READ;
  pb.rd_atomic = 0;
  connect_pair(d, a, b, pa, pb);
  std::vector<uint8_t> src(100, 1), dst(100, 0);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s{uintptr_t(dst.data()), 100, md->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_READ, &s, 1, IBV_SEND_SIGNALED, uintptr_t(src.data()), ms->rkey) == 0);
  auto wc = poll(a.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(remote_error(wc[0].status, IBV_WC_REM_INV_REQ_ERR));
  CHECK(dst[0] == 0);
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

// Small RDMA WRITEs between contexts on one host may be placed straight
// into the target's memory (USRC_DIRECT_WRITE): the same semantics either
// way. Checked here whichever path they take; shm_test.sh checks the path.
TEST_CASE("small RDMA WRITEs: in place at completion, any size, a depth-1 SQ, then ordered with a SEND", "[verbs]") {
  Dev d;
  Qp a(d, 1), b(d);
  connect_pair(d, a, b);
  std::vector<uint8_t> src(8192), dst(16384, 0);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), 0);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint32_t round = 0;
  for (uint32_t len : {1u, 2u, 3u, 31u, 64u, 255u, 256u, 1000u, 4095u, 4096u, 4097u, 8192u}) {
    for (int rep = 0; rep < 20; rep++, round++) {
      for (uint32_t i = 0; i < len; i++) src[i] = uint8_t(round * 7 + i);
      const uint32_t off = (round * 97) % (dst.size() - len);
      ibv_sge s{uintptr_t(src.data()), len, ms->lkey};
      const int inl = len <= 64 && rep % 2 ? IBV_SEND_INLINE : 0;
      INFO("len " << len << " rep " << rep);
      REQUIRE(post_send(a.qp, round, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED | inl,
                        uintptr_t(dst.data()) + off, md->rkey) == 0);
      if (inl) std::fill(src.begin(), src.begin() + len, 0xee);   // the WQE has its own copy
      auto wc = poll(a.cq, 1);
      REQUIRE(wc.size() == 1);
      CHECK(wc[0].status == IBV_WC_SUCCESS);
      CHECK(wc[0].opcode == IBV_WC_RDMA_WRITE);
      CHECK(wc[0].wr_id == round);
      // Completed: the data is at the responder.
      bool same = true;
      for (uint32_t i = 0; i < len; i++) same = same && dst[off + i] == uint8_t(round * 7 + i);
      CHECK(same);
    }
  }
  // Unsignaled WRITEs, then a SEND: when the SEND arrives, the WRITEs are there.
  Qp c(d, 64), e(d);
  connect_pair(d, c, e);
  std::fill(dst.begin(), dst.end(), 0);
  REQUIRE(post_recv(e.qp, 9, nullptr, 0) == 0);
  for (uint32_t i = 0; i < 32; i++) {
    src[i] = uint8_t(i + 1);
    ibv_sge s{uintptr_t(src.data() + i), 1, ms->lkey};
    REQUIRE(post_send(c.qp, i, IBV_WR_RDMA_WRITE, &s, 1, 0, uintptr_t(dst.data()) + i * 100, md->rkey) == 0);
  }
  REQUIRE(post_send(c.qp, 99, IBV_WR_SEND, nullptr, 0, IBV_SEND_SIGNALED) == 0);
  auto rc = poll(e.cq, 1);
  REQUIRE(rc.size() == 1);
  CHECK(rc[0].status == IBV_WC_SUCCESS);
  for (uint32_t i = 0; i < 32; i++) CHECK(dst[i * 100] == uint8_t(i + 1));
  auto wc = poll(c.cq, 1);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].wr_id == 99);   // only the signaled one completes
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

TEST_CASE("small RDMA WRITEs: a deregistered MR, bounds, a QP without remote write: REM_ACCESS_ERR, nothing written", "[verbs]") {
  Dev d;
  std::vector<uint8_t> src(64, 0xab), dst(4096, 0);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), 0);
  auto attempt = [&](int access, bool dereg, uint64_t off) {
    Qp a(d), b(d);
    Params pa, pb;
    pb.access = access;
    connect_pair(d, a, b, pa, pb);
    ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    const uint32_t rkey = md->rkey;
    ibv_sge s{uintptr_t(src.data()), 64, ms->lkey};
    // One that lands first, where the QP takes WRITEs: the path is open,
    // then closed.
    std::vector<ibv_wc> wc;
    if (access & IBV_ACCESS_REMOTE_WRITE) {
      REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()), rkey) == 0);
      wc = poll(a.cq, 1);
      REQUIRE(wc.size() == 1);
      CHECK(wc[0].status == IBV_WC_SUCCESS);
    }
    if (dereg) ibv_dereg_mr(md);
    std::fill(dst.begin(), dst.end(), 0);
    REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data()) + off, rkey) == 0);
    wc = poll(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
    CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0; }));
    if (!dereg) ibv_dereg_mr(md);
  };
  attempt(IBV_ACCESS_REMOTE_WRITE, true, 0);           // after ibv_dereg_mr
  attempt(IBV_ACCESS_REMOTE_WRITE, false, 4096 - 63);  // past the MR's end
  attempt(IBV_ACCESS_REMOTE_READ, false, 0);           // the QP takes no WRITE
  ibv_dereg_mr(ms);
}

// Another process writes into this one (direct placement crosses address
// spaces): every byte of many WRITEs of varying size lands, then the SEND
// after them; after ibv_dereg_mr here, its next WRITE fails.
TEST_CASE("small RDMA WRITEs from another process: every byte lands; after dereg, REM_ACCESS_ERR", "[verbs]") {
  constexpr uint32_t kWrites = 2000, kStride = 80;
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(to_parent) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    {
      Dev d;
      Qp q(d, 16);
      uint32_t my = q.qp->qp_num, peer = 0, rkey = 0;
      uint64_t va = 0;
      if (write(to_parent[1], &my, 4) == 4 && read(to_child[0], &peer, 4) == 4 &&
          read(to_child[0], &va, 8) == 8 && read(to_child[0], &rkey, 4) == 4) {
        connect(d, q, peer, Params{});
        static uint8_t src[kStride];
        ibv_mr *m = ibv_reg_mr(d.pd, src, sizeof src, 0);
        int errors = 0;
        for (uint32_t i = 0; i < kWrites && !errors; i++) {
          const uint32_t len = 1 + i % kStride;
          for (uint32_t k = 0; k < len; k++) src[k] = uint8_t(i * 13 + k);
          ibv_sge s{uintptr_t(src), len, m->lkey};
          if (post_send(q.qp, i, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, va + uint64_t(i) * kStride, rkey))
            errors++;
          auto wc = poll(q.cq, 1);
          errors += wc.size() != 1 || wc[0].status != IBV_WC_SUCCESS;
        }
        if (!errors && post_send(q.qp, 7, IBV_WR_SEND, nullptr, 0, IBV_SEND_SIGNALED) == 0) {
          auto wc = poll(q.cq, 1);
          errors += wc.size() != 1 || wc[0].status != IBV_WC_SUCCESS;
        }
        char go = 0;
        if (!errors && read(to_child[0], &go, 1) == 1) {   // the parent deregistered
          ibv_sge s{uintptr_t(src), 8, m->lkey};
          errors += post_send(q.qp, 8, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, va, rkey) != 0;
          auto wc = poll(q.cq, 1);
          errors += wc.size() != 1 || !remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        }
        ibv_dereg_mr(m);
        rc = errors ? 2 : 0;
      }
    }
    _exit(rc);
  }
  Dev d;
  std::vector<uint8_t> dst(kWrites * kStride, 0);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  Qp q(d, 16);
  uint32_t child = 0;
  REQUIRE(read(to_parent[0], &child, 4) == 4);
  REQUIRE(to_init(q.qp, IBV_ACCESS_REMOTE_WRITE) == 0);
  REQUIRE(to_rtr(d, q.qp, child, Params{}) == 0);
  REQUIRE(post_recv(q.qp, 1, nullptr, 0) == 0);
  const uint32_t mine = q.qp->qp_num;
  const uint64_t va = uintptr_t(dst.data());
  REQUIRE(write(to_child[1], &mine, 4) == 4);
  REQUIRE(write(to_child[1], &va, 8) == 8);
  REQUIRE(write(to_child[1], &md->rkey, 4) == 4);
  auto rc = poll(q.cq, 1, 60);
  REQUIRE(rc.size() == 1);
  CHECK(rc[0].status == IBV_WC_SUCCESS);
  uint32_t bad = 0;
  for (uint32_t i = 0; i < kWrites; i++)
    for (uint32_t k = 0; k < kStride; k++)
      bad += dst[i * kStride + k] != (k <= i % kStride ? uint8_t(i * 13 + k) : 0);
  CHECK(bad == 0);
  ibv_dereg_mr(md);
  std::fill(dst.begin(), dst.end(), 0);
  const char go = 1;
  REQUIRE(write(to_child[1], &go, 1) == 1);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0; }));
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

// A placed WRITE completes when its data lands; if the target then never
// acknowledges its notice (here: the target process is stopped), the QP
// fails with an async event, not with an error completion for that WRITE.
TEST_CASE("a placed WRITE whose target stops answering: success, then QP_FATAL and flushes", "[verbs]") {
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(to_parent) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {   // the target
    int rc = 1;
    {
      Dev d;
      static uint8_t mem[64];
      ibv_mr *m = ibv_reg_mr(d.pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      Qp q(d, 4);
      uint32_t peer = 0, my = q.qp->qp_num;
      uint64_t va = uintptr_t(mem);
      if (write(to_parent[1], &my, 4) == 4 && write(to_parent[1], &va, 8) == 8 &&
          write(to_parent[1], &m->rkey, 4) == 4 && read(to_child[0], &peer, 4) == 4) {
        connect(d, q, peer, Params{});
        char x = 1;
        (void)!write(to_parent[1], &x, 1);
        if (read(to_child[0], &x, 1) == 1)   // after SIGSTOP, SIGCONT
          rc = std::memcmp(mem, "placed!", 7) == 0 ? 0 : 3;
      }
      ibv_dereg_mr(m);
    }
    _exit(rc);
  }
  Dev d;
  Qp q(d, 4);
  uint32_t child = 0, rkey = 0;
  uint64_t va = 0;
  REQUIRE(read(to_parent[0], &child, 4) == 4);
  REQUIRE(read(to_parent[0], &va, 8) == 8);
  REQUIRE(read(to_parent[0], &rkey, 4) == 4);
  Params p;
  p.timeout = 8;   // about 1 ms
  p.retry = 1;
  connect(d, q, child, p);
  const uint32_t mine = q.qp->qp_num;
  REQUIRE(write(to_child[1], &mine, 4) == 4);
  char x = 0;
  REQUIRE(read(to_parent[0], &x, 1) == 1);
  REQUIRE(kill(pid, SIGSTOP) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, WUNTRACED) == pid);   // stopped, every thread
  REQUIRE(WIFSTOPPED(status));
  static char src[8] = "placed!";
  ibv_mr *m = ibv_reg_mr(d.pd, src, sizeof src, 0);
  ibv_sge s{uintptr_t(src), 7, m->lkey};
  REQUIRE(post_send(q.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, va, rkey) == 0);
  auto wc = poll(q.cq, 1);
  REQUIRE(wc.size() == 1);
  // Not placed (no shared memory: USRC_SHM=0, another backend), the WRITE
  // waits for the stopped target's ACK and fails with RETRY_EXC_ERR.
  // USRC_TEST_PLACED: the caller knows placement is on.
  if (getenv("USRC_TEST_PLACED")) CHECK(wc[0].status == IBV_WC_SUCCESS);
  else CHECK((wc[0].status == IBV_WC_SUCCESS || wc[0].status == IBV_WC_RETRY_EXC_ERR));
  const bool placed = wc[0].status == IBV_WC_SUCCESS;
  if (!placed) WARN("the WRITE was not placed directly: RETRY_EXC_ERR");
  if (placed) {
    pollfd pf{d.ctx->async_fd, POLLIN, 0};
    REQUIRE(::poll(&pf, 1, 10000) == 1);
    ibv_async_event ev{};
    REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
    CHECK(ev.event_type == IBV_EVENT_QP_FATAL);
    ibv_ack_async_event(&ev);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(q.qp, &qa, IBV_QP_STATE, &qi) == 0);
    CHECK(qa.qp_state == IBV_QPS_ERR);
    REQUIRE(post_send(q.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, va, rkey) == 0);
    wc = poll(q.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR);
  }
  REQUIRE(kill(pid, SIGCONT) == 0);
  REQUIRE(write(to_child[1], &x, 1) == 1);
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  // Placed, the data had landed. (Sent, it may land once the target runs
  // again and reads its socket.)
  if (placed) CHECK(WEXITSTATUS(status) == 0);
  else CHECK((WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3));
  ibv_dereg_mr(m);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

// A stream of multi-packet RDMA WRITEs, each of its own bytes, and the
// target MR deregistered while one is on its way: once ibv_dereg_mr
// returns the memory does not change any more (the rest of the message is
// NAKed, not written where the MR was), and the requester's WRITE in
// flight completes with REM_ACCESS_ERR.
TEST_CASE("multi-packet RDMA WRITEs racing ibv_dereg_mr: nothing lands after it returns", "[verbs]") {
  Dev d;
  Qp a(d, 64), b(d, 64);
  Params p;
  connect_pair(d, a, b, p, p);
  constexpr size_t kMsg = 1 << 20, kSlots = 4, kWrites = 64;
  std::vector<uint8_t> src(kMsg * kWrites), dst(kMsg * kSlots, 0);
  for (size_t i = 0; i < kWrites; i++) std::memset(src.data() + i * kMsg, int(i + 1), kMsg);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), 0);
  ibv_mr *md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(ms);
  REQUIRE(md);
  for (size_t i = 0; i < kWrites; i++) {
    ibv_sge s{uintptr_t(src.data() + i * kMsg), uint32_t(kMsg), ms->lkey};
    REQUIRE(post_send(a.qp, i, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
                      uintptr_t(dst.data() + (i % kSlots) * kMsg), md->rkey) == 0);
  }
  // The first WRITE done (taken alone): the stream is under way.
  ibv_wc first{};
  int got = 0;
  for (auto end = Clock::now() + std::chrono::seconds(60); got == 0 && Clock::now() < end;)
    got = ibv_poll_cq(a.cq, 1, &first);
  REQUIRE(got == 1);
  REQUIRE(first.status == IBV_WC_SUCCESS);
  const uint32_t md_rkey = md->rkey;
  REQUIRE(ibv_dereg_mr(md) == 0);
  const std::vector<uint8_t> snap = dst;
  // Every WRITE completes: the ones before the deregistration with
  // success, the one it interrupted (or the next) with REM_ACCESS_ERR,
  // the rest flushed. Meanwhile the memory stays as it was.
  auto more = poll(a.cq, kWrites - 1, 60);
  REQUIRE(more.size() == kWrites - 1);
  size_t i = 0;
  while (i < more.size() && more[i].status == IBV_WC_SUCCESS) i++;
  if (i == more.size()) {
    // The whole stream was done before the deregistration (a slow or busy
    // test thread): one WRITE more, posted after it, must be refused.
    ibv_sge s{uintptr_t(src.data()), uint32_t(kMsg), ms->lkey};
    REQUIRE(post_send(a.qp, kWrites, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
                      uintptr_t(dst.data()), md_rkey) == 0);
    auto last = poll(a.cq, 1, 60);
    REQUIRE(last.size() == 1);
    more.push_back(last[0]);
  }
  REQUIRE(i < more.size());
  CHECK(remote_error(more[i].status, IBV_WC_REM_ACCESS_ERR));
  for (i++; i < more.size(); i++) CHECK(more[i].status == IBV_WC_WR_FLUSH_ERR);
  usleep(100000);   // (anything still on its way would land by now)
  size_t changed = 0;
  for (size_t k = 0; k < dst.size(); k++) changed += dst[k] != snap[k];
  CHECK(changed == 0);
  CHECK(ibv_dereg_mr(ms) == 0);
}

// Registered memory (not ODP) unmapped while registered: a WRITE into it,
// a READ from it and an ATOMIC on it are refused by the responder
// (REM_ACCESS_ERR), a multi-packet one and a small one; no signal.
TEST_CASE("WRITE, READ and ATOMIC on registered memory that was unmapped: REM_ACCESS_ERR, no signal", "[verbs][unmapped]") {
  Dev d;
  const size_t len = 64 * 1024;
  auto *region = static_cast<uint8_t *>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(region != MAP_FAILED);
  ibv_mr *mr = ibv_reg_mr(d.pd, region, len,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC);
  REQUIRE(mr);
  unmap_keep_hole(region, len);
  std::vector<uint8_t> buf(8000, 0x3c);
  ibv_mr *mb = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mb);
  Params p;
  p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  struct Op {
    ibv_wr_opcode op;
    uint32_t len;
  };
  for (Op op : {Op{IBV_WR_RDMA_WRITE, 5000}, Op{IBV_WR_RDMA_WRITE, 40}, Op{IBV_WR_RDMA_READ, 5000},
                Op{IBV_WR_ATOMIC_FETCH_AND_ADD, 8}}) {
    INFO("opcode " << op.op << ", " << op.len << " bytes");
    Qp a(d), b(d);
    connect_pair(d, a, b, p, p);
    ibv_sge s{uintptr_t(buf.data()), op.len, mb->lkey};
    ibv_send_wr wr{}, *bad;
    wr.wr_id = 1;
    wr.opcode = op.op;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op.op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = uintptr_t(region) + 4096;
      wr.wr.atomic.rkey = mr->rkey;
      wr.wr.atomic.compare_add = 1;
    } else {
      wr.wr.rdma.remote_addr = uintptr_t(region) + 100;
      wr.wr.rdma.rkey = mr->rkey;
    }
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    auto wc = poll(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(remote_error(wc[0].status, IBV_WC_REM_ACCESS_ERR));
  }
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dereg_mr(mb) == 0);
  munmap(region, len);
}

// The same for the local side: a SEND whose source (a registered buffer,
// not ODP) was unmapped completes with LOC_PROT_ERR, over whichever path
// the peer takes (the shared-memory ring on this host), small and
// multi-packet; a receive buffer unmapped completes with LOC_PROT_ERR and
// the requester gets REM_OP_ERR. No signal.
TEST_CASE("SEND from or into registered memory that was unmapped: LOC_PROT_ERR, no signal", "[verbs][unmapped]") {
  Dev d;
  const size_t len = 64 * 1024;
  auto *region = static_cast<uint8_t *>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(region != MAP_FAILED);
  std::memset(region, 7, len);
  ibv_mr *mr = ibv_reg_mr(d.pd, region, len, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  unmap_keep_hole(region, len);
  std::vector<uint8_t> buf(len, 0);
  ibv_mr *mb = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mb);
  Params p;
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  for (uint32_t n : {64u, 200u, 1000u, 5000u, 60000u}) {
    INFO(n << " bytes from unmapped memory");
    Qp a(d), b(d);
    connect_pair(d, a, b, p, p);
    ibv_sge r{uintptr_t(buf.data()), uint32_t(buf.size()), mb->lkey};
    REQUIRE(post_recv(b.qp, 1, &r, 1) == 0);
    ibv_sge s{uintptr_t(region), n, mr->lkey};
    REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    auto wc = poll(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].wr_id == 2);
    CHECK(wc[0].status == IBV_WC_LOC_PROT_ERR);
    CHECK(poll(b.cq, 1, 0.1).empty());   // (nothing arrived)
  }
  for (uint32_t n : {64u, 5000u}) {
    INFO(n << " bytes into unmapped memory");
    Qp a(d), b(d);
    connect_pair(d, a, b, p, p);
    ibv_sge r{uintptr_t(region), uint32_t(len), mr->lkey};
    REQUIRE(post_recv(b.qp, 1, &r, 1) == 0);
    ibv_sge s{uintptr_t(buf.data()), n, mb->lkey};
    REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    auto wc = poll(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(remote_error(wc[0].status, IBV_WC_REM_OP_ERR));
    auto rc = poll(b.cq, 1);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_LOC_PROT_ERR);
  }
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dereg_mr(mb) == 0);
  munmap(region, len);
}

// The child of the test above, in a process of its own.
TEST_CASE("RLIMIT_AS child of the test below", "[.rlimit_child]") {
  const char *name = getenv("USRC_TEST_DEV");
  const char *spare = getenv("USRC_TEST_SPARE_MB");
  if (!name || !spare) _exit(2);
  const size_t spare_mb = std::stoul(spare);
  enum { kAllMade = 0, kOpenFailed = 10, kCqFailed = 11, kQpFailed = 12, kBadErrno = 20 };
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  ibv_device *dev = nullptr;
  for (int i = 0; list && i < n; i++)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) dev = list[i];
  if (!dev) _exit(2);
  // What the process maps now, and spare_mb more.
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  rlimit rl{};
  rl.rlim_cur = rl.rlim_max = pages * 4096 + spare_mb * 1024 * 1024;
  if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
  auto clean = [](int e) { return e == ENOMEM || e == EAGAIN; };
  ibv_context *ctx = ibv_open_device(dev);
  if (!ctx) _exit(clean(errno) ? kOpenFailed : kBadErrno);
  ibv_device_attr da{};
  ibv_pd *pd = ibv_alloc_pd(ctx);
  if (!pd) _exit(clean(errno) ? kCqFailed : kBadErrno);
  if (ibv_query_device(ctx, &da) != 0) _exit(4);
  ibv_cq *cq = ibv_create_cq(ctx, da.max_cqe, nullptr, nullptr, 0);
  if (!cq) _exit(clean(errno) ? kCqFailed : kBadErrno + 1);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {uint32_t(da.max_qp_wr), uint32_t(da.max_qp_wr), 1, 1, 0};
  ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (!qp) _exit(clean(errno) ? kQpFailed : kBadErrno + 2);
  _exit(kAllMade);   // (no cleanup needed: the process ends)
}

// Resource exhaustion under an address-space limit (ulimit -v): opening the
// device (its progress thread), creating a CQ and a QP fail cleanly, with
// ENOMEM or EAGAIN, never an abort on a C++ exception. Each limit in a
// child process of its own, from none to spare up to plenty.
TEST_CASE("under an address-space limit, open_device, create_cq and create_qp fail cleanly", "[verbs]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("skipped: a sanitizer reserves more address space than any limit allows");
  return;
#endif
  const char *name = getenv("USRC_TEST_DEV");
  REQUIRE(name);
  enum { kAllMade = 0, kOpenFailed = 10, kCqFailed = 11, kQpFailed = 12, kBadErrno = 20 };
  std::vector<int> outcomes;
  for (size_t spare_mb : {0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512}) {
    // A fresh process (exec): one forked from here would reuse the stacks
    // and heap earlier tests left behind, and need no new memory.
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setenv("USRC_TEST_SPARE_MB", std::to_string(spare_mb).c_str(), 1);
      execl("/proc/self/exe", "verbs_tests", "[.rlimit_child]", static_cast<char *>(nullptr));
      _exit(5);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    INFO("spare " << spare_mb << " MB: status " << status);
    REQUIRE(WIFEXITED(status));   // not killed by an abort
    outcomes.push_back(WEXITSTATUS(status));
    CHECK((WEXITSTATUS(status) == kAllMade || WEXITSTATUS(status) == kOpenFailed ||
           WEXITSTATUS(status) == kCqFailed || WEXITSTATUS(status) == kQpFailed));
  }
  // The sweep reached both: a device that could not be opened, and one
  // whose large CQ or QP could not be made.
  CHECK(std::count(outcomes.begin(), outcomes.end(), int(kOpenFailed)) > 0);
  CHECK(std::count_if(outcomes.begin(), outcomes.end(),
                      [](int o) { return o == kCqFailed || o == kQpFailed; }) > 0);
}

// A CQ overrun (IBA 11.4.2.1): more completions than the CQ holds, none
// polled. The CQ reports IBV_EVENT_CQ_ERR and the QP completing into it
// goes to the error state with IBV_EVENT_QP_FATAL; its completions are not
// silently dropped while it goes on.
TEST_CASE("CQ overrun: CQ_ERR, and the QP to the error state with QP_FATAL", "[verbs]") {
  Dev d;
  ibv_cq *small = ibv_create_cq(d.ctx, 2, nullptr, nullptr, 0);
  REQUIRE(small);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = small;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 64};
  ibv_qp *qa = ibv_create_qp(d.pd, &ia);
  REQUIRE(qa);
  Qp b(d);
  Params p;
  REQUIRE(to_init(qa, p.access) == 0);
  REQUIRE(to_rtr(d, qa, b.qp->qp_num, p) == 0);
  REQUIRE(to_rts(qa, p) == 0);
  connect(d, b, qa->qp_num, p);
  uint8_t rx[8][64], tx[64] = {1};
  ibv_mr *mr = ibv_reg_mr(d.pd, rx, sizeof rx, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mt = ibv_reg_mr(d.pd, tx, sizeof tx, 0);
  REQUIRE(mr);
  REQUIRE(mt);
  for (int i = 0; i < 8; i++) {
    ibv_sge r{uintptr_t(rx[i]), 64, mr->lkey};
    REQUIRE(post_recv(b.qp, i, &r, 1) == 0);
  }
  for (int i = 0; i < 8; i++) {
    ibv_sge s{uintptr_t(tx), 64, mt->lkey};
    REQUIRE(post_send(qa, i, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  }
  // The third completion overruns the CQ: by then at least three SENDs
  // arrived, byte-exact; the rest may have been flushed when the QP failed
  // (how many went out first depends on the machine's timing).
  auto rc = poll(b.cq, 3, 60);
  REQUIRE(rc.size() >= 3);
  for (const ibv_wc &w : rc) CHECK(w.status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(rx[0], tx, 64) == 0);
  bool cq_err = false, qp_fatal = false;
  for (int i = 0; i < 600 && !(cq_err && qp_fatal); i++) {
    pollfd pf{d.ctx->async_fd, POLLIN, 0};
    if (::poll(&pf, 1, 100) != 1) continue;
    ibv_async_event ev{};
    REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
    if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small) cq_err = true;
    if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qa) qp_fatal = true;
    ibv_ack_async_event(&ev);
  }
  CHECK(cq_err);
  CHECK(qp_fatal);
  ibv_qp_attr at{};
  ibv_qp_init_attr ii{};
  REQUIRE(ibv_query_qp(qa, &at, IBV_QP_STATE, &ii) == 0);
  CHECK(at.qp_state == IBV_QPS_ERR);
  ibv_wc wc[4];
  while (ibv_poll_cq(small, 4, wc) > 0) {}
  CHECK(ibv_destroy_qp(qa) == 0);
  CHECK(ibv_destroy_cq(small) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dereg_mr(mt) == 0);
}

TEST_CASE("a QP moved to RESET leaves none of its unpolled completions in the CQ; other QPs' stay", "[verbs]") {
  Dev d;
  ibv_cq *cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_qp *q[2];
  for (auto &qp : q) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {4, 4, 1, 1, 0};
    qp = ibv_create_qp(d.pd, &ia);
    REQUIRE(qp);
    REQUIRE(to_init(qp, 0) == 0);
  }
  std::vector<uint8_t> buf(64);
  ibv_mr *m = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s{uintptr_t(buf.data()), 64, m->lkey};
  for (int i = 0; i < 2; i++) REQUIRE(post_recv(q[0], 10 + i, &s, 1) == 0);
  REQUIRE(post_recv(q[1], 20, &s, 1) == 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  for (auto *qp : q) REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);   // three flushed completions
  a.qp_state = IBV_QPS_RESET;
  REQUIRE(ibv_modify_qp(q[0], &a, IBV_QP_STATE) == 0);
  auto wc = poll(cq, 3, 0.3);
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].wr_id == 20);
  CHECK(wc[0].qp_num == q[1]->qp_num);
  for (auto *qp : q) ibv_destroy_qp(qp);
  ibv_dereg_mr(m);
  ibv_destroy_cq(cq);
}
