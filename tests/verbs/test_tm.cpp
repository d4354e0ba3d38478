// Tag matching: a TM SRQ's tag list (ibv_post_srq_ops), SENDs with a tag
// matching header matched against it (EAGER, RNDV), unexpected and NO_TAG
// messages, the phase synchronization, and the list operations' errors.
#include <infiniband/tm_types.h>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

constexpr uint32_t kTmh = sizeof(ibv_tmh), kRvh = sizeof(ibv_rvh);
constexpr uint64_t kMask = 0xffff;

// A completion of an extended CQ, with its tag matching info.
struct TmWc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  unsigned flags;
  uint32_t byte_len;
  ibv_wc_tm_info tm;
};

std::vector<TmWc> poll_ex(ibv_cq_ex *cq, size_t n, double seconds = 10) {
  std::vector<TmWc> out;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (out.size() < n && Clock::now() < end) {
    ibv_poll_cq_attr a{};
    int r = ibv_start_poll(cq, &a);
    if (r == ENOENT) continue;
    REQUIRE(r == 0);
    do {
      TmWc w{cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_wc_flags(cq), ibv_wc_read_byte_len(cq), {}};
      ibv_wc_read_tm_info(cq, &w.tm);
      out.push_back(w);
    } while (out.size() < n && ibv_next_poll(cq) == 0);
    ibv_end_poll(cq);
  }
  return out;
}

void put_be(uint8_t *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = uint8_t(v);
}
// A TMH at p; a rendezvous request's RVH after it.
void put_tmh(uint8_t *p, uint8_t op, uint64_t tag, uint32_t priv = 0) {
  std::memset(p, 0, kTmh);
  p[0] = op;
  put_be(p + 4, priv, 4);
  put_be(p + 8, tag, 8);
}
void put_rvh(uint8_t *p, uint64_t va, uint32_t rkey, uint32_t len) {
  put_be(p, va, 8);
  put_be(p + 8, rkey, 4);
  put_be(p + 12, len, 4);
}

