// Driver registration, devices, contexts, and the device/port queries.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "usrc/boundary.h"
#include "usrc/common/log.h"
#include "usrc/common/tunables.h"
#include "usrc/usrc.h"
#include "usrc/version.h"

namespace usrc {

// Every op behind at_boundary (boundary.h): no exception reaches libibverbs.
static const verbs_context_ops kOps = [] {
  verbs_context_ops o{};
  o.advise_mr = at_boundary<advise_mr>;
  o.alloc_dm = at_boundary<alloc_dm>;
  o.alloc_mw = at_boundary<alloc_mw>;
  o.alloc_parent_domain = at_boundary<alloc_parent_domain>;
  o.alloc_pd = at_boundary<alloc_pd>;
  o.alloc_td = at_boundary<alloc_td>;
  o.async_event = at_boundary<async_event_op>;
  o.close_xrcd = at_boundary<close_xrcd>;
  o.bind_mw = at_boundary<bind_mw>;
  o.cq_event = at_boundary<cq_event>;
  o.create_ah = at_boundary<create_ah>;
  o.create_cq = at_boundary<create_cq>;
  o.create_cq_ex = at_boundary<create_cq_ex>;
  o.create_qp = at_boundary<create_qp>;
  o.create_srq = at_boundary<create_srq>;
  o.create_srq_ex = at_boundary<create_srq_ex>;
  o.create_qp_ex = at_boundary<create_qp_ex>;
  o.dealloc_mw = at_boundary<dealloc_mw>;
  o.dealloc_pd = at_boundary<dealloc_pd>;
  o.dealloc_td = at_boundary<dealloc_td>;
  o.dereg_mr = at_boundary<dereg_mr>;
  o.destroy_ah = at_boundary<destroy_ah>;
  o.destroy_cq = at_boundary<destroy_cq>;
  o.destroy_qp = at_boundary<destroy_qp>;
  o.destroy_srq = at_boundary<destroy_srq>;
  o.free_dm = at_boundary<free_dm>;
  o.get_srq_num = at_boundary<get_srq_num>;
  o.import_dm = at_boundary<import_dm>;
  o.import_mr = at_boundary<import_mr>;
  o.import_pd = at_boundary<import_pd>;
  o.open_qp = at_boundary<open_qp>;
  o.open_xrcd = at_boundary<open_xrcd>;
  o.modify_qp = at_boundary<modify_qp>;
  o.modify_srq = at_boundary<modify_srq>;
  o.poll_cq = at_boundary<poll_cq, true>;
  o.post_recv = at_boundary<post_recv>;
  o.post_send = at_boundary<post_send>;
  o.post_srq_ops = at_boundary<post_srq_ops>;
  o.post_srq_recv = at_boundary<post_srq_recv>;
  o.query_device_ex = at_boundary<query_device_ex>;
  o.query_port = at_boundary<query_port>;
  o.query_rt_values = at_boundary<query_rt_values>;
  o.query_qp = at_boundary<query_qp>;
  o.query_srq = at_boundary<query_srq>;
  o.reg_dm_mr = at_boundary<reg_dm_mr>;
  o.reg_mr = at_boundary<reg_mr>;
  o.req_notify_cq = at_boundary<req_notify_cq>;
  o.rereg_mr = at_boundary<rereg_mr>;
  o.resize_cq = at_boundary<resize_cq>;
  o.unimport_dm = at_boundary<unimport_dm>;
  o.unimport_mr = at_boundary<unimport_mr>;
  o.unimport_pd = at_boundary<unimport_pd>;
  return o;
}();

static void free_context(ibv_context *ibctx) {
  VerbsContext *c = to_vctx(ibctx);
  unregister_context(c);
  c->impl->remove_async(ibctx);
  Context::unref(c->impl);   // (the last of the contexts sharing it closes it)
  verbs_uninit_context(&c->vctx);
  free(c);
}

static verbs_context *alloc_context(ibv_device *ibdev, int cmd_fd, void *) {
  auto *dev = reinterpret_cast<Device *>(ibdev);
  auto *c = static_cast<VerbsContext *>(
      _verbs_init_and_alloc_context(ibdev, cmd_fd, sizeof(VerbsContext),
                                    /* offset of vctx: */ nullptr, 0));
  static_assert(offsetof(VerbsContext, vctx) == 0);
  int import_fd;
  Context *from = importing(&import_fd);
  if (!c) {
    if (from) Context::unref(from);
    return nullptr;
  }
  std::string err;
  // (Out of memory or threads: ENOMEM or EAGAIN, not an exception.)
  int e = ENODEV;
  c->impl = nullptr;
  if (from) {
    // An import (import.cpp): the context shares from's, and its command
    // fd is the one given (closed with it, as libibverbs' imports do).
    close(cmd_fd);
    c->vctx.context.cmd_fd = import_fd;
    c->impl = from;
  } else {
    // There is no kernel behind the command fd. Make it read-only
    // /dev/null: ioctls fail with ENOTTY (so GIDs and pkeys come from sysfs
    // files) and writes fail with EBADF (so the stock
    // ibv_create_comp_channel fails cleanly instead of returning a stack
    // value as its fd). A fresh open for each context: the open file names
    // the context (ibv_import_device).
    int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (ro >= 0) {
      dup3(ro, cmd_fd, O_CLOEXEC);
      close(ro);
    }
    if (!no_throw([&] { c->impl = Context::open(*dev->cfg, &err); }, &e)) err.clear();
  }
  const int afd = c->impl ? c->impl->add_async(&c->vctx.context) : -1;
  if (c->impl && afd < 0) {
    e = errno;
    err = std::string("async event socket: ") + strerror(e);
    Context::unref(c->impl);
    c->impl = nullptr;
  }
  if (!c->impl) {
    // (A failed import leaves the caller its fd.)
    if (from) c->vctx.context.cmd_fd = -1;
    // An empty message: a refusal that is expected (see net/ofi.cpp).
    if (!err.empty()) {
      log().error("{}: {}", dev->cfg->name, err);
      fprintf(stderr, "usrc: %s: %s\n", dev->cfg->name.c_str(), err.c_str());
    }
    verbs_uninit_context(&c->vctx);
    free(c);
    errno = e;
    return nullptr;
  }
  c->vctx.context.async_fd = afd;
  c->vctx.context.num_comp_vectors = 1;
  verbs_set_ops(&c->vctx, &kOps);
  // free_context is called by ibv_close_device; it is not in the table above
  // only because its slot must always be ours.
  verbs_context_ops fc{};
  fc.free_context = at_boundary<free_context>;
  verbs_set_ops(&c->vctx, &fc);
  register_context(c);
  return &c->vctx;
}

// The configuration in the directory libibverbs found (the tree may live
// under another root than USRC_ROOT).
static std::optional<DeviceConfig> found_config(const verbs_sysfs_dev *sdev, std::string *err) {
  std::ifstream f(std::string(sdev->ibdev_path) + "/" + kConfigFile);
  std::stringstream ss;
  ss << f.rdbuf();
  return DeviceConfig::parse(ss.str(), err);
}

static bool match_device(verbs_sysfs_dev *sdev) {
  // A usrc device is one whose sysfs directory holds our config file.
  std::string path = std::string(sdev->ibdev_path) + "/" + kConfigFile;
  if (access(path.c_str(), R_OK) != 0) return false;
  // The tree is one for every network namespace, but a device belongs to
  // its netdev's: elsewhere that netdev is another or none, the address
  // cannot be bound and no port event comes. So it is offered there only,
  // as the kernel offers RDMA devices in its exclusive netns mode. Not
  // matching keeps libibverbs quiet (it reports a device no driver takes
  // only under IBV_SHOW_WARNINGS), where a failed alloc_device would print.
  // Offered anyway: a device whose namespace was not recorded (an older
  // usrc made it), when /proc cannot tell ours, and a configuration that
  // does not parse (alloc_device says what is wrong with it).
  auto cfg = found_config(sdev, nullptr);
  return !cfg || cfg->offered_in(net_namespace());
}

static verbs_device *alloc_device_ops(verbs_sysfs_dev *sdev) {
  std::string err;
  auto cfg = DeviceConfig::load(sdev->ibdev_name, &err);
  if (!cfg) cfg = found_config(sdev, &err);
  if (!cfg) {
    fprintf(stderr, "usrc: %s: bad device configuration: %s\n", sdev->ibdev_name, err.c_str());
    return nullptr;
  }
  auto *d = static_cast<Device *>(calloc(1, sizeof(Device)));
  if (!d) return nullptr;
  d->cfg = new (std::nothrow) DeviceConfig(*cfg);
  if (!d->cfg) {
    free(d);
    return nullptr;
  }
  return &d->vdev;
}

static void uninit_device(verbs_device *vdev) {
  auto *d = reinterpret_cast<Device *>(vdev);
  delete d->cfg;
  free(d);
}

extern "C" const verbs_device_ops usrc_device_ops = {
    .name = "usrc",
    .match_min_abi_version = 0,
    .match_max_abi_version = 0xffffffff,
    .match_table = nullptr,
    .static_providers = nullptr,
    .match_device = match_device,
    .alloc_context = at_boundary<alloc_context>,
    .import_context = at_boundary<import_context>,
    .alloc_device = at_boundary<alloc_device_ops>,
    .uninit_device = uninit_device,
};

__attribute__((constructor)) static void register_driver() {
  verbs_register_driver_34(&usrc_device_ops);
}

// ---------------------------------------------------------------- queries

static ibv_mtu mtu_enum(uint32_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
  }
}

