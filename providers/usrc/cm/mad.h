// Communication Management MADs (IBA vol. 1 ch. 12) and their framing as
// RoCE v2 UD datagrams to the GSI (QP1), and the RDMA IP CM service's
// header in a REQ's private data (IBA annex A11). Pure byte work: no I/O,
// no state. decode() never trusts its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace usrc::cm {

constexpr size_t kMadLen = 256;        // IBA 13.4.2: every MAD is 256 bytes
constexpr size_t kMadHdrLen = 24;      // the common MAD header (IBA 13.4.2, table 146)
constexpr uint8_t kMgmtClassCm = 0x07; // IBA 13.4.4: Communication Management
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;
constexpr uint32_t kGsiQkey = 0x80010000;   // IBA 10.2.4: QP1's well-known Q_Key

// The common MAD header (IBA 13.4.3, table 146), shared by every class
// usrc speaks (CM here, SA in sa_mad.h).
struct MadHdr {
  uint8_t base_version = 1, mgmt_class = 0, class_version = 0, method = 0;
  uint16_t status = 0, class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
};
void put_hdr(const MadHdr &h, uint8_t out[kMadHdrLen]);
void get_hdr(const uint8_t in[kMadHdrLen], MadHdr &h);

// Attribute IDs (IBA 12.6.3, table 104).
enum class Attr : uint16_t {
  req = 0x0010, mra = 0x0011, rej = 0x0012, rep = 0x0013, rtu = 0x0014,
  dreq = 0x0015, drep = 0x0016, sidr_req = 0x0017, sidr_rep = 0x0018,
  lap = 0x0019, apr = 0x001a,
};

// Private data lengths (IBA 12.6.5 - 12.6.11).
constexpr size_t kReqPrivate = 92, kRepPrivate = 196, kRejPrivate = 148,
                 kRtuPrivate = 224, kDreqPrivate = 220, kDrepPrivate = 224,
                 kMraPrivate = 222, kSidrReqPrivate = 216, kSidrRepPrivate = 136;

// SIDR REP status (IBA 12.6.10, table 113).
enum SidrStatus : uint8_t {
  kSidrValid = 0, kSidrNoService = 1, kSidrRejected = 2, kSidrNoQp = 3,
};

// REJ reasons used here (IBA 12.6.7.2, table 109).
enum RejReason : uint16_t {
  kRejNoQp = 1, kRejTimeout = 6, kRejInvalidCommId = 5, kRejInvalidServiceId = 8,
  kRejStaleConn = 10, kRejConsumer = 28,
};

// The fields usrc sends and reads; everything else goes out as zero.
struct Msg {
  Attr attr = Attr::req;
  uint64_t tid = 0;
  uint32_t local_comm = 0, remote_comm = 0;
  // REQ
  uint64_t service_id = 0;
  uint64_t ca_guid = 0;          // REQ and REP: the sender's node GUID
  uint32_t qpn = 0;              // REQ, REP: the sender's QPN; DREQ: the receiver's
  uint32_t psn = 0;              // starting PSN
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t remote_cm_timeout = 0, local_cm_timeout = 0, max_cm_retries = 0;
  uint8_t retry_count = 0, rnr_retry_count = 0;
  uint8_t mtu = 0;               // IBA MTU code (1: 256 .. 5: 4096)
  bool srq = false, flow_control = false;
  uint16_t pkey = 0xffff;
  uint16_t local_lid = 0, remote_lid = 0;
  uint8_t local_gid[16] = {}, remote_gid[16] = {};
  uint8_t hop_limit = 0, local_ack_timeout = 0;
  // REJ
  uint8_t rejected = 0;          // 0: REQ, 1: REP, 2: other (MRA's and REJ's MessageX)
  uint16_t reason = 0;
  // MRA
  uint8_t service_timeout = 0;
  // SIDR REQ (local_comm: its Request ID) and SIDR REP (remote_comm: the
  // Request ID it answers; service_id, qpn; IBA 12.11)
  uint32_t qkey = 0;
  uint8_t sidr_status = 0;
  uint8_t priv[kRtuPrivate] = {};
  uint8_t priv_len = 0;          // what is carried; decode gives the attribute's full length
};

size_t private_capacity(Attr a);   // 0 for an attribute usrc does not carry

enum class MadError { ok, too_short, not_cm, bad_version, bad_method, unknown_attr };
const char *to_string(MadError e);

// Writes the 256-byte MAD. private data beyond the attribute's capacity is cut.
void encode(const Msg &m, uint8_t out[kMadLen]);
MadError decode(const uint8_t *mad, size_t len, Msg &out);

// RoCE v2 framing: BTH (UD SEND ONLY to QP1) + DETH (GSI Q_Key, source QP1)
// + the MAD + the ICRC (left zero: the caller computes it, icrc.h).
constexpr size_t kFrameLen = 12 + 8 + kMadLen + 4;
void frame(const uint8_t mad[kMadLen], uint32_t psn, uint8_t out[kFrameLen]);
// The MAD inside a datagram to QP1, or nullptr if it is not one.
const uint8_t *unframe(const uint8_t *buf, size_t len);

// IBA annex A11 (RDMA IP CM service): the first 36 bytes of a REQ's
// private data: version, IP version, the source port and both addresses.
constexpr size_t kIpHdrLen = 36;
constexpr uint64_t kServiceIdTcp = 0x0000000001060000ull;   // + port (A11.2.1, RDMA_PS_TCP)
// The RDMA IP CM service ID of a port space (RDMA_PS_TCP 0x0106, RDMA_PS_UDP 0x0111) and port.
constexpr uint64_t service_id(uint16_t ps, uint16_t port) { return uint64_t{ps} << 16 | port; }
struct IpHdr {
  uint32_t src_ip = 0, dst_ip = 0;   // host byte order
  uint16_t src_port = 0;
};
void put_ip_hdr(const IpHdr &h, uint8_t out[kIpHdrLen]);
bool get_ip_hdr(const uint8_t in[kIpHdrLen], IpHdr &h);   // false: not IPv4 or a version usrc does not know

// Comm IDs carry the owning process's slot (docs/cm.md): slot << 20 | n.
constexpr unsigned kCommSlotShift = 20;
constexpr uint32_t slot_of_comm(uint32_t comm) { return comm >> kCommSlotShift; }

}  // namespace usrc::cm
