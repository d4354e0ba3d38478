// Memory windows: type 1 (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW),
// invalidated locally (IBV_WR_LOCAL_INV), by the peer (IBV_WR_SEND_WITH_INV)
// or by deallocation; the rules a bind must meet.
#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

// Two connected RC QPs; b's buffer is registered for binding only (no
// remote access of its own): a's RDMA reaches it through a window alone.
struct MwPair {
  Dev d;
  Qp a{d}, b{d};
  std::vector<uint8_t> src = std::vector<uint8_t>(4096, 0x3c), dst = std::vector<uint8_t>(8192, 0);
  ibv_mr *ms = nullptr, *md = nullptr;
  MwPair() {
    Params p;
    p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    p.retry = getenv("USRC_TEST_LOSSY") ? 7 : 1;
    connect_pair(d, a, b, p, p);
    ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    md = ibv_reg_mr(d.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    REQUIRE(ms);
    REQUIRE(md);
  }
  ~MwPair() {
    ibv_dereg_mr(md);
    ibv_dereg_mr(ms);
  }
  // a WRITEs 4 KB to dst + off through rkey: its completion status.
  ibv_wc_status write(uint32_t rkey, size_t off = 0) {
    ibv_sge s{uintptr_t(src.data()), 4096, ms->lkey};
    REQUIRE(post_send(a.qp, 7, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED, uintptr_t(dst.data() + off), rkey) == 0);
    auto w = poll(a.cq, 1);
    REQUIRE(w.size() == 1);
    return w[0].status;
  }
  // a SENDs 16 bytes with Invalidate of key into a receive b posts: a's
  // completion, then b's (if any came).
  std::vector<ibv_wc> send_inv(uint32_t key) {
    std::vector<uint8_t> rbuf(64);
    ibv_mr *mr = ibv_reg_mr(d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr);
    ibv_sge rs{uintptr_t(rbuf.data()), 64, mr->lkey};
    REQUIRE(post_recv(b.qp, 30, &rs, 1) == 0);
    ibv_sge s{uintptr_t(src.data()), 16, ms->lkey};
    ibv_send_wr wr{}, *bad;
    wr.wr_id = 31;
    wr.opcode = IBV_WR_SEND_WITH_INV;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = key;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    std::vector<ibv_wc> out = poll(a.cq, 1);
    REQUIRE(out.size() == 1);
    if (out[0].status == IBV_WC_SUCCESS) {
      auto w = poll(b.cq, 1);
      out.insert(out.end(), w.begin(), w.end());
    }
    ibv_dereg_mr(mr);
    return out;
  }
  // b binds the type 2 window mw to [dst + off, + len) with key rkey: its
  // completion.
  ibv_wc bind2(ibv_mw *mw, uint32_t rkey, size_t off, size_t len, unsigned access) {
    ibv_send_wr wr{}, *bad;
    wr.wr_id = 20;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = {md, uintptr_t(dst.data() + off), len, access};
    REQUIRE(ibv_post_send(b.qp, &wr, &bad) == 0);
    auto w = poll(b.cq, 1);
    REQUIRE(w.size() == 1);
    return w[0];
  }
};

}  // namespace

