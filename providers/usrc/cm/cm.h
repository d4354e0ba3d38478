// The in-process connection manager behind the emulated rdma_cm character
// device (docs/cm.md). Cm executes the ucma commands librdmacm writes
// (struct rdma_ucm_cmd_hdr + command, responses written to the pointer the
// command names) and runs the IBA CM protocol (ch. 12) for RC connections:
// REQ, MRA, REP, RTU, REJ, DREQ, DREP. It does no I/O itself: MADs leave
// through a Net, arrive through on_mad(), and time passes through tick(),
// so the tests drive two of them over a fake network.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <rdma/rdma_user_cm.h>

#include "usrc/cm/mad.h"
#include "usrc/device.h"

namespace usrc::cm {

// A usrc device as the CM sees it: what address resolution, the REQ and
// INIT_QP_ATTR need.
struct Device {
  std::string name;
  uint64_t guid = 0;        // host byte order
  uint32_t ipv4 = 0;        // host byte order
  uint16_t base_port = 0;   // its GSI (QP1) listens at ipv4:base_port
  // The RoCE v2 port (net/roce_port.h) peers on other hosts send to, QP1's
  // MADs among the rest; 0: none (base_port, the slot scheme).
  uint16_t roce_port = 0;
  LinkLayer link_layer = LinkLayer::ib;
  uint8_t mtu = 3;          // IBA MTU code of the active MTU
  uint8_t sgid_index = 0;   // the GID table's entry of ::ffff:ipv4
  uint16_t lid = 0;         // InfiniBand: the port's LID (lid_for, or the SA's)
  uint32_t sa_ip = 0;       // its subnet administrator (docs/sa.md); 0: none
  uint16_t sa_port = 0;
};

class Net {
 public:
  virtual ~Net() = default;
  virtual std::vector<Device> devices() = 0;     // this network namespace's
  virtual uint32_t slot() = 0;                   // this process's CM slot (comm IDs)
  // The source address the host would use towards dst (host byte order), 0: none.
  virtual uint32_t route(uint32_t dst_ip) = 0;
  virtual void send(const Device &from, uint32_t dst_ip, const uint8_t mad[kMadLen]) = 0;
  virtual int claim_service(uint64_t sid) = 0;   // 0, or EADDRINUSE if another process listens
  virtual void release_service(uint64_t sid) = 0;
  virtual void count(const Device &d, Counter c) = 0;
  virtual uint64_t now_ns() = 0;
  virtual void timers_changed() = 0;             // next_deadline() may be earlier
  // The DLID of the path from `from` to dst_ip, asked of its SA (blocking:
  // called without the Cm's lock); 0 or an errno.
  virtual int path(const Device &from, uint32_t dst_ip, uint16_t *dlid) {
    (void)from, (void)dst_ip, (void)dlid;
    return EOPNOTSUPP;
  }
};

struct Id;

// One open of the device: its event queue. fd is what the application
// polls: readable while an event is queued (an eventfd; -1 in the tests).
struct File {
  int fd = -1;
  std::deque<rdma_ucm_event_resp> events;
  std::condition_variable cv;
  bool readable = false;      // the eventfd counts 1 (while events are queued)
  bool nonblocking = false;   // refreshed by the caller before each write
};

class Cm {
 public:
  explicit Cm(Net &net);
  ~Cm();

  std::unique_ptr<File> open(int fd);
  void close(File *f);   // destroys its ids
  // One write(2) of a command: the byte count, or -errno. by_fd finds the
  // File of another fd (MIGRATE_ID names the old one).
  ssize_t write(File *f, const void *buf, size_t len, const std::function<File *(int)> &by_fd);

  // A datagram's MAD from src_ip, received on `dev`'s GSI.
  void on_mad(const Device &dev, uint32_t src_ip, const uint8_t *mad, size_t len);
  void tick();
  uint64_t next_deadline();   // ns (Net::now_ns' clock); UINT64_MAX: none

  std::mutex &mutex() { return mu_; }

 private:
  ssize_t dispatch(File *f, const rdma_ucm_cmd_hdr &h, const uint8_t *in, size_t in_len,
                   const std::function<File *(int)> &by_fd, std::unique_lock<std::mutex> &lk);
  Id *find(uint32_t handle, File *f);
  Id *new_id(File *f, uint64_t uid);
  void destroy(Id *id, bool send_goodbye);
  void queue(Id *id, uint32_t event, int32_t status, const uint8_t *priv = nullptr,
             size_t priv_len = 0, uint64_t uid = 0, uint32_t handle = UINT32_MAX);
  void fill_conn(Id *id, rdma_ucm_conn_param &p, const uint8_t *priv, size_t priv_len);
  const Device *device_for_ip(uint32_t ip);
  int bind(Id *id, uint32_t ip, uint16_t port);
  void send(Id *id, const Msg &m, bool remember);
  void send_to(const Device &d, uint32_t dst_ip, const Msg &m);
  void arm(Id *id, uint8_t timeout_code);
  void drop(const Device &d);
  Msg base_msg(Id *id, Attr a);

  enum class Refusal { no_service, no_qp };
  Id *child(const Device &dev, uint32_t src_ip, const Msg &m, uint16_t src_port,
            uint64_t *listener_uid, const std::function<void(Refusal)> &refuse);
  void on_req(const Device &dev, uint32_t src_ip, const Msg &m);
  void on_rep(Id *id, const Msg &m);
  void on_rej(Id *id, const Msg &m);
  void on_sidr_req(const Device &dev, uint32_t src_ip, const Msg &m);
  void on_sidr_rep(Id *id, const Msg &m);
  uint32_t new_comm();
  void timewait(Id *id);
  bool first_unheard(uint32_t src_ip, uint32_t comm);
  void peer_ah(Id *id, ib_uverbs_ah_attr &ah);

  int init_qp_attr(Id *id, uint32_t state, void *resp, size_t out);

  Net &net_;
  std::mutex mu_;
  std::map<uint32_t, std::unique_ptr<Id>> ids_;     // by handle
  std::map<uint32_t, Id *> by_comm_;                // by local comm ID
  std::map<std::pair<uint32_t, uint32_t>, Id *> by_remote_;   // (peer ip, peer comm ID)
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> unheard_;   // (peer ip, comm ID): first seen
  std::map<uint64_t, Id *> listeners_;              // by service ID (port space, port)
  uint32_t next_handle_ = 0;
  uint32_t next_comm_ = 0;
  uint64_t next_tid_ = 0;
  std::vector<std::unique_ptr<Device>> devs_;
};

}  // namespace usrc::cm
