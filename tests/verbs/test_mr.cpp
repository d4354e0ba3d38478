// Memory regions changed after registration (ibv_rereg_mr) and advice on
// on-demand ones (ibv_advise_mr).
#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

TEST_CASE("ibv_rereg_mr: a new range and new access under the same keys, seen by the next remote access", "[verbs][mr]") {
  Dev d;
  Qp a(d), b(d);
  Params p;
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  connect_pair(d, a, b, p, p);
  std::vector<uint8_t> one(4096, 0), two(8192, 0), src(4096, 0x5c);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), 0);
  ibv_mr *m = ibv_reg_mr(d.pd, one.data(), one.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(ms);
  REQUIRE(m);
  const uint32_t rkey = m->rkey;
  // To two, with remote write: a WRITE at two's address lands there.
  REQUIRE(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, nullptr, two.data(),
                       two.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
  CHECK(m->rkey == rkey);
  CHECK(m->addr == two.data());
  CHECK(m->length == two.size());
  ibv_sge s{uintptr_t(src.data()), 4096, ms->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(two.data() + 4096), rkey) == 0);
  auto w = poll(a.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(w[0].status == IBV_WC_SUCCESS);
  CHECK(std::equal(src.begin(), src.end(), two.begin() + 4096));
  CHECK(std::all_of(one.begin(), one.end(), [](uint8_t v) { return v == 0; }));
  // Remote write taken away: the next WRITE is refused.
  REQUIRE(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE) == 0);
  REQUIRE(post_send(a.qp, 2, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(two.data()), rkey) == 0);
  w = poll(a.cq, 1);
  REQUIRE(w.size() == 1);
  CHECK(remote_error(w[0].status, IBV_WC_REM_ACCESS_ERR));
  // Bad input: remote write without local write, an unknown access flag;
  // the MR stays as it was.
  errno = 0;
  CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE) != 0);
  CHECK(errno == EINVAL);
  CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_HUGETLB) != 0);
  // A new PD: the old one is free once nothing else uses it.
  ibv_pd *pd2 = ibv_alloc_pd(d.ctx);
  REQUIRE(pd2);
  REQUIRE(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0) == 0);
  CHECK(m->pd == pd2);
  CHECK(ibv_dealloc_pd(pd2) == EBUSY);
  CHECK(ibv_dereg_mr(m) == 0);
  CHECK(ibv_dealloc_pd(pd2) == 0);
  CHECK(ibv_dereg_mr(ms) == 0);
}

TEST_CASE("ibv_advise_mr: prefetching on-demand memory succeeds; other MRs, keys and ranges are EINVAL", "[verbs][mr]") {
  Dev d;
  std::vector<uint8_t> buf(1 << 16);
  ibv_mr *odp = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ibv_mr *plain = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(odp);
  REQUIRE(plain);
  ibv_sge s{uintptr_t(buf.data()), 4096, odp->lkey};
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 1) == 0);
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &s, 1) == 0);
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &s, 1) == 0);
  ibv_sge out{uintptr_t(buf.data()) + buf.size() - 100, 4096, odp->lkey};
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &out, 1) == EINVAL);
  ibv_sge np{uintptr_t(buf.data()), 4096, plain->lkey};
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &np, 1) == EINVAL);
  ibv_sge bad{uintptr_t(buf.data()), 4096, odp->lkey ^ 0x77};
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &bad, 1) == EINVAL);
  CHECK(ibv_advise_mr(d.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &s, 1) == EINVAL);
  ibv_dereg_mr(odp);
  ibv_dereg_mr(plain);
}

TEST_CASE("an MR's on-demand bit in a QP's access flags is accepted (as the kernel does)", "[verbs][mr]") {
  Dev d;
  Qp a(d);
  CHECK(to_init(a.qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND) == 0);
  CHECK(to_init(a.qp, IBV_ACCESS_MW_BIND) == EINVAL);
}

TEST_CASE("a receive whose MR is deregistered or re-registered after the post fails when used; nothing is written where the MR was", "[verbs][mr]") {
  Dev d;
  Qp a(d), b(d);
  Params p;
  p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
  connect_pair(d, a, b, p, p);
  const size_t len = 8192;
  auto *region = static_cast<uint8_t *>(mmap(nullptr, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(region != MAP_FAILED);
  std::memset(region, 0x11, 2 * len);
  std::vector<uint8_t> src(len, 0xee);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), len, 0);
  ibv_mr *m1 = ibv_reg_mr(d.pd, region, len, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *m2 = ibv_reg_mr(d.pd, region + len, len, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(ms);
  REQUIRE(m1);
  REQUIRE(m2);
  // m1 deregistered, m2 moved elsewhere, after each had a receive posted.
  ibv_sge r1{uintptr_t(region), uint32_t(len), m1->lkey}, r2{uintptr_t(region + len), uint32_t(len), m2->lkey};
  REQUIRE(post_recv(b.qp, 1, &r1, 1) == 0);
  REQUIRE(post_recv(b.qp, 2, &r2, 1) == 0);
  std::vector<uint8_t> other(len, 0);
  REQUIRE(ibv_dereg_mr(m1) == 0);
  REQUIRE(ibv_rereg_mr(m2, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data(), len, 0) == 0);
  ibv_sge s{uintptr_t(src.data()), uint32_t(len), ms->lkey};
  REQUIRE(post_send(a.qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  auto ws = poll(a.cq, 1);
  REQUIRE(ws.size() == 1);
  CHECK(remote_error(ws[0].status, IBV_WC_REM_OP_ERR));
  auto wr = poll(b.cq, 2);
  REQUIRE(wr.size() >= 1);
  CHECK(wr[0].wr_id == 1);
  CHECK(wr[0].status == IBV_WC_LOC_PROT_ERR);
  // Neither the old ranges nor the new one were written.
  CHECK(std::all_of(region, region + 2 * len, [](uint8_t v) { return v == 0x11; }));
  CHECK(std::all_of(other.begin(), other.end(), [](uint8_t v) { return v == 0; }));
  // A receive with a wrong lkey is posted, and fails the same way when used.
  Qp c(d), e(d);
  connect_pair(d, c, e, p, p);
  ibv_sge wrong{uintptr_t(other.data()), uint32_t(len), m2->lkey ^ 0x3300};
  REQUIRE(post_recv(e.qp, 3, &wrong, 1) == 0);
  REQUIRE(post_send(c.qp, 2, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
  ws = poll(c.cq, 1);
  REQUIRE(ws.size() == 1);
  CHECK(remote_error(ws[0].status, IBV_WC_REM_OP_ERR));
  wr = poll(e.cq, 1);
  REQUIRE(wr.size() == 1);
  CHECK(wr[0].status == IBV_WC_LOC_PROT_ERR);
  CHECK(std::all_of(other.begin(), other.end(), [](uint8_t v) { return v == 0; }));
  ibv_dereg_mr(m2);
  ibv_dereg_mr(ms);
  munmap(region, 2 * len);
}