// A client RC QP (of its own CQ and receive queue) connected to a server
// QP on a TM SRQ, whose extended CQ takes the server's completions and
// the list operations'. The server QP has no send WRs of its own.
struct Tm {
  Dev d;
  Qp cli{d};
  ibv_cq_ex *cqx = nullptr;
  ibv_srq *srq = nullptr;
  ibv_qp *srv = nullptr;
  std::vector<uint8_t> cbuf = std::vector<uint8_t>(1 << 16), sbuf = std::vector<uint8_t>(1 << 16);
  ibv_mr *cmr = nullptr, *smr = nullptr;
  explicit Tm(uint32_t max_tags = 64, uint32_t max_ops = 16) {
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 256;
    ca.wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_TM_INFO;
    cqx = ibv_create_cq_ex(d.ctx, &ca);
    REQUIRE(cqx);
    ibv_srq_init_attr_ex sa{};
    sa.attr.max_wr = 64;
    sa.attr.max_sge = 1;
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    sa.srq_type = IBV_SRQT_TM;
    sa.pd = d.pd;
    sa.cq = ibv_cq_ex_to_cq(cqx);
    sa.tm_cap = {max_tags, max_ops};
    srq = ibv_create_srq_ex(d.ctx, &sa);
    REQUIRE(srq);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(cqx);
    ia.srq = srq;
    ia.qp_type = IBV_QPT_RC;
    srv = ibv_create_qp(d.pd, &ia);
    REQUIRE(srv);
    constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    cmr = ibv_reg_mr(d.pd, cbuf.data(), cbuf.size(), kAccess);
    smr = ibv_reg_mr(d.pd, sbuf.data(), sbuf.size(), kAccess);
    REQUIRE(cmr);
    REQUIRE(smr);
    Params p;
    p.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    connect(d, cli, srv->qp_num, p);
    REQUIRE(to_init(srv, p.access) == 0);
    REQUIRE(to_rtr(d, srv, cli.qp->qp_num, p) == 0);
    REQUIRE(to_rts(srv, p) == 0);
  }
  ~Tm() {
    ibv_destroy_qp(srv);
    CHECK(ibv_destroy_srq(srq) == 0);
    ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
    ibv_dereg_mr(cmr);
    ibv_dereg_mr(smr);
  }
  // A tagged buffer: sbuf[off, off + len), completions with wr_id id.
  int add(uint64_t id, uint64_t tag, uint32_t off, uint32_t len, uint32_t *handle = nullptr,
          int flags = IBV_OPS_SIGNALED, uint32_t unexpected = 0) {
    ibv_sge g{uintptr_t(sbuf.data() + off), len, smr->lkey};
    ibv_ops_wr w{}, *bad = nullptr;
    w.wr_id = id;
    w.opcode = IBV_WR_TAG_ADD;
    w.flags = flags;
    w.tm.unexpected_cnt = unexpected;
    w.tm.add.recv_wr_id = id;
    w.tm.add.sg_list = &g;
    w.tm.add.num_sge = 1;
    w.tm.add.tag = tag;
    w.tm.add.mask = kMask;
    int r = ibv_post_srq_ops(srq, &w, &bad);
    if (handle) *handle = w.tm.handle;
    return r;
  }
  int op(ibv_ops_wr_opcode o, uint64_t id, uint32_t handle = 0, int flags = IBV_OPS_SIGNALED,
         uint32_t unexpected = 0) {
    ibv_ops_wr w{}, *bad = nullptr;
    w.wr_id = id;
    w.opcode = o;
    w.flags = flags;
    w.tm.handle = handle;
    w.tm.unexpected_cnt = unexpected;
    return ibv_post_srq_ops(srq, &w, &bad);
  }
  // One list operation's completion.
  TmWc op_done(ibv_wc_opcode want) {
    auto w = poll_ex(cqx, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].opcode == want);
    return w[0];
  }
  // An unexpected-message buffer: sbuf[off, off + len).
  void post_srq(uint64_t id, uint32_t off, uint32_t len) {
    ibv_sge g{uintptr_t(sbuf.data() + off), len, smr->lkey};
    ibv_recv_wr wr = recv_wr(id, &g, 1), *bad;
    REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
  }
  // The client sends cbuf[off, off + len) and sees it complete.
  void send(uint32_t off, uint32_t len) {
    ibv_sge g{uintptr_t(cbuf.data() + off), len, cmr->lkey};
    REQUIRE(post_send(cli.qp, 1, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
    auto w = poll(cli.cq, 1);
    REQUIRE(w.size() == 1);
    REQUIRE(w[0].status == IBV_WC_SUCCESS);
  }
  // An EAGER message of len bytes in all (TMH included) with tag, its
  // payload bytes from seed.
  void send_eager(uint64_t tag, uint32_t len, uint8_t seed, uint8_t op = IBV_TMH_EAGER, uint32_t priv = 0) {
    put_tmh(cbuf.data(), op, tag, priv);
    for (uint32_t i = kTmh; i < len; i++) cbuf[i] = uint8_t(seed + i * 7);
    send(0, len);
  }
  bool payload_at(uint32_t off, uint32_t len, uint8_t seed) const {
    for (uint32_t i = 0; i < len; i++)
      if (sbuf[off + i] != uint8_t(seed + (i + kTmh) * 7)) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("TM: the device's tag matching caps; what a TM SRQ refuses", "[verbs][tm]") {
  Dev d;
  ibv_device_attr_ex a{};
  REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &a) == 0);
  CHECK((a.tm_caps.flags & IBV_TM_CAP_RC));
  CHECK(a.tm_caps.max_rndv_hdr_size >= kTmh + kRvh);
  CHECK(a.tm_caps.max_num_tags >= 1);
  CHECK(a.tm_caps.max_ops >= 1);
  CHECK(a.tm_caps.max_sge >= 1);
  ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 8;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  sa.srq_type = IBV_SRQT_TM;
  sa.pd = d.pd;
  sa.cq = cq;
  // Beyond the caps, none, or no CQ: EINVAL.
  for (ibv_tm_cap c : {ibv_tm_cap{a.tm_caps.max_num_tags + 1, 1}, ibv_tm_cap{0, 1}, ibv_tm_cap{4, 0},
                       ibv_tm_cap{4, a.tm_caps.max_ops + 1}}) {
    sa.tm_cap = c;
    errno = 0;
    CHECK(ibv_create_srq_ex(d.ctx, &sa) == nullptr);
    CHECK(errno == EINVAL);
  }
  sa.tm_cap = {4, 4};
  sa.comp_mask &= ~IBV_SRQ_INIT_ATTR_CQ;
  CHECK(ibv_create_srq_ex(d.ctx, &sa) == nullptr);
  CHECK(errno == EINVAL);
  sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  ibv_srq *srq = ibv_create_srq_ex(d.ctx, &sa);
  REQUIRE(srq);
  // The CQ is in use while the SRQ is.
  CHECK(ibv_destroy_cq(cq) == EBUSY);
  // Tag matching is RC's: a UC or UD QP on it is refused.
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = srq;
    ia.qp_type = t;
    ia.cap.max_send_wr = 1;
    errno = 0;
    CHECK(ibv_create_qp(d.pd, &ia) == nullptr);
    CHECK(errno == EOPNOTSUPP);
  }
  // A basic SRQ has no tag list.
  ibv_srq_init_attr ba{};
  ba.attr.max_wr = 4;
  ibv_srq *basic = ibv_create_srq(d.pd, &ba);
  REQUIRE(basic);
  ibv_ops_wr w{}, *bad = nullptr;
  w.opcode = IBV_WR_TAG_SYNC;
  CHECK(ibv_post_srq_ops(basic, &w, &bad) == EINVAL);
  CHECK(bad == &w);
  CHECK(ibv_destroy_srq(basic) == 0);
  CHECK(ibv_destroy_srq(srq) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("TM: EAGER messages matched to their tags, the TMH stripped, multi-packet too", "[verbs][tm]") {
  Tm t;
  uint32_t h1 = ~0u, h2 = ~0u, h3 = ~0u;
  REQUIRE(t.add(11, 1, 0, 4096, &h1) == 0);
  CHECK(t.op_done(IBV_WC_TM_ADD).wr_id == 11);
  REQUIRE(t.add(12, 2, 4096, 4096, &h2) == 0);
  auto a = t.op_done(IBV_WC_TM_ADD);
  CHECK(a.wr_id == 12);
  CHECK(a.status == IBV_WC_SUCCESS);
  CHECK(a.flags == 0);
  // A large one, matched by its tag's masked bits only (0x10003 & 0xffff).
  REQUIRE(t.add(13, 3, 8192, 8192, &h3) == 0);
  t.op_done(IBV_WC_TM_ADD);
  CHECK(h1 != h2);
  CHECK(h2 != h3);
  // Tag 2 first: it takes the second buffer, not the first posted.
  t.send_eager(2, 100, 5, IBV_TMH_EAGER, 0xabcd0123);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].opcode == IBV_WC_TM_RECV);
  CHECK(r[0].wr_id == 12);
  CHECK(r[0].flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
  CHECK(r[0].byte_len == 100 - kTmh);
  CHECK(r[0].tm.tag == 2);
  CHECK(r[0].tm.priv == 0xabcd0123);
  CHECK(t.payload_at(4096, 100 - kTmh, 5));
  t.send_eager(1, 16, 9);   // a TMH alone: an empty payload
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 11);
  CHECK(r[0].byte_len == 0);
  CHECK(r[0].tm.tag == 1);
  // 6000 bytes at a 1024-byte MTU: the TMH in the first packet only.
  t.send_eager(0x10003, 6000, 77);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].wr_id == 13);
  CHECK(r[0].byte_len == 6000 - kTmh);
  CHECK(r[0].tm.tag == 0x10003);
  CHECK(t.payload_at(8192, 6000 - kTmh, 77));
  // Each tag was consumed: deleting one fails (IBV_WC_TM_ERR).
  REQUIRE(t.op(IBV_WR_TAG_DEL, 21, h2) == 0);
  auto del = t.op_done(IBV_WC_TM_DEL);
  CHECK(del.wr_id == 21);
  CHECK(del.status == IBV_WC_TM_ERR);
}

