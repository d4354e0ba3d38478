// usrc's declaration of the libibverbs private provider interface,
// version IBVERBS_PRIVATE_34.
//
// libibverbs loads a provider by dlopen() and talks to it through a handful
// of structures that its public <infiniband/verbs.h> does not describe: the
// device-ops table the provider registers, the device and sysfs records
// libibverbs fills in, the per-context op table, and a few wrappers around
// public objects. Distributions do not install rdma-core's own header for
// this, so usrc declares the layout here.
//
// Fit: rdma-core 36 to 56 (every release that exports IBVERBS_PRIVATE_34
// with this layout; 34 and 35 export the same version name with smaller
// structures). Newer rdma-core bumps the private version (57, 59, 64, 65);
// supporting one means one more file like this beside it and a matching
// check in CheckPabi.cmake. The sizes below are asserted at compile time.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <sys/types.h>

// Two-pointer intrusive list link used inside libibverbs' records.
struct usrc_list_link {
  usrc_list_link *next, *prev;
};

// How a provider recognises devices. usrc matches with match_device().
enum : uint8_t {
  VERBS_MATCH_SENTINEL = 0,
  VERBS_MATCH_PCI = 1,
  VERBS_MATCH_MODALIAS = 2,
  VERBS_MATCH_DRIVER_ID = 3,
};

struct verbs_match_ent {
  void *driver_data;
  union {
    const char *modalias;
    uint64_t driver_id;
  } u;
  uint16_t vendor;
  uint16_t device;
  uint8_t kind;
};

// One device found in (the synthesized) sysfs.
struct verbs_sysfs_dev {
  usrc_list_link entry;
  void *provider_data;
  const verbs_match_ent *match;
  unsigned int flags;
  char sysfs_name[IBV_SYSFS_NAME_MAX];   // uverbsN
  dev_t sysfs_cdev;
  char ibdev_name[IBV_SYSFS_NAME_MAX];   // e.g. usrc0
  char ibdev_path[IBV_SYSFS_PATH_MAX];   // $SYSFS_PATH/class/infiniband/usrc0
  char modalias[512];
  uint64_t node_guid;
  uint32_t driver_id;
  ibv_node_type node_type;
  int ibdev_idx;
  uint32_t num_ports;
  uint32_t abi_ver;
  timespec time_created;
};

struct verbs_device;

// What a provider registers.
struct verbs_device_ops {
  const char *name;
  uint32_t match_min_abi_version;
  uint32_t match_max_abi_version;
  const verbs_match_ent *match_table;
  const verbs_device_ops **static_providers;
  bool (*match_device)(verbs_sysfs_dev *sysfs_dev);
  verbs_context *(*alloc_context)(ibv_device *device, int cmd_fd, void *private_data);
  verbs_context *(*import_context)(ibv_device *device, int cmd_fd);
  verbs_device *(*alloc_device)(verbs_sysfs_dev *sysfs_dev);
  void (*uninit_device)(verbs_device *device);
};

// The provider's device record; the provider allocates it zeroed (calloc)
// in alloc_device and libibverbs fills in the rest.
struct verbs_device {
  ibv_device device;            // first: libibverbs hands out &device
  const verbs_device_ops *ops;
  int refcount;                 // an atomic_int in libibverbs (same size)
  usrc_list_link entry;
  verbs_sysfs_dev *sysfs;
  uint64_t core_support;
};

// Wrappers around public objects that libibverbs reads.
enum ibv_mr_type {
  IBV_MR_TYPE_MR,
  IBV_MR_TYPE_NULL_MR,
  IBV_MR_TYPE_IMPORTED_MR,
  IBV_MR_TYPE_DMABUF_MR,
};

struct verbs_mr {
  ibv_mr ibmr;                  // (named ibv_mr in rdma-core; C++ needs another name)
  ibv_mr_type mr_type;
  int access;
};

struct verbs_xrcd {
  ibv_xrcd xrcd;
  uint32_t comp_mask;
  uint32_t handle;
};

struct verbs_srq {
  ibv_srq srq;
  ibv_srq_type srq_type;
  verbs_xrcd *xrcd;
  ibv_cq *cq;
  uint32_t srq_num;
};