TEST_CASE("type 1 window: ibv_bind_mw opens a range to the peer under a new key, a zero-length bind closes it", "[verbs][mw]") {
  MwPair t;
  ibv_mw *mw = ibv_alloc_mw(t.d.pd, IBV_MW_TYPE_1);
  REQUIRE(mw);
  // The MR's own rkey gives no remote access.
  CHECK(remote_error(t.write(t.md->rkey), IBV_WC_REM_ACCESS_ERR));
  MwPair u;   // (the first pair's QPs are in the Error state now)
  ibv_mw *w1 = ibv_alloc_mw(u.d.pd, IBV_MW_TYPE_1);
  REQUIRE(w1);
  ibv_mw_bind mb{};
  mb.wr_id = 11;
  mb.send_flags = IBV_SEND_SIGNALED;
  mb.bind_info = {u.md, uintptr_t(u.dst.data() + 4096), 4096, IBV_ACCESS_REMOTE_WRITE};
  REQUIRE(ibv_bind_mw(u.b.qp, w1, &mb) == 0);
  auto c = poll(u.b.cq, 1);
  REQUIRE(c.size() == 1);
  CHECK(c[0].status == IBV_WC_SUCCESS);
  CHECK(c[0].opcode == IBV_WC_BIND_MW);
  CHECK(c[0].wr_id == 11);
  CHECK((w1->rkey >> 8) == (ibv_inc_rkey(w1->rkey) >> 8));
  // The window's range takes the WRITE, with the data where it says.
  CHECK(u.write(w1->rkey, 4096) == IBV_WC_SUCCESS);
  CHECK(std::all_of(u.dst.begin() + 4096, u.dst.end(), [](uint8_t v) { return v == 0x3c; }));
  CHECK(std::all_of(u.dst.begin(), u.dst.begin() + 4096, [](uint8_t v) { return v == 0; }));
  // The MR is not deregistered under a bound window.
  CHECK(ibv_dereg_mr(u.md) == EBUSY);
  // Unbound (length 0): the key reaches nothing.
  mb.bind_info = {u.md, 0, 0, 0};
  REQUIRE(ibv_bind_mw(u.b.qp, w1, &mb) == 0);
  c = poll(u.b.cq, 1);
  REQUIRE(c.size() == 1);
  CHECK(c[0].status == IBV_WC_SUCCESS);
  CHECK(remote_error(u.write(w1->rkey, 4096), IBV_WC_REM_ACCESS_ERR));
  CHECK(ibv_dealloc_mw(w1) == 0);
  CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE("type 2 window: bound to its QP by IBV_WR_BIND_MW, closed by LOCAL_INV, by the peer's SEND_WITH_INV and by dealloc", "[verbs][mw]") {
  for (int how = 0; how < 3; how++) {
    MwPair t;
    ibv_mw *mw = ibv_alloc_mw(t.d.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    const uint32_t key = ibv_inc_rkey(mw->rkey);
    ibv_wc c = t.bind2(mw, key, 0, 4096, IBV_ACCESS_REMOTE_WRITE);
    CHECK(c.status == IBV_WC_SUCCESS);
    CHECK(c.opcode == IBV_WC_BIND_MW);
    CHECK(t.write(key) == IBV_WC_SUCCESS);
    CHECK(std::all_of(t.dst.begin(), t.dst.begin() + 4096, [](uint8_t v) { return v == 0x3c; }));
    // Beyond the window's range: refused, though inside the MR.
    if (how == 0) {
      CHECK(remote_error(t.write(key, 4096), IBV_WC_REM_ACCESS_ERR));
      CHECK(ibv_dealloc_mw(mw) == 0);
      continue;
    }
    if (how == 1) {
      // The peer's SEND_WITH_INV: b's receive says which key it invalidated.
      auto w = t.send_inv(key);
      REQUIRE(w.size() == 2);
      CHECK(w[0].status == IBV_WC_SUCCESS);
      CHECK(w[1].status == IBV_WC_SUCCESS);
      CHECK(w[1].opcode == IBV_WC_RECV);
      CHECK((w[1].wc_flags & IBV_WC_WITH_INV));
      CHECK(w[1].invalidated_rkey == key);
      CHECK(w[1].byte_len == 16);
      CHECK(remote_error(t.write(key), IBV_WC_REM_ACCESS_ERR));
    } else {
      // Local invalidation, in send queue order behind a SEND.
      std::vector<uint8_t> rbuf(64);
      ibv_mr *mr = ibv_reg_mr(t.d.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
      REQUIRE(mr);
      ibv_sge rs{uintptr_t(rbuf.data()), 64, mr->lkey};
      REQUIRE(post_recv(t.a.qp, 40, &rs, 1) == 0);
      ibv_sge s{uintptr_t(t.dst.data()), 16, t.md->lkey};
      REQUIRE(post_send(t.b.qp, 41, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
      ibv_send_wr wr{}, *bad;
      wr.wr_id = 42;
      wr.opcode = IBV_WR_LOCAL_INV;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.invalidate_rkey = key;
      REQUIRE(ibv_post_send(t.b.qp, &wr, &bad) == 0);
      auto w = poll(t.b.cq, 2);
      REQUIRE(w.size() == 2);
      CHECK(w[0].wr_id == 41);
      CHECK(w[1].wr_id == 42);
      CHECK(w[1].status == IBV_WC_SUCCESS);
      CHECK(w[1].opcode == IBV_WC_LOCAL_INV);
      REQUIRE(poll(t.a.cq, 1).size() == 1);
      CHECK(remote_error(t.write(key), IBV_WC_REM_ACCESS_ERR));
      ibv_dereg_mr(mr);
    }
    CHECK(ibv_dealloc_mw(mw) == 0);
  }
  // Deallocated while bound: the key reaches nothing, and the MR is free.
  MwPair t;
  ibv_mw *mw = ibv_alloc_mw(t.d.pd, IBV_MW_TYPE_2);
  REQUIRE(mw);
  const uint32_t key = ibv_inc_rkey(mw->rkey);
  CHECK(t.bind2(mw, key, 0, 4096, IBV_ACCESS_REMOTE_WRITE).status == IBV_WC_SUCCESS);
  CHECK(ibv_dereg_mr(t.md) == EBUSY);
  CHECK(ibv_dealloc_mw(mw) == 0);
  CHECK(remote_error(t.write(key), IBV_WC_REM_ACCESS_ERR));
}

TEST_CASE("window misuse: bad binds fail with IBV_WC_MW_BIND_ERR, bad invalidations with errors, bad types with EINVAL", "[verbs][mw]") {
  Dev d;
  errno = 0;
  CHECK(ibv_alloc_mw(d.pd, ibv_mw_type(3)) == nullptr);
  CHECK(errno == EINVAL);
  // A type 2 window bound through an MR without IBV_ACCESS_MW_BIND, and one
  // beyond the MR's range, and a key that is not the window's.
  for (int bad = 0; bad < 3; bad++) {
    MwPair t;
    ibv_mw *mw = ibv_alloc_mw(t.d.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    ibv_wc c{};
    if (bad == 0) {
      ibv_mr *plain = ibv_reg_mr(t.d.pd, t.src.data(), t.src.size(), IBV_ACCESS_LOCAL_WRITE);
      REQUIRE(plain);
      ibv_send_wr wr{}, *b;
      wr.opcode = IBV_WR_BIND_MW;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.bind_mw = {mw, ibv_inc_rkey(mw->rkey), {plain, uintptr_t(t.src.data()), 64, IBV_ACCESS_REMOTE_WRITE}};
      REQUIRE(ibv_post_send(t.b.qp, &wr, &b) == 0);
      auto w = poll(t.b.cq, 1);
      REQUIRE(w.size() == 1);
      c = w[0];
      ibv_dereg_mr(plain);
    } else if (bad == 1) {
      c = t.bind2(mw, ibv_inc_rkey(mw->rkey), 4096, 8192, IBV_ACCESS_REMOTE_WRITE);
    } else {
      c = t.bind2(mw, mw->rkey ^ 0x100, 0, 64, IBV_ACCESS_REMOTE_WRITE);
    }
    CHECK(c.status == IBV_WC_MW_BIND_ERR);
    // The QP is in the Error state: what follows is flushed.
    ibv_sge s{uintptr_t(t.src.data()), 16, t.ms->lkey};
    REQUIRE(post_send(t.b.qp, 50, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED) == 0);
    auto w = poll(t.b.cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(ibv_dealloc_mw(mw) == 0);
  }
  // A type 1 window through IBV_WR_BIND_MW, and a LOCAL_INV of an unknown
  // key: errors in completion.
  {
    MwPair t;
    ibv_mw *mw = ibv_alloc_mw(t.d.pd, IBV_MW_TYPE_1);
    REQUIRE(mw);
    CHECK(t.bind2(mw, ibv_inc_rkey(mw->rkey), 0, 64, IBV_ACCESS_REMOTE_WRITE).status == IBV_WC_MW_BIND_ERR);
    CHECK(ibv_dealloc_mw(mw) == 0);
  }
  {
    MwPair t;
    ibv_send_wr wr{}, *b;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = t.md->rkey;   // an MR's: not invalidated this way
    REQUIRE(ibv_post_send(t.b.qp, &wr, &b) == 0);
    auto w = poll(t.b.cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_LOC_QP_OP_ERR);
  }
  // A peer's SEND_WITH_INV for a key that is no window of the QP: an
  // invalid request.
  MwPair t;
  auto w = t.send_inv(t.md->rkey);
  REQUIRE(w.size() == 1);
  CHECK(remote_error(w[0].status, IBV_WC_REM_INV_REQ_ERR));
}