TEST_CASE("TM: an EAGER message longer than its tag's buffer fails it (local length error)", "[verbs][tm]") {
  Tm t;
  REQUIRE(t.add(1, 5, 0, 32) == 0);
  t.op_done(IBV_WC_TM_ADD);
  put_tmh(t.cbuf.data(), IBV_TMH_EAGER, 5);
  ibv_sge g{uintptr_t(t.cbuf.data()), 16 + 64, t.cmr->lkey};
  REQUIRE(post_send(t.cli.qp, 1, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 1);
  CHECK(r[0].status == IBV_WC_LOC_LEN_ERR);
  auto s = poll(t.cli.cq, 1);
  REQUIRE(s.size() == 1);
  CHECK(remote_error(s[0].status, IBV_WC_REM_INV_REQ_ERR));
}

TEST_CASE("TM: unexpected messages go to SRQ WQEs whole; tags added out of phase wait for the sync", "[verbs][tm]") {
  Tm t;
  t.post_srq(100, 0, 1024);
  t.post_srq(101, 1024, 1024);
  t.post_srq(102, 2048, 1024);
  // No tag posted: unexpected, the TMH kept, no flags, no tag info.
  t.send_eager(7, 200, 3, IBV_TMH_EAGER, 42);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].opcode == IBV_WC_TM_RECV);
  CHECK(r[0].wr_id == 100);
  CHECK(r[0].flags == 0);
  CHECK(r[0].byte_len == 200);
  CHECK(r[0].tm.tag == 0);
  CHECK(std::memcmp(t.sbuf.data(), t.cbuf.data(), 200) == 0);
  // Added before the application reported that one: the ADD asks for a
  // sync, and the tag takes nothing meanwhile.
  REQUIRE(t.add(1, 7, 8192, 1024) == 0);
  CHECK(t.op_done(IBV_WC_TM_ADD).flags == IBV_WC_TM_SYNC_REQ);
  t.send_eager(7, 100, 4);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 101);
  CHECK(r[0].flags == 0);
  // A sync with the wrong count changes nothing; with both counted, the
  // tag matches.
  REQUIRE(t.op(IBV_WR_TAG_SYNC, 27, 0, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC, 1) == 0);
  CHECK(t.op_done(IBV_WC_TM_SYNC).wr_id == 27);
  t.send_eager(7, 100, 5);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 102);
  CHECK(r[0].flags == 0);
  REQUIRE(t.op(IBV_WR_TAG_SYNC, 28, 0, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC, 3) == 0);
  auto s = t.op_done(IBV_WC_TM_SYNC);
  CHECK(s.status == IBV_WC_SUCCESS);
  CHECK(s.flags == 0);
  t.send_eager(7, 100, 6);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 1);
  CHECK(r[0].flags == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID));
  CHECK(t.payload_at(8192, 100 - kTmh, 6));
  // An ADD in phase asks for nothing.
  REQUIRE(t.add(2, 8, 8192, 1024, nullptr, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC, 3) == 0);
  CHECK(t.op_done(IBV_WC_TM_ADD).flags == 0);
}