enum { VERBS_QP_XRCD = 1 << 0, VERBS_QP_EX = 1 << 1 };

struct verbs_qp {
  union {
    ibv_qp qp;
    ibv_qp_ex qp_ex;            // valid when comp_mask has VERBS_QP_EX
  };
  uint32_t comp_mask;
  verbs_xrcd *xrcd;
};

struct verbs_cq {
  union {
    ibv_cq cq;
    ibv_cq_ex cq_ex;
  };
};

// The per-context op table. libibverbs copies every non-null entry into
// the context (verbs_set_ops); entries left null keep stubs that return
// EOPNOTSUPP. The order is the ABI: alphabetical, 76 entries.
struct verbs_context_ops {
  int (*advise_mr)(ibv_pd *, ibv_advise_mr_advice, uint32_t flags, ibv_sge *, uint32_t num_sge);
  ibv_dm *(*alloc_dm)(ibv_context *, ibv_alloc_dm_attr *);
  ibv_mw *(*alloc_mw)(ibv_pd *, ibv_mw_type);
  ibv_mr *(*alloc_null_mr)(ibv_pd *);
  ibv_pd *(*alloc_parent_domain)(ibv_context *, ibv_parent_domain_init_attr *);
  ibv_pd *(*alloc_pd)(ibv_context *);
  ibv_td *(*alloc_td)(ibv_context *, ibv_td_init_attr *);
  void (*async_event)(ibv_context *, ibv_async_event *);
  int (*attach_counters_point_flow)(ibv_counters *, ibv_counter_attach_attr *, ibv_flow *);
  int (*attach_mcast)(ibv_qp *, const ibv_gid *, uint16_t lid);
  int (*bind_mw)(ibv_qp *, ibv_mw *, ibv_mw_bind *);
  int (*close_xrcd)(ibv_xrcd *);
  void (*cq_event)(ibv_cq *);
  ibv_ah *(*create_ah)(ibv_pd *, ibv_ah_attr *);
  ibv_counters *(*create_counters)(ibv_context *, ibv_counters_init_attr *);
  ibv_cq *(*create_cq)(ibv_context *, int cqe, ibv_comp_channel *, int comp_vector);
  ibv_cq_ex *(*create_cq_ex)(ibv_context *, ibv_cq_init_attr_ex *);
  ibv_flow *(*create_flow)(ibv_qp *, ibv_flow_attr *);
  ibv_flow_action *(*create_flow_action_esp)(ibv_context *, ibv_flow_action_esp_attr *);
  ibv_qp *(*create_qp)(ibv_pd *, ibv_qp_init_attr *);
  ibv_qp *(*create_qp_ex)(ibv_context *, ibv_qp_init_attr_ex *);
  ibv_rwq_ind_table *(*create_rwq_ind_table)(ibv_context *, ibv_rwq_ind_table_init_attr *);
  ibv_srq *(*create_srq)(ibv_pd *, ibv_srq_init_attr *);
  ibv_srq *(*create_srq_ex)(ibv_context *, ibv_srq_init_attr_ex *);
  ibv_wq *(*create_wq)(ibv_context *, ibv_wq_init_attr *);
  int (*dealloc_mw)(ibv_mw *);
  int (*dealloc_pd)(ibv_pd *);
  int (*dealloc_td)(ibv_td *);
  int (*dereg_mr)(verbs_mr *);
  int (*destroy_ah)(ibv_ah *);
  int (*destroy_counters)(ibv_counters *);
  int (*destroy_cq)(ibv_cq *);
  int (*destroy_flow)(ibv_flow *);
  int (*destroy_flow_action)(ibv_flow_action *);
  int (*destroy_qp)(ibv_qp *);
  int (*destroy_rwq_ind_table)(ibv_rwq_ind_table *);
  int (*destroy_srq)(ibv_srq *);
  int (*destroy_wq)(ibv_wq *);
  int (*detach_mcast)(ibv_qp *, const ibv_gid *, uint16_t lid);
  void (*free_context)(ibv_context *);
  int (*free_dm)(ibv_dm *);
  int (*get_srq_num)(ibv_srq *, uint32_t *srq_num);
  ibv_dm *(*import_dm)(ibv_context *, uint32_t dm_handle);
  ibv_mr *(*import_mr)(ibv_pd *, uint32_t mr_handle);
  ibv_pd *(*import_pd)(ibv_context *, uint32_t pd_handle);
  int (*modify_cq)(ibv_cq *, ibv_modify_cq_attr *);
  int (*modify_flow_action_esp)(ibv_flow_action *, ibv_flow_action_esp_attr *);
  int (*modify_qp)(ibv_qp *, ibv_qp_attr *, int attr_mask);
  int (*modify_qp_rate_limit)(ibv_qp *, ibv_qp_rate_limit_attr *);
  int (*modify_srq)(ibv_srq *, ibv_srq_attr *, int attr_mask);
  int (*modify_wq)(ibv_wq *, ibv_wq_attr *);
  ibv_qp *(*open_qp)(ibv_context *, ibv_qp_open_attr *);
  ibv_xrcd *(*open_xrcd)(ibv_context *, ibv_xrcd_init_attr *);
  int (*poll_cq)(ibv_cq *, int num_entries, ibv_wc *);
  int (*post_recv)(ibv_qp *, ibv_recv_wr *, ibv_recv_wr **bad);
  int (*post_send)(ibv_qp *, ibv_send_wr *, ibv_send_wr **bad);
  int (*post_srq_ops)(ibv_srq *, ibv_ops_wr *, ibv_ops_wr **bad);
  int (*post_srq_recv)(ibv_srq *, ibv_recv_wr *, ibv_recv_wr **bad);
  int (*query_device_ex)(ibv_context *, const ibv_query_device_ex_input *, ibv_device_attr_ex *,
                         size_t attr_size);
  int (*query_ece)(ibv_qp *, ibv_ece *);
  int (*query_port)(ibv_context *, uint8_t port_num, ibv_port_attr *);
  int (*query_qp)(ibv_qp *, ibv_qp_attr *, int attr_mask, ibv_qp_init_attr *);
  int (*query_qp_data_in_order)(ibv_qp *, ibv_wr_opcode, uint32_t flags);
  int (*query_rt_values)(ibv_context *, ibv_values_ex *);
  int (*query_srq)(ibv_srq *, ibv_srq_attr *);
  int (*read_counters)(ibv_counters *, uint64_t *values, uint32_t n, uint32_t flags);
  ibv_mr *(*reg_dm_mr)(ibv_pd *, ibv_dm *, uint64_t offset, size_t length, unsigned int access);
  ibv_mr *(*reg_dmabuf_mr)(ibv_pd *, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access);
  ibv_mr *(*reg_mr)(ibv_pd *, void *addr, size_t length, uint64_t hca_va, int access);
  int (*req_notify_cq)(ibv_cq *, int solicited_only);
  int (*rereg_mr)(verbs_mr *, int flags, ibv_pd *, void *addr, size_t length, int access);
  int (*resize_cq)(ibv_cq *, int cqe);
  int (*set_ece)(ibv_qp *, ibv_ece *);
  void (*unimport_dm)(ibv_dm *);
  void (*unimport_mr)(ibv_mr *);
  void (*unimport_pd)(ibv_pd *);
};

static_assert(sizeof(verbs_match_ent) == 24);
static_assert(sizeof(verbs_sysfs_dev) == 992);
static_assert(sizeof(verbs_device_ops) == 72);
static_assert(sizeof(verbs_device) == 712);
static_assert(offsetof(verbs_device, sysfs) == 696);
static_assert(sizeof(verbs_context_ops) == 76 * sizeof(void *));
static_assert(offsetof(verbs_context_ops, poll_cq) == 53 * sizeof(void *));
static_assert(offsetof(verbs_context_ops, unimport_pd) == 75 * sizeof(void *));

// The functions libibverbs exports to providers (version IBVERBS_PRIVATE_34).
extern "C" {
void verbs_register_driver_34(const verbs_device_ops *ops);
void *_verbs_init_and_alloc_context(ibv_device *device, int cmd_fd, size_t alloc_size,
                                    verbs_context *context_offset, uint32_t driver_id);
void verbs_uninit_context(verbs_context *context);
void verbs_set_ops(verbs_context *vctx, const verbs_context_ops *ops);
}
