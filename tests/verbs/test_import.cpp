// Sharing a context (ibv_import_device on a dup of its command fd) and its
// PDs, MRs and device memory by handle (ibv_import_pd/mr/dm), within the
// process: the only scope usrc has for them.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

ibv_context *import_dup(ibv_context *ctx) {
  int fd = dup(ctx->cmd_fd);
  REQUIRE(fd >= 0);
  ibv_context *c = ibv_import_device(fd);
  if (!c) close(fd);
  return c;
}

ibv_dm *alloc_dm(ibv_context *ctx, size_t len) {
  ibv_alloc_dm_attr a{};
  a.length = len;
  return ibv_alloc_dm(ctx, &a);
}

}  // namespace

TEST_CASE("ibv_import_device: a dup of the command fd shares the context; PD, MR and DM handles name the same objects", "[verbs][import]") {
  Dev d;
  ibv_context *ctx2 = import_dup(d.ctx);
  REQUIRE(ctx2);
  CHECK(ctx2 != d.ctx);
  CHECK(ctx2->device == d.ctx->device);   // (the fd's context's device, whatever the list's order)
  ibv_device_attr da{};
  CHECK(ibv_query_device(ctx2, &da) == 0);
  CHECK(da.vendor_id == 0x025553);

  ibv_pd *pd2 = ibv_import_pd(ctx2, d.pd->handle);
  REQUIRE(pd2);
  CHECK(pd2 != d.pd);
  CHECK(pd2->handle == d.pd->handle);
  CHECK(pd2->context == ctx2);
  Dev d2(ctx2, pd2);   // (closes both: the import's dealloc ends the import)

  // An MR of the original, imported: the same keys and length, no address.
  std::vector<uint8_t> buf(8192, 0), src(8192);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 13 + 1);
  ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr *ms = ibv_reg_mr(d.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  REQUIRE(ms);
  ibv_mr *mr2 = ibv_import_mr(pd2, mr->handle);
  ibv_mr *ms2 = ibv_import_mr(pd2, ms->handle);
  REQUIRE(mr2);
  REQUIRE(ms2);
  CHECK(mr2 != mr);
  CHECK(mr2->handle == mr->handle);
  CHECK(mr2->lkey == mr->lkey);
  CHECK(mr2->rkey == mr->rkey);
  CHECK(mr2->length == mr->length);
  CHECK(mr2->addr == nullptr);
  CHECK(mr2->pd == pd2);
  CHECK(mr2->context == ctx2);

  {
    // A QP of the imported context on the imported PD, connected to one of
    // the original: RDMA WRITEs both ways through the shared keys.
    Qp a(d), b(d2);
    connect_pair(d, a, b);
    ibv_sge sa{uintptr_t(src.data()), 4096, ms->lkey};
    REQUIRE(post_send(a.qp, 1, IBV_WR_RDMA_WRITE, &sa, 1, IBV_SEND_SIGNALED, uintptr_t(buf.data()), mr2->rkey) == 0);
    auto w = poll(a.cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(buf.data(), src.data(), 4096) == 0);
    ibv_sge sb{uintptr_t(src.data()) + 4096, 4096, ms2->lkey};
    REQUIRE(post_send(b.qp, 2, IBV_WR_RDMA_WRITE, &sb, 1, IBV_SEND_SIGNALED, uintptr_t(buf.data()) + 4096,
                      mr->rkey) == 0);
    w = poll(b.cq, 1);
    REQUIRE(w.size() == 1);
    CHECK(w[0].status == IBV_WC_SUCCESS);
    CHECK(buf == src);
  }

  // Device memory: what one handle writes, the other reads.
  ibv_dm *dm = alloc_dm(d.ctx, 4096), *other = alloc_dm(d.ctx, 4096);
  REQUIRE(dm);
  REQUIRE(other);
  CHECK(dm->handle != other->handle);
  ibv_dm *dm2 = ibv_import_dm(ctx2, dm->handle);
  REQUIRE(dm2);
  CHECK(dm2->context == ctx2);
  CHECK(dm2->handle == dm->handle);
  std::vector<uint8_t> in(256, 0xab), out(256, 0);
  CHECK(ibv_memcpy_to_dm(dm, 64, in.data(), in.size()) == 0);
  CHECK(ibv_memcpy_from_dm(out.data(), dm2, 64, out.size()) == 0);
  CHECK(out == in);
  CHECK(ibv_memcpy_from_dm(out.data(), dm2, 4000, 256) == EINVAL);   // (its bounds are the original's)

  // Nothing is freed under its imports; an unimport lets it go.
  CHECK(ibv_dereg_mr(mr) == EBUSY);
  CHECK(ibv_free_dm(dm) == EBUSY);
  CHECK(ibv_dealloc_pd(d.pd) == EBUSY);
  ibv_unimport_mr(mr2);
  ibv_unimport_mr(ms2);
  ibv_unimport_dm(dm2);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dereg_mr(ms) == 0);
  CHECK(ibv_free_dm(dm) == 0);
  CHECK(ibv_free_dm(other) == 0);
}