TEST_CASE("TM: NO_TAG messages and ones without a TMH are ordinary receives, not unexpected", "[verbs][tm]") {
  Tm t;
  REQUIRE(t.add(1, 9, 8192, 1024) == 0);   // (a tag that NO_TAG does not take)
  t.op_done(IBV_WC_TM_ADD);
  t.post_srq(100, 0, 1024);
  t.post_srq(101, 1024, 1024);
  t.send_eager(9, 300, 8, IBV_TMH_NO_TAG);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].opcode == IBV_WC_TM_NO_TAG);
  CHECK(r[0].wr_id == 100);
  CHECK(r[0].flags == 0);
  CHECK(r[0].byte_len == 300);
  CHECK(std::memcmp(t.sbuf.data(), t.cbuf.data(), 300) == 0);
  // Shorter than a TMH: a plain receive.
  std::memcpy(t.cbuf.data(), "hello", 5);
  t.send(0, 5);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].opcode == IBV_WC_RECV);
  CHECK(r[0].wr_id == 101);
  CHECK(r[0].byte_len == 5);
  // Neither counted as unexpected: an ADD now is in phase.
  REQUIRE(t.add(2, 10, 9216, 1024) == 0);
  CHECK(t.op_done(IBV_WC_TM_ADD).flags == 0);
}

