// The device as tools expect it: what ibv_query_device(_ex) and
// ibv_query_port report, held to the checks stock test suites make of any
// RDMA device (rdma-core's pyverbs test_device.py: a vendor, GUIDs, limits
// above 0, one port count both ways). Run through `usrc exec` on the device
// USRC_TEST_DEV names.
#include <unistd.h>

#include <cerrno>

#include <catch2/catch.hpp>

#include "verbs_util.h"

using namespace verbs_test;

namespace {

void check_attr(const ibv_device_attr &a) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  CHECK(a.vendor_id != 0);
  CHECK(a.vendor_id <= 0xffffff);   // an OUI: 24 bits
  CHECK(a.node_guid != 0);
  CHECK(a.sys_image_guid != 0);
  CHECK(a.max_mr_size > page);
  CHECK(a.page_size_cap >= page);
  CHECK((a.page_size_cap & page) != 0);   // this host's pages among the sizes
  CHECK(a.max_qp > 0);
  CHECK(a.max_qp_wr > 0);
  CHECK(a.max_sge > 0);
  CHECK(a.max_sge_rd >= 0);
  CHECK(a.max_cq > 0);
  CHECK(a.max_cqe > 0);
  CHECK(a.max_mr > 0);
  CHECK(a.max_pd > 0);
  CHECK(a.max_pkeys > 0);
  CHECK(a.phys_port_cnt == 1);
}

}  // namespace

TEST_CASE("query_device and query_device_ex: a vendor, GUIDs, limits, one port", "[verbs][device]") {
  Dev d;
  ibv_context *ctx = d.ctx;
  ibv_device_attr a{};
  REQUIRE(ibv_query_device(ctx, &a) == 0);
  check_attr(a);
  ibv_device_attr_ex ax{};
  REQUIRE(ibv_query_device_ex(ctx, nullptr, &ax) == 0);
  check_attr(ax.orig_attr);
  CHECK(ax.orig_attr.vendor_id == a.vendor_id);
  CHECK(ax.orig_attr.vendor_part_id == a.vendor_part_id);
  CHECK(ax.phys_port_cnt_ex == a.phys_port_cnt);
  // libibverbs' own node GUID (read from the tree) is the device's.
  CHECK(ibv_get_device_guid(ctx->device) == a.node_guid);

  ibv_port_attr p{};
  REQUIRE(ibv_query_port(ctx, 1, &p) == 0);
  CHECK(p.max_msg_sz > 0x1000);
  CHECK(p.active_width == 1);   // 1X
  CHECK(p.active_speed == 1);   // SDR
  CHECK(p.max_mtu >= IBV_MTU_256);
  CHECK(p.max_mtu <= IBV_MTU_4096);
  CHECK(p.active_mtu <= p.max_mtu);
  CHECK((p.link_layer == IBV_LINK_LAYER_INFINIBAND || p.link_layer == IBV_LINK_LAYER_ETHERNET));
  // A port beyond the count: EINVAL.
  for (uint8_t port : {uint8_t(0), uint8_t(2), uint8_t(11)}) CHECK(ibv_query_port(ctx, port, &p) == EINVAL);
}

// The port's GID table: the GIDs in use, then empty entries, as a NIC's
// (a tool looking for a free index finds one, and learns it is empty).
TEST_CASE("GID table: entries in use, then empty ones (ENODATA)", "[verbs][device]") {
  Dev d;
  REQUIRE(d.port.gid_tbl_len >= 16);
  ibv_gid_entry tbl[64];
  ssize_t n = ibv_query_gid_table(d.ctx, tbl, 64, 0);
  REQUIRE(n >= 1);
  CHECK(n < d.port.gid_tbl_len);
  for (ssize_t i = 0; i < n; i++) {
    CHECK(tbl[i].port_num == 1);
    CHECK(tbl[i].gid_index == uint32_t(i));   // in use: the first indices
    CHECK(tbl[i].gid_type == (d.port.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB));
  }
  ibv_gid_entry e{};
  CHECK(ibv_query_gid_ex(d.ctx, 1, 0, &e, 0) == 0);
  CHECK(ibv_query_gid_ex(d.ctx, 1, uint32_t(n), &e, 0) == ENODATA);
  CHECK(ibv_query_gid_ex(d.ctx, 1, d.port.gid_tbl_len - 1, &e, 0) == ENODATA);
  // An empty entry is no source GID for a QP's path.
  Qp a(d);
  REQUIRE(to_init(a.qp, 0) == 0);
  ibv_qp_attr at = rtr_attr(d, a.qp->qp_num, Params{});
  at.ah_attr.is_global = 1;
  at.ah_attr.grh.sgid_index = uint8_t(n);
  at.ah_attr.grh.hop_limit = 1;
  CHECK(ibv_modify_qp(a.qp, &at, kRtrMask) == EINVAL);
}