TEST_CASE("ibv_import_device: either context may be closed first, the other goes on", "[verbs][import]") {
  const bool original_first = GENERATE(true, false);
  auto d = std::make_unique<Dev>();
  ibv_context *ctx2 = import_dup(d->ctx);
  REQUIRE(ctx2);
  ibv_context *ctx3 = import_dup(ctx2);   // (an import's fd is a context's too)
  REQUIRE(ctx3);
  CHECK(ctx3->device == d->ctx->device);
  CHECK(ibv_close_device(ctx3) == 0);
  ibv_pd *pd2 = ibv_import_pd(ctx2, d->pd->handle);
  REQUIRE(pd2);
  ibv_unimport_pd(pd2);
  auto d2 = std::make_unique<Dev>(ctx2, ibv_alloc_pd(ctx2));
  if (original_first) d.reset();
  else d2.reset();
  Dev &left = original_first ? *d2 : *d;
  // The context left is whole: a connection and a SEND over it.
  Qp a(left), b(left);
  connect_pair(left, a, b);
  std::vector<uint8_t> src(2000, 7), dst(2000, 0);
  ibv_mr *ms = ibv_reg_mr(left.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *md = ibv_reg_mr(left.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge rs{uintptr_t(dst.data()), 2000, md->lkey}, ss{uintptr_t(src.data()), 2000, ms->lkey};
  REQUIRE(post_recv(b.qp, 1, &rs, 1) == 0);
  REQUIRE(post_send(a.qp, 2, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED) == 0);
  CHECK(poll(b.cq, 1).size() == 1);
  CHECK(dst == src);
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

TEST_CASE("ibv_import_pd: objects on an imported PD outlive its import; its dealloc ends the import only", "[verbs][import]") {
  Dev d;
  ibv_context *ctx2 = import_dup(d.ctx);
  REQUIRE(ctx2);
  ibv_pd *pd2 = ibv_import_pd(ctx2, d.pd->handle), *pd3 = ibv_import_pd(ctx2, d.pd->handle);
  REQUIRE(pd2);
  REQUIRE(pd3);
  ibv_cq *cq = ibv_create_cq(ctx2, 16, nullptr, nullptr, 0);
  REQUIRE(cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {8, 8, 1, 1, 0};
  ibv_qp *qp = ibv_create_qp(pd2, &ia), *qp3 = ibv_create_qp(pd3, &ia);
  REQUIRE(qp);
  REQUIRE(qp3);
  // A parent domain on an import has the PD's protection.
  ibv_parent_domain_init_attr pa{};
  pa.pd = pd3;
  ibv_pd *parent = ibv_alloc_parent_domain(ctx2, &pa);
  REQUIRE(parent);
  std::vector<uint8_t> buf(64);
  ibv_mr *mr = ibv_reg_mr(parent, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  ibv_mr *mr1 = ibv_import_mr(d.pd, mr->handle);   // (the same protection domain)
  REQUIRE(mr1);
  ibv_unimport_mr(mr1);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dealloc_pd(parent) == 0);
  // pyverbs' order: the import ends, then its QP goes.
  ibv_unimport_pd(pd2);
  CHECK(ibv_dealloc_pd(d.pd) == EBUSY);   // (pd2's QP, pd3)
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_dealloc_pd(pd3) == EBUSY);   // (its QP)
  CHECK(ibv_destroy_qp(qp3) == 0);
  CHECK(ibv_dealloc_pd(pd3) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_close_device(ctx2) == 0);
  // No import left: the PD is its own again.
  ibv_pd *pd = d.pd;
  d.pd = ibv_alloc_pd(d.ctx);
  CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("ibv_import_*: unknown fds and handles fail cleanly", "[verbs][import]") {
  Dev d;
  auto import_fails = [](int fd, int want) {
    errno = 0;
    ibv_context *c = ibv_import_device(fd);
    if (c) ibv_close_device(c);
    CHECK(c == nullptr);
    CHECK(errno == want);
  };
  import_fails(-1, EINVAL);   // not an fd
  import_fails(d.ctx->cmd_fd, EINVAL);   // the context's own fd, not a dup
  char path[] = "/tmp/usrc-import.XXXXXX";
  int file = mkstemp(path);
  REQUIRE(file >= 0);
  unlink(path);
  import_fails(file, EINVAL);   // not a character device
  close(file);
  int zero = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  REQUIRE(zero >= 0);
  import_fails(zero, ENODEV);   // a character device of no RDMA device
  close(zero);
  int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(null >= 0);
  import_fails(null, ENODEV);   // /dev/null, but no context's (as another process's would be)
  close(null);
  {
    // The fd of a context that is gone (another context opened since).
    auto gone = std::make_unique<Dev>();
    int fd = dup(gone->ctx->cmd_fd);
    REQUIRE(fd >= 0);
    gone.reset();
    Dev since;
    import_fails(fd, ENODEV);
    close(fd);
  }

  // Handles: none, a deallocated PD's, another context's (not an import of
  // this one), an MR of another PD, a memory window's key.
  ibv_context *ctx2 = import_dup(d.ctx);
  REQUIRE(ctx2);
  Dev other;
  errno = 0;
  CHECK(ibv_import_pd(ctx2, 0) == nullptr);
  CHECK(errno == EINVAL);
  ibv_pd *p = ibv_alloc_pd(d.ctx);
  REQUIRE(p);
  const uint32_t old = p->handle;
  CHECK(p->handle != d.pd->handle);
  CHECK(ibv_dealloc_pd(p) == 0);
  errno = 0;
  CHECK(ibv_import_pd(ctx2, old) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_import_pd(ctx2, other.pd->handle) == nullptr);
  CHECK(errno == EINVAL);
  ibv_pd *pd2 = ibv_import_pd(ctx2, d.pd->handle);
  REQUIRE(pd2);
  std::vector<uint8_t> buf(64);
  ibv_pd *p2 = ibv_alloc_pd(d.ctx);
  ibv_mr *m = ibv_reg_mr(p2, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mo = ibv_reg_mr(other.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m);
  REQUIRE(mo);
  errno = 0;
  CHECK(ibv_import_mr(pd2, m->handle) == nullptr);   // (p2's)
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_import_mr(pd2, mo->handle) == nullptr);   // (another context's)
  CHECK(errno == EINVAL);
  ibv_mw *mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
  REQUIRE(mw);
  errno = 0;
  CHECK(ibv_import_mr(pd2, mw->rkey) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(ibv_dealloc_mw(mw) == 0);
  ibv_dm *dm = alloc_dm(d.ctx, 64);
  REQUIRE(dm);
  errno = 0;
  CHECK(ibv_import_dm(ctx2, dm->handle + 1000000) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_import_dm(other.ctx, dm->handle) == nullptr);
  CHECK(errno == EINVAL);
  // An imported DM's free and an imported MR's deregistration end the
  // import only.
  ibv_dm *dm2 = ibv_import_dm(ctx2, dm->handle);
  REQUIRE(dm2);
  CHECK(ibv_free_dm(dm2) == 0);
  ibv_mr *m2 = ibv_import_mr(ibv_import_pd(d.ctx, p2->handle), m->handle);
  REQUIRE(m2);
  ibv_pd *mp = m2->pd;
  CHECK(ibv_dereg_mr(m2) == 0);
  ibv_unimport_pd(mp);
  CHECK(ibv_free_dm(dm) == 0);
  CHECK(ibv_dereg_mr(m) == 0);
  CHECK(ibv_dereg_mr(mo) == 0);
  CHECK(ibv_dealloc_pd(p2) == 0);
  ibv_unimport_pd(pd2);
  CHECK(ibv_close_device(ctx2) == 0);
}