TEST_CASE("TM: RNDV: the responder READs the sender's data into the tag's buffer, then sends a FIN", "[verbs][tm]") {
  Tm t;
  constexpr uint32_t kData = 5000, kAt = 32768;   // the sender's data: cbuf[kAt, kAt + kData)
  for (uint32_t i = 0; i < kData; i++) t.cbuf[kAt + i] = uint8_t(i * 13 + 1);
  REQUIRE(t.add(31, 0x4242, 0, 8192) == 0);
  t.op_done(IBV_WC_TM_ADD);
  // The FIN's receive at the client.
  ibv_sge fg{uintptr_t(t.cbuf.data() + 16384), 64, t.cmr->lkey};
  REQUIRE(post_recv(t.cli.qp, 55, &fg, 1) == 0);
  put_tmh(t.cbuf.data(), IBV_TMH_RNDV, 0x4242, 0x77);
  put_rvh(t.cbuf.data() + kTmh, uintptr_t(t.cbuf.data() + kAt), t.cmr->rkey, kData);
  ibv_sge g{uintptr_t(t.cbuf.data()), kTmh + kRvh, t.cmr->lkey};
  REQUIRE(post_send(t.cli.qp, 1, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  // The client: its SEND done, and the FIN received.
  auto f = poll(t.cli.cq, 2);
  REQUIRE(f.size() == 2);
  if (f[0].opcode == IBV_WC_RECV) std::swap(f[0], f[1]);
  CHECK(f[0].status == IBV_WC_SUCCESS);
  CHECK(f[0].opcode == IBV_WC_SEND);
  CHECK(f[1].status == IBV_WC_SUCCESS);
  CHECK(f[1].opcode == IBV_WC_RECV);
  CHECK(f[1].wr_id == 55);
  CHECK(f[1].byte_len == kTmh);
  auto r = poll_ex(t.cqx, 2);
  REQUIRE(r.size() == 2);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].opcode == IBV_WC_TM_RECV);
  CHECK(r[0].wr_id == 31);
  CHECK(r[0].flags == IBV_WC_TM_MATCH);
  CHECK(r[0].tm.tag == 0x4242);
  CHECK(r[0].tm.priv == 0x77);
  CHECK(r[1].status == IBV_WC_SUCCESS);
  CHECK(r[1].opcode == IBV_WC_TM_RECV);
  CHECK(r[1].wr_id == 31);
  CHECK(r[1].flags == IBV_WC_TM_DATA_VALID);
  CHECK(r[1].byte_len == kData);
  CHECK(std::memcmp(t.sbuf.data(), t.cbuf.data() + kAt, kData) == 0);
  const uint8_t *fin = t.cbuf.data() + 16384;
  CHECK(fin[0] == IBV_TMH_FIN);
  uint8_t want[kTmh];
  put_tmh(want, IBV_TMH_FIN, 0x4242, 0x77);
  CHECK(std::memcmp(fin, want, kTmh) == 0);
}

