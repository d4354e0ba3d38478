// The on-disk contract between `usrc link add` (tools/usrc) and the provider
// (providers/usrc): where a device lives, its configuration file, and the
// counters files. Nothing here depends on libibverbs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace usrc {

// Every usrc device lives under one root, /run/usrc by default ($USRC_ROOT
// overrides it). libibverbs is pointed at <root>/sys with SYSFS_PATH.
std::string root_dir();                       // $USRC_ROOT or /run/usrc
inline std::string sysfs_dir() { return root_dir() + "/sys"; }
inline std::string ibdev_dir(const std::string &name) {
  return sysfs_dir() + "/class/infiniband/" + name;
}
// The device's counters directory (see CountersFile): one file per process.
inline std::string counters_dir(const std::string &name) {
  return root_dir() + "/counters/" + name + ".d";
}
constexpr const char *kConfigFile = "usrc.conf";   // inside ibdev_dir(name)
// XRC domains shared between processes (docs/xrc.md): one directory per
// user (0700) in this one, sticky and writable by all like /tmp.
inline std::string xrc_dir() { return root_dir() + "/xrc"; }
// Made if missing (mode 1777; `usrc link add`, or the first process that
// can); false (and *err) if it cannot be.
bool make_xrc_dir(std::string *err);

// The calling thread's network namespace: the inode of its
// /proc/thread-self/ns/net (every namespace is a file of the one nsfs, so
// the inode alone tells them apart). 0 if /proc cannot tell.
uint64_t net_namespace();

enum class LinkLayer { ib, roce };

// NIC backends: udp (kernel sockets), xdp (AF_XDP), ofi (libfabric). Their
// names (usrc.conf, `usrc link add ... backend B`) in one table.
enum class Backend : uint8_t { udp, xdp, ofi };
constexpr const char *kBackendNames[] = {"udp", "xdp", "ofi"};
constexpr const char *backend_name(Backend b) { return kBackendNames[static_cast<uint8_t>(b)]; }
std::optional<Backend> backend_of(const std::string &name);   // nullopt: no such backend

// What the provider needs to know about a device; written once by
// `usrc link add` as key=value lines into ibdev_dir(name)/usrc.conf.
struct DeviceConfig {
  std::string name;             // ibdev name, e.g. usrc0
  std::string netdev;           // bound network interface, e.g. lo
  LinkLayer link_layer = LinkLayer::ib;
  uint32_t ipv4 = 0;            // host byte order: the address the device binds
  uint32_t prefix_len = 32;
  uint16_t lid = 0;             // IB link layer: low 14 bits of ipv4 (see lid_for), or the SA's
  // The subnet administrator the port registered with (docs/sa.md):
  // `sa=ADDR:PORT` in usrc.conf. 0: none, LIDs follow lid_for.
  uint32_t sa_ip = 0;           // host byte order
  uint16_t sa_port = 0;
  uint16_t sm_lid = 0;          // the LID the SA gave itself
  uint32_t active_mtu = 1024;   // bytes: netdev MTU minus headers, capped at 4096
  uint16_t base_port = 20000;   // UDP port of process slot s is base_port + s
  // The RoCE v2 port (4791) that peers on other hosts send to, shared by
  // the address's contexts (net/roce_port.h); 0: the slot scheme alone,
  // peers send to base_port + slot (docs/design.md "Addressing").
  uint16_t roce_port = 4791;
  // The port a context receives other hosts' packets at: roce_port where
  // other hosts reach us (a UDP backend on an address outside 127/8), else
  // 0. (xdp and ofi take their own port, base_port + slot.)
  uint16_t roce_port_in_use() const {
    return backend == Backend::udp && (ipv4 >> 24) != 127 ? roce_port : 0;
  }
  uint64_t node_guid = 0;       // host byte order
  uint32_t gid_tbl_len = 1;     // the GIDs in use (indices 0 .. gid_tbl_len - 1)
  // The port's table (ibv_port_attr.gid_tbl_len): the GIDs in use, then
  // empty entries (ibv_query_gid_ex: ENODATA) up to at least this many.
  static constexpr uint32_t kMinGidTable = 16;
  uint32_t gid_table_size() const { return gid_tbl_len > kMinGidTable ? gid_tbl_len : kMinGidTable; }
  Backend backend = Backend::udp;
  std::string provider;         // ofi: libfabric provider name (empty: "udp")
  // The network namespace of the netdev (net_namespace() of `link add`,
  // which found the netdev by name in its own). The provider offers the
  // device only to processes of that namespace. 0: not recorded (a device
  // made by an older usrc): offered in every namespace, as it was then.
  uint64_t netns = 0;
  // Offered to a process of network namespace `here` (net_namespace(); 0:
  // unknown, offered).
  bool offered_in(uint64_t here) const { return !netns || !here || netns == here; }

