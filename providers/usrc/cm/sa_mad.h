// Subnet Administration MADs (IBA vol. 1 ch. 15) with their RMPP header
// (IBA 13.6.2) and the records usrc's SA serves. Pure byte work, as mad.h:
// no I/O, no state; decode() never trusts its input. The framing as RoCE v2
// datagrams to QP1 and the common MAD header are mad.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "usrc/cm/mad.h"

namespace usrc::sa {

using cm::kMadLen;
constexpr uint8_t kMgmtClassSa = 0x03;   // IBA 13.4.4
constexpr uint8_t kSaClassVersion = 2;

// SA methods (IBA 15.2.2, table 186).
enum Method : uint8_t {
  kGet = 0x01, kSet = 0x02, kGetResp = 0x81, kGetTable = 0x12, kGetTableResp = 0x92,
  kDelete = 0x15, kDeleteResp = 0x95,
};
constexpr uint8_t kResponseBit = 0x80;

// SA attributes (IBA 15.2.5, table 187). 0xFF10 is in the vendor-specific
// range: usrc's registration record (docs/sa.md), which has no IBA form
// because on a real fabric the SM finds the ports itself.
enum Attr : uint16_t {
  kClassPortInfo = 0x0001, kNodeRecord = 0x0011, kPortInfoRecord = 0x0012,
  kPathRecord = 0x0035, kUsrcPortRecord = 0xff10,
};

// MAD status (IBA 13.4.7, table 147; SA codes in bits 8-14, 15.2.1.1).
enum Status : uint16_t {
  kStatusOk = 0, kStatusBadVersion = 0x0004, kStatusBadMethod = 0x0008,
  kStatusBadMethodAttr = 0x000c, kStatusBadAttr = 0x001c,
  kSaNoResources = 0x0100, kSaReqInvalid = 0x0200, kSaNoRecords = 0x0300,
  kSaTooManyRecords = 0x0400, kSaInsufficientComponents = 0x0600,
};

// RMPP (IBA 13.6.2.1, table 152-153): the header at MAD byte 24.
enum RmppType : uint8_t { kRmppNone = 0, kRmppData = 1, kRmppAck = 2, kRmppStop = 3, kRmppAbort = 4 };
enum RmppFlag : uint8_t { kRmppActive = 1, kRmppFirst = 2, kRmppLast = 4 };
// RMPPStatus (IBA 13.6.2.2, table 154).
enum RmppStatus : uint8_t {
  kRmppOk = 0, kRmppResources = 1, kRmppTotalTimeTooLong = 118, kRmppBadLength = 119,
  kRmppBadFirstSegment = 120, kRmppBadType = 121, kRmppWindowTooSmall = 122,
  kRmppSegmentTooBig = 123, kRmppIllegalStatus = 124, kRmppBadVersion = 125,
  kRmppTooManyRetries = 126, kRmppUnspecified = 127,
};
const char *rmpp_status_name(uint8_t s);
constexpr uint8_t kRmppVersion = 1;
// RRespTime 0x1F: "no time value" (IBA 13.6.2.1); the SA's time is in
// ClassPortInfo.RespTimeValue.
constexpr uint8_t kNoRespTime = 0x1f;

// Layout: MAD header (24), RMPP header (12), SA header (20: SM_Key,
// AttributeOffset, reserved, ComponentMask; IBA 15.2.1.1), then 200 bytes
// of records. A multi-MAD transfer repeats the SA header in every segment,
// so each segment's RMPP payload is 220 bytes, and PayloadLength counts
// those (the first: all segments' 220 bytes less the last one's padding;
// the last: its own 20 + record bytes), as Linux's MAD layer and OpenSM do.
constexpr size_t kRmppHdrOff = 24, kSaHdrOff = 36, kSaDataOff = 56;
constexpr size_t kSaData = kMadLen - kSaDataOff;       // 200
constexpr size_t kRmppPayload = kMadLen - kSaHdrOff;   // 220
constexpr size_t kSaHdrLen = kSaDataOff - kSaHdrOff;   // 20

struct Rmpp {
  uint8_t version = 0, type = kRmppNone, resp_time = 0, flags = 0, status = 0;
  uint32_t seg = 0;       // Data1: SegmentNumber (DATA, ACK)
  uint32_t len = 0;       // Data2: PayloadLength (DATA), NewWindowLast (ACK)
  bool active() const { return flags & kRmppActive; }
};

struct SaMad {
  cm::MadHdr hdr;
  Rmpp rmpp;
  uint64_t sm_key = 0;
  uint16_t attr_offset = 0;   // 8-byte words from one record to the next
  uint64_t comp_mask = 0;
  uint8_t data[kSaData] = {};
};

enum class SaError { ok, too_short, not_sa, bad_version };
const char *to_string(SaError e);
void encode(const SaMad &m, uint8_t out[kMadLen]);
SaError decode(const uint8_t *mad, size_t len, SaMad &out);
// A request of this class and method (the header usrc's requests carry).
SaMad request(uint8_t method, uint16_t attr, uint64_t tid);

// The records. Each knows its length on the wire and its AttributeOffset
// (the length rounded up to 8-byte words, IBA 15.2.1.1).
constexpr uint16_t words_for(size_t len) { return static_cast<uint16_t>((len + 7) / 8); }

// PathRecord (IBA 15.2.5.16, table 207), 64 bytes. Component mask bits
// (Linux ib_sa.h names them the same way).
struct PathRecord {
  static constexpr size_t kLen = 64;
  enum Comp : uint64_t {
    kDgid = 1ull << 2, kSgid = 1ull << 3, kDlid = 1ull << 4, kSlid = 1ull << 5,
    kReversible = 1ull << 11, kNumbPath = 1ull << 12, kPkey = 1ull << 13, kSl = 1ull << 15,
    kMtuSelector = 1ull << 16, kMtu = 1ull << 17,
  };
  uint8_t dgid[16] = {}, sgid[16] = {};
  uint16_t dlid = 0, slid = 0;
  bool raw_traffic = false;
  uint32_t flow_label = 0;
  uint8_t hop_limit = 0, tclass = 0;
  bool reversible = false;
  uint8_t numb_path = 0;
  uint16_t pkey = 0xffff;
  uint8_t sl = 0, mtu_selector = 0, mtu = 0, rate_selector = 0, rate = 0;
  uint8_t pkt_life_selector = 0, pkt_life = 0, preference = 0;
  void put(uint8_t *out) const;
  void get(const uint8_t *in);
};

// NodeInfo (IBA 14.2.5.3, 40 bytes) inside a NodeRecord (15.2.5.2, 108).
struct NodeRecord {
  static constexpr size_t kLen = 108;
  enum Comp : uint64_t { kLid = 1ull << 0, kNodeType = 1ull << 4, kNodeGuid = 1ull << 7, kPortGuid = 1ull << 8 };
  uint16_t lid = 0;
  uint8_t node_type = 1;   // channel adapter
  uint8_t num_ports = 1;
  uint64_t sys_guid = 0, node_guid = 0, port_guid = 0;
  uint16_t partition_cap = 1, device_id = 0x5553;
  uint32_t revision = 0;
  uint8_t local_port = 1;
  uint32_t vendor_id = 0x025553;
  char desc[64] = {};      // NodeDescription: UTF-8, not terminated when full
  void put(uint8_t *out) const;
  void get(const uint8_t *in);
  std::string description() const;
};

// PortInfo (IBA 14.2.5.6, 64 bytes, the fields usrc fills) inside a
// PortInfoRecord (15.2.5.3, 68).
struct PortInfoRecord {
  static constexpr size_t kLen = 68;
  enum Comp : uint64_t { kLid = 1ull << 0, kPortNum = 1ull << 1, kBaseLid = 1ull << 5, kSmLid = 1ull << 6 };
  uint16_t endport_lid = 0;
  uint8_t port_num = 1;
  uint64_t gid_prefix = 0xfe80000000000000ull;
  uint16_t lid = 0, sm_lid = 0;
  uint32_t cap_mask = 0;
  uint8_t local_port = 1, state = 4 /* Active */, phys_state = 5 /* LinkUp */;
  uint8_t mtu_cap = 0, neighbor_mtu = 0;
  uint8_t subnet_timeout = 0, resp_time = 0;
  void put(uint8_t *out) const;
  void get(const uint8_t *in);
};

// usrc's registration record (vendor attribute 0xFF10), 64 bytes: what a
// port tells the SA (its GUIDs, address, UDP base port, name) and what the
// SA gives back (its LID and the SM's). It also answers LID -> address.
struct UsrcPortRecord {
  static constexpr size_t kLen = 64;
  enum Comp : uint64_t { kLid = 1ull << 0, kPortGuid = 1ull << 2, kIpv4 = 1ull << 3 };
  uint16_t lid = 0, sm_lid = 0;
  uint32_t ipv4 = 0;          // host byte order
  uint64_t port_guid = 0, node_guid = 0;
  uint16_t base_port = 0;
  uint8_t mtu = 0;            // IBA MTU code
  char desc[32] = {};
  void put(uint8_t *out) const;
  void get(const uint8_t *in);
  std::string description() const;
};

// The IB port GID of a port GUID: fe80::/64 and the GUID (IBA 4.1.1).
void port_gid(uint64_t guid, uint8_t out[16]);
// The GUID of such a GID, or 0 if it is not a link-local port GID.
uint64_t guid_of_gid(const uint8_t gid[16]);

}  // namespace usrc::sa