TEST_CASE("TM: RNDV the responder cannot fetch: into the buffer, IBV_WC_TM_RNDV_INCOMPLETE; a bad R_Key fails the data", "[verbs][tm]") {
  Tm t;
  // Longer than the tagged buffer: the request itself is what the buffer gets.
  REQUIRE(t.add(1, 6, 0, 64) == 0);
  t.op_done(IBV_WC_TM_ADD);
  put_tmh(t.cbuf.data(), IBV_TMH_RNDV, 6, 5);
  put_rvh(t.cbuf.data() + kTmh, uintptr_t(t.cbuf.data() + 4096), t.cmr->rkey, 4096);
  t.send(0, kTmh + kRvh);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == IBV_WC_TM_RNDV_INCOMPLETE);
  CHECK(r[0].wr_id == 1);
  CHECK(r[0].flags == IBV_WC_TM_MATCH);
  CHECK(r[0].tm.tag == 6);
  CHECK(std::memcmp(t.sbuf.data(), t.cbuf.data(), kTmh + kRvh) == 0);
  // A rendezvous request longer than max_rndv_hdr_size is unexpected.
  ibv_device_attr_ex a{};
  REQUIRE(ibv_query_device_ex(t.d.ctx, nullptr, &a) == 0);
  REQUIRE(t.add(2, 6, 8192, 8192) == 0);
  t.op_done(IBV_WC_TM_ADD);
  t.post_srq(100, 16384, 1024);
  t.send(0, a.tm_caps.max_rndv_hdr_size + 1);
  r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 100);
  CHECK(r[0].flags == 0);
  REQUIRE(t.op(IBV_WR_TAG_SYNC, 3, 0, IBV_OPS_TM_SYNC, 1) == 0);   // (unsignaled: no completion)
  // The sender's R_Key is wrong: the match completes, the READ fails.
  put_rvh(t.cbuf.data() + kTmh, uintptr_t(t.cbuf.data() + 4096), t.cmr->rkey ^ 0x5a5a00, 4096);
  ibv_sge g{uintptr_t(t.cbuf.data()), kTmh + kRvh, t.cmr->lkey};
  REQUIRE(post_send(t.cli.qp, 1, IBV_WR_SEND, &g, 1, IBV_SEND_SIGNALED) == 0);
  // (The client's QP fails too, on the READ it refuses: its SEND may be
  // flushed by then.)
  REQUIRE(poll(t.cli.cq, 1).size() == 1);
  r = poll_ex(t.cqx, 2);
  REQUIRE(r.size() == 2);
  CHECK(r[0].wr_id == 2);
  CHECK(r[0].status == IBV_WC_SUCCESS);
  CHECK(r[0].flags == IBV_WC_TM_MATCH);
  CHECK(r[1].wr_id == 2);
  CHECK(r[1].opcode == IBV_WC_TM_RECV);
  CHECK(remote_error(r[1].status, IBV_WC_REM_ACCESS_ERR));
  CHECK(r[1].flags == 0);
}

TEST_CASE("TM: a deleted tag takes nothing; deleting it again fails", "[verbs][tm]") {
  Tm t;
  uint32_t h = ~0u;
  REQUIRE(t.add(1, 4, 0, 1024, &h) == 0);
  t.op_done(IBV_WC_TM_ADD);
  REQUIRE(t.op(IBV_WR_TAG_DEL, 2, h) == 0);
  auto d = t.op_done(IBV_WC_TM_DEL);
  CHECK(d.wr_id == 2);
  CHECK(d.status == IBV_WC_SUCCESS);
  CHECK(d.flags == 0);
  // Again: no longer posted, an error completion even unsignaled.
  REQUIRE(t.op(IBV_WR_TAG_DEL, 3, h, 0) == 0);
  d = t.op_done(IBV_WC_TM_DEL);
  CHECK(d.wr_id == 3);
  CHECK(d.status == IBV_WC_TM_ERR);
  t.post_srq(100, 4096, 1024);
  t.send_eager(4, 64, 1);
  auto r = poll_ex(t.cqx, 1);
  REQUIRE(r.size() == 1);
  CHECK(r[0].wr_id == 100);
  CHECK(r[0].flags == 0);
  // An unsignaled ADD and DEL complete nothing.
  REQUIRE(t.add(4, 4, 0, 1024, &h, 0) == 0);
  REQUIRE(t.op(IBV_WR_TAG_DEL, 5, h, 0) == 0);
  CHECK(poll_ex(t.cqx, 1, 0.2).empty());
}