int query_device_ex(ibv_context *ibctx, const ibv_query_device_ex_input *, ibv_device_attr_ex *attr,
                    size_t attr_size) {
  const DeviceConfig &cfg = impl(ibctx).cfg();
  ibv_device_attr_ex a{};
  ibv_device_attr &o = a.orig_attr;
  snprintf(o.fw_ver, sizeof o.fw_ver, "usrc " USRC_VERSION);
  o.node_guid = htobe64(cfg.node_guid);
  o.sys_image_guid = htobe64(cfg.node_guid);
  o.max_mr_size = UINT64_MAX;
  // Every page size from 4 KiB: nothing is pinned or translated by pages.
  o.page_size_cap = ~uint64_t{0xfff};
  // vendor_id is an IEEE OUI, and usrc has none. 0 reads as "not filled
  // in" (rdma-core's pyverbs tests fail it), and 0xFFFFFF is rxe's (SPDK
  // keys rxe's quirks on it). 02-55-53 is locally administered (0x02 in the
  // first octet, as in our node GUIDs), which the IEEE never assigns, so no
  // tool's table of a vendor's devices matches it; "US" as in vendor_part_id.
  o.vendor_id = 0x025553;
  // Not in perftest's device table: perftest then uses ibv_post_send.
  o.vendor_part_id = Tunables::get().vendor_part_id;
  o.hw_ver = 1;
  o.max_qp = static_cast<int>(kQpsPerSlot);
  o.max_qp_wr = rc::kMaxWr;
  o.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_CURR_QP_STATE_MOD |
                       IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  o.max_sge = rc::kMaxSge;
  o.max_sge_rd = rc::kMaxSge;
  o.max_cq = 1 << 16;
  o.max_cqe = 1 << 20;
  o.max_mr = 1 << 20;
  o.max_mw = 1 << 16;
  o.max_pd = 1 << 16;   // (parent domains are PDs here; thread domains have no attribute)
  o.max_srq = 1 << 16;
  o.max_srq_wr = rc::kMaxWr;
  o.max_srq_sge = rc::kMaxSge;
  o.max_qp_rd_atom = rc::kMaxRdAtomic;
  o.max_ee_rd_atom = 0;
  o.max_res_rd_atom = rc::kMaxRdAtomic * kQpsPerSlot;
  o.max_qp_init_rd_atom = rc::kMaxRdAtomic;
  // Atomics are CPU atomics at the responder: atomic against every atomic
  // through this device (HCA) and in fact against the host's own too.
  o.atomic_cap = IBV_ATOMIC_HCA;
  o.max_pkeys = 1;
  o.local_ca_ack_delay = 0;
  o.phys_port_cnt = 1;
  // Completion timestamps are nanoseconds of CLOCK_MONOTONIC: a 1 GHz
  // "core clock" (hca_core_clock is in kHz) that never wraps.
  a.completion_timestamp_mask = UINT64_MAX;
  // RDMA ATOMIC WRITE (IBV_WR_ATOMIC_WRITE): the kernel's flag
  // IB_UVERBS_DEVICE_ATOMIC_WRITE (Linux 6.2; not in Debian 12's headers).
  constexpr uint64_t kDeviceAtomicWrite = 1ull << 40;
  a.device_cap_flags_ex = o.device_cap_flags | kDeviceAtomicWrite;
  a.hca_core_clock = 1000000;
  a.phys_port_cnt_ex = 1;
  // Nothing is pinned: on-demand paging is the natural mode (pd_mr.cpp).
  a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  a.odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                              IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                                              IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                              IBV_ODP_SUPPORT_SRQ_RECV;
  a.xrc_odp_caps = a.odp_caps.per_transport_caps.rc_odp_caps;   // (XRC is RC's transport)
  a.max_dm_size = kMaxDmSize;
  // Packet pacing (IBV_QP_RATE_LIMIT) of RC QPs.
  a.packet_pacing_caps.qp_rate_limit_min = kMinRateLimitKbps;
  a.packet_pacing_caps.qp_rate_limit_max = kMaxRateLimitKbps;
  a.packet_pacing_caps.supported_qpts = 1 << IBV_QPT_RC;
  // Tag matching on RC QPs (rc/tm.h).
  a.tm_caps.max_rndv_hdr_size = rc::kTmMaxRndvHdr;
  a.tm_caps.max_num_tags = rc::kTmMaxTags;
  a.tm_caps.flags = IBV_TM_CAP_RC;
  a.tm_caps.max_ops = rc::kTmMaxOps;
  a.tm_caps.max_sge = rc::kMaxSge;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  // ibv_query_device passes the legacy struct, placed at orig_attr, with
  // attr_size = sizeof(ibv_device_attr): then nothing else may be written.
  if (attr_size == sizeof(ibv_device_attr)) {
    attr->orig_attr = o;
    return 0;
  }
  std::memcpy(attr, &a, std::min(attr_size, sizeof a));
  return 0;
}

