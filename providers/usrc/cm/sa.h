// usrc's subnet administrator and its requester (docs/sa.md). Server and
// Requester are state machines over MADs and the time, as rmpp.h's: the
// daemon (`usrc sa`) and the tests drive them, the first over UDP
// (MadSocket), the second over net/sim.cpp. Client is the blocking
// requester of the CLI and the provider: one UDP socket, one query at a
// time.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "usrc/cm/rmpp.h"
#include "usrc/net/nic.h"

namespace usrc::sa {

using net::Endpoint;

// What the SA knows of a registered port.
struct Port {
  uint16_t lid = 0;
  uint64_t port_guid = 0, node_guid = 0;
  uint32_t ipv4 = 0;
  uint16_t base_port = 0;
  uint8_t mtu = 3;   // IBA MTU code (3: 1024)
  std::string desc;
};

constexpr uint16_t kSmLid = 1;            // the SA's own LID; ports get 2 and up
constexpr uint16_t kMaxUnicastLid = 0xbfff;   // IBA 4.1.3: unicast LIDs 0x0001-0xBFFF
constexpr uint8_t kRespTimeValue = 16;    // ClassPortInfo.RespTimeValue: 4.096us * 2^16 = 268 ms
constexpr size_t kMaxTransfers = 256;     // RMPP transfers in progress at once
// Records in one GetTable answer (all PathRecords of a large subnet would
// be billions): beyond, ERR_NO_RESOURCES.
constexpr size_t kMaxTableRecords = 65536;

class Server {
 public:
  explicit Server(const RmppTimers &t) : t_(t) {}
  using Out = std::vector<std::pair<Endpoint, SaMad>>;
  // A MAD from `from` (already unframed).
  void on_mad(Endpoint from, const uint8_t *mad, size_t len, uint64_t now, Out &out);
  void tick(uint64_t now, Out &out);
  uint64_t deadline() const;

  const std::map<uint16_t, Port> &ports() const { return ports_; }
  // The registrations as text (one port a line) and back, so that LIDs
  // survive a restart of the daemon.
  std::string save() const;
  bool load(const std::string &text, std::string *err);

  struct Stats {
    uint64_t rcvd = 0, sent = 0, malformed = 0, unexpected = 0, duplicates = 0;
    uint64_t gets = 0, get_tables = 0, sets = 0, errors = 0;
    uint64_t transfers = 0, transfers_done = 0, transfers_aborted = 0;
    RmppStats rmpp;
  } stats;

 private:
  struct Transfer {
    Endpoint to;
    RmppSender tx;
  };
  void answer(Endpoint from, const SaMad &req, uint64_t now, Out &out);
  void reply(Endpoint to, SaMad m, uint16_t status, Out &out);
  // The records of `attr` that `req` selects (component mask), one after
  // another, at most limit + 1 of them; *rec_len their length on the wire.
  std::vector<std::vector<uint8_t>> select(const SaMad &req, size_t *rec_len, size_t limit) const;
  uint16_t register_port(const UsrcPortRecord &r);
  void finish(Transfer &x);

  RmppTimers t_;
  std::map<uint16_t, Port> ports_;                 // by LID
  std::map<std::pair<uint64_t, uint64_t>, Transfer> transfers_;   // by (peer, TID)
};

// A requester: sends a request, resends it on the Response Timeout,
// receives an RMPP response with an RmppReceiver, keeps a finished
// transfer a while to re-ACK a lost last ACK.
class Requester {
 public:
  explicit Requester(const RmppTimers &t) : t_(t) {}
  using Out = std::vector<SaMad>;
  void submit(const SaMad &req, uint64_t now, Out &out);
  void on_mad(const uint8_t *mad, size_t len, uint64_t now, Out &out);
  void tick(uint64_t now, Out &out);
  uint64_t deadline() const;

  struct Result {
    int err = 0;             // 0, ETIMEDOUT (no answer), ECONNABORTED (RMPP abort)
    uint16_t status = 0;     // the response's MAD status
    uint8_t rmpp_status = 0; // an abort's RMPPStatus
    SaMad first;             // the (first) response MAD
    std::vector<uint8_t> payload;   // the records
  };
  // The result of a finished transaction (once).
  std::optional<Result> take(uint64_t tid);
  bool finished(uint64_t tid) const;