  std::string serialize() const;
  static std::optional<DeviceConfig> parse(const std::string &text,
                                           std::string *err = nullptr);
  static std::optional<DeviceConfig> load(const std::string &name,
                                          std::string *err = nullptr);
};

// LID scheme (IB link layer) without a subnet administrator: a port's LID is the low 14 bits of its IPv4
// address, so a DLID resolves to an address in the sender's subnet with no
// subnet manager and no lookup: ip = (local_ip & ~0x3fff) | dlid.
// 0 means "this address has no valid LID".
constexpr uint16_t lid_for(uint32_t ipv4) {
  uint16_t lid = static_cast<uint16_t>(ipv4 & 0x3fffu);
  return lid;
}
constexpr uint32_t ipv4_for_lid(uint32_t local_ipv4, uint16_t dlid) {
  return (local_ipv4 & ~0x3fffu) | (dlid & 0x3fffu);
}

// QPN scheme: QPN = slot << 12 | index. The slot is a per-process number that
// picks the process's UDP port (base_port + slot), so a sender derives the
// destination port from the destination QPN. Slot 0 is never used, so QPN 0
// and 1 (the IBA's special QPs) never occur.
constexpr unsigned kQpnIndexBits = 12;
constexpr uint32_t kMaxSlots = (1u << (24 - kQpnIndexBits)) - 1;   // 4095
constexpr uint32_t kQpsPerSlot = 1u << kQpnIndexBits;              // 4096
constexpr uint32_t slot_of_qpn(uint32_t qpn) { return qpn >> kQpnIndexBits; }

// Counters: every context (each ibv_open_device of a process) counts into a
// file of its own in the device's counters directory, counters_dir(name):
// a header then an array of uint64_t. `usrc stats` sums the files. usrc(7) lists
// the counters with these doc strings (man/mangen.cpp).
#define USRC_COUNTERS(X)                                                      \
  X(tx_packets, "packets sent")                                               \
  X(rx_packets, "packets received")                                           \
  X(tx_bytes, "bytes sent (UDP payload)")                                     \
  X(rx_bytes, "bytes received (UDP payload)")                                 \
  X(retransmits, "request packets sent again")                    \
  X(timeouts, "Local ACK Timeout expiries")                                   \
  X(duplicates, "duplicate request packets received (re-ACKed)")             \
  X(seq_naks_sent, "PSN sequence error NAKs sent")                            \
  X(seq_naks_rcvd, "PSN sequence error NAKs received")                        \
  X(rnr_naks_sent, "RNR NAKs sent")                                           \
  X(rnr_naks_rcvd, "RNR NAKs received")                                       \
  X(other_naks_sent, "access/invalid-request NAKs sent")                      \
  X(other_naks_rcvd, "access/invalid-request NAKs received")                  \
  X(acks_sent, "ACK packets sent")                                            \
  X(acks_rcvd, "ACK packets received")                                        \
  X(retry_exceeded, "QPs failed with retry count exceeded")                   \
  X(rnr_retry_exceeded, "QPs failed with RNR retry count exceeded")           \
  X(malformed_drops, "packets dropped: malformed header or bad ICRC")         \
  X(unknown_qp_drops, "packets dropped: no such QP, or QP not ready")         \
  X(wrong_source_drops, "packets dropped: not from the QP's peer")            \
  X(ghost_acks, "ACKs for PSNs never sent (dropped)")                         \
  X(implied_naks, "READ/ATOMIC response gaps: resent from the gap")           \
  X(tx_errors, "packets the NIC refused to send")                             \
  X(rto_resends, "resends on the adaptive retransmission timer (before the Local ACK Timeout)") \
  X(direct_writes, "RDMA WRITEs placed directly in a same-host peer's memory") \
  X(direct_unlisted, "MRs and QPs left out of direct placement (table entry taken): peers send to them") \
  X(held, "request packets received beyond a gap, kept and taken in order once it was filled") \
  X(selective_resends, "sequence and RNR NAKs answered by resending the packet they name alone") \
  X(probes, "oldest unacknowledged packets resent alone after a short silence") \
  X(qkey_drops, "UD datagrams dropped: wrong Q_Key")                         \
  X(no_recv_drops, "UD datagrams and UC messages dropped: no receive posted") \
  X(uc_drops, "UC packets dropped: out of sequence, or their message failed a check") \
  X(xrc_forwarded, "XRC SEND packets a target handed to the process that owns their SRQ") \
  X(xrc_drops, "forwarded XRC packets dropped: malformed, for no SRQ here, or over the queue bound") \
  X(cm_sent, "CM MADs sent (rdma_cm: REQ, REP, RTU, REJ, MRA, DREQ, DREP, resends included)") \
  X(cm_rcvd, "CM MADs received by this process's connection manager") \
  X(cm_dropped, "CM MADs dropped: malformed, for no connection, or not expected in its state") \
  X(cm_forwarded, "CM MADs the device's GSI owner handed to the process they are for") \
  X(roce_forwarded, "datagrams that reached this process at the RoCE v2 port (4791) for another, handed on") \
  X(acks_again, "ACKs sent again while a requester that was resending went quiet")