int query_port(ibv_context *ibctx, uint8_t port, ibv_port_attr *attr) {
  if (port != 1) return EINVAL;
  const DeviceConfig &cfg = impl(ibctx).cfg();
  *attr = {};
  const bool up = impl(ibctx).port_up();
  attr->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = mtu_enum(cfg.active_mtu);
  attr->gid_tbl_len = static_cast<int>(cfg.gid_table_size());
  attr->port_cap_flags = 0;
  attr->max_msg_sz = rc::kMaxMsgSize;
  attr->pkey_tbl_len = 1;
  attr->lid = cfg.link_layer == LinkLayer::ib ? cfg.lid : 0;
  attr->sm_lid = cfg.link_layer == LinkLayer::ib ? cfg.sm_lid : 0;
  attr->lmc = 0;
  attr->max_vl_num = 1;
  attr->active_width = 1;      // 1X
  attr->active_speed = 1;      // SDR: a nominal figure; the real rate is the host's
  attr->phys_state = up ? 5 : 3;   // LinkUp : Disabled
  attr->link_layer = cfg.link_layer == LinkLayer::ib ? IBV_LINK_LAYER_INFINIBAND
                                                     : IBV_LINK_LAYER_ETHERNET;
  return 0;
}

void async_event_op(ibv_context *, ibv_async_event *) {}

}  // namespace usrc