  struct Stats {
    uint64_t sent = 0, rcvd = 0, resent = 0, malformed = 0, unexpected = 0;
    RmppStats rmpp;
  } stats;

 private:
  struct Txn {
    SaMad req;
    uint64_t deadline = 0;
    unsigned retries = 0;
    std::optional<RmppReceiver> rx;
    std::optional<Result> result;
    bool taken = false;
    uint64_t linger_until = 0;
  };
  void finish(Txn &x, Result r, uint64_t now);
  RmppTimers t_;
  std::map<uint64_t, Txn> txns_;
};

// The records of a result, each `attr_offset` 8-byte words apart.
std::vector<const uint8_t *> records(const Requester::Result &r, size_t rec_len);

// A UDP socket that carries MADs to and from QP1 (cm/mad.h framing and the
// ICRC). Bound to one address, which the ICRC needs.
class MadSocket {
 public:
  MadSocket() = default;
  MadSocket(const MadSocket &) = delete;
  MadSocket &operator=(const MadSocket &) = delete;
  ~MadSocket();
  // ip 0: the address the kernel would send to `toward` from.
  bool open(uint32_t ip, uint16_t port, Endpoint toward, std::string *err);
  int fd() const { return fd_; }
  Endpoint local() const { return local_; }
  bool send(const SaMad &m, Endpoint to);
  // The MAD of one datagram, or nullptr (none waiting: *len = 0; a bad
  // one, counted in drops: *len = 1).
  const uint8_t *recv(Endpoint *from, size_t *len);
  uint64_t drops = 0;

 private:
  int fd_ = -1;
  Endpoint local_;
  uint32_t psn_ = 0;
  uint8_t buf_[2048];
};

uint64_t mono_ns();

// The blocking requester: `usrc sa query`, `usrc link add ... sa`, the
// provider's LID resolution.
class Client {
 public:
  Client(Endpoint sa, const RmppTimers &t) : sa_(sa), req_(t) {}
  // local_ip 0: whichever the route to the SA gives.
  bool open(uint32_t local_ip, std::string *err);
  // Sends `req` (its TID is replaced) and waits for the answer or the end
  // of the retries; false only if nothing could be sent.
  bool query(SaMad req, Requester::Result &out);
  const Requester::Stats &stats() const { return req_.stats; }

 private:
  Endpoint sa_;
  Requester req_;
  MadSocket sock_;
  uint64_t tid_ = 0;
};

// A DLID's address when the port has an SA (docs/sa.md): a SubnAdmGet of
// the UsrcPortRecord with that LID, cached by the process for a minute.
// For create_ah and modify to RTR, never a packet. 0, or EINVAL (no port
// has that LID), ETIMEDOUT (the SA did not answer), or a socket's errno.
int resolve_lid(Endpoint sa, uint32_t local_ip, uint16_t lid, uint32_t *ip);
constexpr uint64_t kLidCacheNs = 60'000'000'000ull;
// Every registered port's LID by address (a SubnAdmGetTable of
// UsrcPortRecords, RMPP), added to *out; 0 or as resolve_lid. Seeds
// resolve_lid's cache too.
int port_lids(Endpoint sa, uint32_t local_ip, std::unordered_map<uint32_t, uint16_t> *out);

// The path from the port with LID slid to the port at dst_ip (host order),
// as rdma_resolve_route asks for it on the InfiniBand link layer: the
// destination's LID from its UsrcPortRecord (by address), then a
// SubnAdmGet of the PathRecord between the two LIDs. 0, or as resolve_lid.
int path_to(Endpoint sa, uint32_t local_ip, uint16_t slid, uint32_t dst_ip, PathRecord *out);

// "ADDR[:PORT]" with the default port; false if it is not an IPv4 address.
constexpr uint16_t kDefaultPort = 4791;
bool parse_endpoint(const std::string &s, Endpoint *e);
std::string to_string(Endpoint e);

}  // namespace usrc::sa