TEST_CASE("TM: list operations' bad input: errors, the list stopped at the bad one", "[verbs][tm]") {
  Tm t(2, 3);
  ibv_sge g{uintptr_t(t.sbuf.data()), 64, t.smr->lkey};
  ibv_ops_wr w[4]{}, *bad = nullptr;
  for (int i = 0; i < 4; i++) {
    w[i].wr_id = i;
    w[i].opcode = IBV_WR_TAG_ADD;
    w[i].flags = IBV_OPS_SIGNALED;
    w[i].tm.add.sg_list = &g;
    w[i].tm.add.num_sge = 1;
    w[i].tm.add.tag = i;
    w[i].tm.add.mask = kMask;
    if (i < 3) w[i].next = &w[i + 1];
  }
  // Three ADDs on a list of two: the third is refused (ENOMEM), the two
  // before it done.
  w[2].next = nullptr;
  CHECK(ibv_post_srq_ops(t.srq, w, &bad) == ENOMEM);
  CHECK(bad == &w[2]);
  auto c = poll_ex(t.cqx, 2);
  REQUIRE(c.size() == 2);
  CHECK(c[0].wr_id == 0);
  CHECK(c[1].wr_id == 1);
  CHECK(c[0].opcode == IBV_WC_TM_ADD);
  const uint32_t h0 = w[0].tm.handle, h1 = w[1].tm.handle;
  // A DEL of a handle that is no tag's: EINVAL, nothing done.
  ibv_ops_wr x{};
  x.opcode = IBV_WR_TAG_DEL;
  x.flags = IBV_OPS_SIGNALED;
  x.tm.handle = 1000;
  bad = nullptr;
  CHECK(ibv_post_srq_ops(t.srq, &x, &bad) == EINVAL);
  CHECK(bad == &x);
  // An unknown opcode or flag, too many SGEs: EINVAL.
  x.tm.handle = h0;
  x.opcode = ibv_ops_wr_opcode(7);
  CHECK(ibv_post_srq_ops(t.srq, &x, &bad) == EINVAL);
  x.opcode = IBV_WR_TAG_SYNC;
  x.flags = 1 << 5;
  CHECK(ibv_post_srq_ops(t.srq, &x, &bad) == EINVAL);
  w[3].next = nullptr;
  w[3].tm.add.num_sge = 9;
  CHECK(ibv_post_srq_ops(t.srq, &w[3], &bad) == EINVAL);
  w[3].tm.add.num_sge = 1;
  w[3].tm.add.sg_list = nullptr;
  CHECK(ibv_post_srq_ops(t.srq, &w[3], &bad) == EINVAL);
  CHECK(poll_ex(t.cqx, 1, 0.2).empty());
  // More than max_ops (3) in one call: ENOMEM at the fourth.
  ibv_ops_wr s[4]{};
  for (int i = 0; i < 4; i++) {
    s[i].wr_id = 50 + i;
    s[i].opcode = IBV_WR_TAG_SYNC;
    s[i].flags = IBV_OPS_SIGNALED;
    if (i < 3) s[i].next = &s[i + 1];
  }
  CHECK(ibv_post_srq_ops(t.srq, s, &bad) == ENOMEM);
  CHECK(bad == &s[3]);
  c = poll_ex(t.cqx, 3);
  REQUIRE(c.size() == 3);
  CHECK(c[2].wr_id == 52);
  CHECK(c[2].opcode == IBV_WC_TM_SYNC);
  // Both tags still there: both deleted.
  REQUIRE(t.op(IBV_WR_TAG_DEL, 60, h0) == 0);
  CHECK(t.op_done(IBV_WC_TM_DEL).status == IBV_WC_SUCCESS);
  REQUIRE(t.op(IBV_WR_TAG_DEL, 61, h1) == 0);
  CHECK(t.op_done(IBV_WC_TM_DEL).status == IBV_WC_SUCCESS);
}