enum class Counter : uint32_t {
#define USRC_X(name, doc) name,
  USRC_COUNTERS(USRC_X)
#undef USRC_X
  count
};
constexpr uint32_t kNumCounters = static_cast<uint32_t>(Counter::count);
const char *counter_name(Counter c);
const char *counter_doc(Counter c);

// The directory is sticky and writable by all (like /tmp): every user of
// the device creates files there, nobody removes another's. A context maps
// only a file it owns and no other user can write (created 0600 with
// O_EXCL, made 0644 once complete), and holds an exclusive flock on it while
// open. The file of a context that is gone (exit, kill, crash: its lock is
// free) is taken over by the next context of the same user, which counts on
// from its values: nothing counted is lost, and the directory holds no more
// files per user than that user ever had contexts at once. Readers read()
// the files (never map them) and skip any that is not a well-formed
// counters file: short, foreign, a link, a FIFO.
struct CountersFile {
  static constexpr uint64_t kMagic = 0x5553524343545031ull;   // "USRCCTP1"
  static constexpr uint64_t kMaxCount = 1024;   // more: not a counters file
  uint64_t magic;
  uint64_t count;               // number of counters that follow
  uint64_t value[kNumCounters];
};

// A context's own counters file, mapped: the engine counts into values().
class OwnCounters {
 public:
  OwnCounters() = default;
  OwnCounters(const OwnCounters &) = delete;
  OwnCounters &operator=(const OwnCounters &) = delete;
  ~OwnCounters();
  // Takes over a file of this user's that no context holds, else creates
  // one. false (and *err) if neither can be done: no counters then.
  bool open(const std::string &name, std::string *err);
  uint64_t *values() { return file_->value; }

 private:
  CountersFile *file_ = nullptr;
  int fd_ = -1;   // holds the flock
};

// The device's counters: the sum over its files, less what the last
// `usrc stats reset` set aside (out has kNumCounters entries). false (and
// *err) if the device has no counters directory.
bool read_counters(const std::string &name, uint64_t *out, std::string *err);
// Sets the present sums aside (a file .reset in the directory, trusted
// only from root or the directory's owner): later reads count from zero.
bool reset_counters(const std::string &name, std::string *err);
// `usrc link add` and `link del`: the directory, made anew (mode 1777) or
// removed with everything in it (never following a link users planted).
bool make_counters_dir(const std::string &name, std::string *err);
bool remove_counters_dir(const std::string &name, std::string *err);

}  // namespace usrc
