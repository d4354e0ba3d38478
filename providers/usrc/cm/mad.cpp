// CM MAD layouts: IBA vol. 1 12.6 (tables 106-113). Offsets below are from
// the start of the attribute data (after the 24-byte MAD header); bit
// fields are counted from the most significant bit of their byte.
#include "usrc/cm/mad.h"

#include <algorithm>

#include "usrc/wire/hdr.h"

namespace usrc::cm {

namespace be = usrc::wire::be;

namespace {

constexpr uint8_t kUdSendOnly = 0x64;   // IBA 9.2, table 38

uint32_t get24(const uint8_t *p) { return be::get32(p) >> 8; }
// A 24-bit field followed by a byte that belongs to another field.
void put24(uint8_t *p, uint32_t v) {
  p[0] = uint8_t(v >> 16);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v);
}

size_t private_offset(Attr a) {
  switch (a) {
    case Attr::req: return 140;
    case Attr::mra: return 10;
    case Attr::rej: return 84;
    case Attr::rep: return 36;
    case Attr::rtu: return 8;
    case Attr::dreq: return 12;
    case Attr::drep: return 8;
    case Attr::sidr_req: return 16;
    case Attr::sidr_rep: return 96;
    default: return 0;
  }
}

}  // namespace

size_t private_capacity(Attr a) {
  switch (a) {
    case Attr::req: return kReqPrivate;
    case Attr::mra: return kMraPrivate;
    case Attr::rej: return kRejPrivate;
    case Attr::rep: return kRepPrivate;
    case Attr::rtu: return kRtuPrivate;
    case Attr::dreq: return kDreqPrivate;
    case Attr::drep: return kDrepPrivate;
    case Attr::sidr_req: return kSidrReqPrivate;
    case Attr::sidr_rep: return kSidrRepPrivate;
    default: return 0;
  }
}

const char *to_string(MadError e) {
  switch (e) {
    case MadError::ok: return "ok";
    case MadError::too_short: return "too short";
    case MadError::not_cm: return "not a CM MAD";
    case MadError::bad_version: return "bad base or class version";
    case MadError::bad_method: return "not a Send";
    case MadError::unknown_attr: return "attribute not handled";
  }
  return "?";
}

void put_hdr(const MadHdr &h, uint8_t out[kMadHdrLen]) {
  out[0] = h.base_version;
  out[1] = h.mgmt_class;
  out[2] = h.class_version;
  out[3] = h.method;
  be::put16(out + 4, h.status);
  be::put16(out + 6, h.class_specific);
  be::put64(out + 8, h.tid);
  be::put16(out + 16, h.attr_id);
  be::put16(out + 18, 0);
  be::put32(out + 20, h.attr_mod);
}

void get_hdr(const uint8_t in[kMadHdrLen], MadHdr &h) {
  h.base_version = in[0];
  h.mgmt_class = in[1];
  h.class_version = in[2];
  h.method = in[3];
  h.status = be::get16(in + 4);
  h.class_specific = be::get16(in + 6);
  h.tid = be::get64(in + 8);
  h.attr_id = be::get16(in + 16);
  h.attr_mod = be::get32(in + 20);
}

void encode(const Msg &m, uint8_t out[kMadLen]) {
  std::memset(out, 0, kMadLen);
  put_hdr({1, kMgmtClassCm, kCmClassVersion, kMethodSend, 0, 0, m.tid, static_cast<uint16_t>(m.attr), 0}, out);
  uint8_t *d = out + kMadHdrLen;
  be::put32(d, m.local_comm);
  switch (m.attr) {
    case Attr::req:
      be::put64(d + 8, m.service_id);
      be::put64(d + 16, m.ca_guid);
      put24(d + 32, m.qpn);
      d[35] = m.responder_resources;
      d[39] = m.initiator_depth;
      // Remote CM Response Timeout(5) Transport Service Type(2: RC = 0) E2E flow control(1)
      d[43] = uint8_t(m.remote_cm_timeout << 3 | (m.flow_control ? 1 : 0));
      put24(d + 44, m.psn);
      d[47] = uint8_t(m.local_cm_timeout << 3 | (m.retry_count & 7));
      be::put16(d + 48, m.pkey);
      d[50] = uint8_t(m.mtu << 4 | (m.rnr_retry_count & 7));
      d[51] = uint8_t(m.max_cm_retries << 4 | (m.srq ? 0x08 : 0));
      be::put16(d + 52, m.local_lid);
      be::put16(d + 54, m.remote_lid);
      std::memcpy(d + 56, m.local_gid, 16);
      std::memcpy(d + 72, m.remote_gid, 16);
      d[93] = m.hop_limit;
      d[94] = 0x08;   // SL 0, subnet local
      d[95] = uint8_t(m.local_ack_timeout << 3);
      break;
    case Attr::rep:
      be::put32(d + 4, m.remote_comm);
      put24(d + 12, m.qpn);
      put24(d + 20, m.psn);
      d[24] = m.responder_resources;
      d[25] = m.initiator_depth;
      d[26] = uint8_t(m.flow_control ? 1 : 0);
      d[27] = uint8_t((m.rnr_retry_count & 7) << 5 | (m.srq ? 0x10 : 0));
      be::put64(d + 28, m.ca_guid);
      break;
    case Attr::rej:
      be::put32(d + 4, m.remote_comm);
      d[8] = uint8_t(m.rejected << 6);
      be::put16(d + 10, m.reason);
      break;
    case Attr::mra:
      be::put32(d + 4, m.remote_comm);
      d[8] = uint8_t(m.rejected << 6);
      d[9] = uint8_t(m.service_timeout << 3);
      break;
    case Attr::dreq:
      be::put32(d + 4, m.remote_comm);
      put24(d + 8, m.qpn);
      break;
    case Attr::rtu:
    case Attr::drep:
      be::put32(d + 4, m.remote_comm);
      break;
    case Attr::sidr_req:   // Request ID, P_Key, ServiceID (table 112)
      be::put16(d + 4, m.pkey);
      be::put64(d + 8, m.service_id);
      break;
    case Attr::sidr_rep:   // Request ID, Status, QPN, ServiceID, Q_Key (table 113)
      be::put32(d, m.remote_comm);
      d[4] = m.sidr_status;
      put24(d + 8, m.qpn);
      be::put64(d + 12, m.service_id);
      be::put32(d + 20, m.qkey);
      break;
    default:
      break;
  }
  if (size_t off = private_offset(m.attr)) {
    std::memcpy(d + off, m.priv, std::min<size_t>(m.priv_len, private_capacity(m.attr)));
  }
}

MadError decode(const uint8_t *mad, size_t len, Msg &m) {
  if (len < kMadLen) return MadError::too_short;
  if (mad[1] != kMgmtClassCm) return MadError::not_cm;
  if (mad[0] != 1 || mad[2] != kCmClassVersion) return MadError::bad_version;
  if (mad[3] != kMethodSend) return MadError::bad_method;
  m = Msg{};
  m.attr = static_cast<Attr>(be::get16(mad + 16));
  m.tid = be::get64(mad + 8);
  const size_t off = private_offset(m.attr);
  if (off == 0) return MadError::unknown_attr;
  const uint8_t *d = mad + kMadHdrLen;
  m.local_comm = be::get32(d);
  switch (m.attr) {
    case Attr::req:
      m.service_id = be::get64(d + 8);
      m.ca_guid = be::get64(d + 16);
      m.qpn = get24(d + 32);
      m.responder_resources = d[35];
      m.initiator_depth = d[39];
      m.remote_cm_timeout = d[43] >> 3;
      m.flow_control = d[43] & 1;
      m.psn = get24(d + 44);
      m.local_cm_timeout = d[47] >> 3;
      m.retry_count = d[47] & 7;
      m.pkey = be::get16(d + 48);
      m.mtu = d[50] >> 4;
      m.rnr_retry_count = d[50] & 7;
      m.max_cm_retries = d[51] >> 4;
      m.srq = d[51] & 0x08;
      m.local_lid = be::get16(d + 52);
      m.remote_lid = be::get16(d + 54);
      std::memcpy(m.local_gid, d + 56, 16);
      std::memcpy(m.remote_gid, d + 72, 16);
      m.hop_limit = d[93];
      m.local_ack_timeout = d[95] >> 3;
      break;
    case Attr::rep:
      m.remote_comm = be::get32(d + 4);
      m.qpn = get24(d + 12);
      m.psn = get24(d + 20);
      m.responder_resources = d[24];
      m.initiator_depth = d[25];
      m.flow_control = d[26] & 1;
      m.rnr_retry_count = d[27] >> 5;
      m.srq = d[27] & 0x10;
      m.ca_guid = be::get64(d + 28);
      break;
    case Attr::rej:
      m.remote_comm = be::get32(d + 4);
      m.rejected = d[8] >> 6;
      m.reason = be::get16(d + 10);
      break;
    case Attr::mra:
      m.remote_comm = be::get32(d + 4);
      m.rejected = d[8] >> 6;
      m.service_timeout = d[9] >> 3;
      break;
    case Attr::dreq:
      m.remote_comm = be::get32(d + 4);
      m.qpn = get24(d + 8);
      break;
    case Attr::sidr_req:
      m.pkey = be::get16(d + 4);
      m.service_id = be::get64(d + 8);
      break;
    case Attr::sidr_rep:
      m.local_comm = 0;
      m.remote_comm = be::get32(d);
      m.sidr_status = d[4];
      m.qpn = get24(d + 8);
      m.service_id = be::get64(d + 12);
      m.qkey = be::get32(d + 20);
      break;
    default:   // RTU, DREP
      m.remote_comm = be::get32(d + 4);
      break;
  }
  m.priv_len = static_cast<uint8_t>(private_capacity(m.attr));
  std::memcpy(m.priv, d + off, m.priv_len);
  return MadError::ok;
}

void frame(const uint8_t mad[kMadLen], uint32_t psn, uint8_t out[kFrameLen]) {
  std::memset(out, 0, kFrameLen);
  out[0] = kUdSendOnly;
  be::put16(out + 2, 0xffff);   // default P_Key
  be::put32(out + 4, 1);        // destination QP1
  be::put32(out + 8, psn & 0xffffff);
  be::put32(out + 12, kGsiQkey);
  be::put32(out + 16, 1);       // source QP1
  std::memcpy(out + 20, mad, kMadLen);
}

const uint8_t *unframe(const uint8_t *buf, size_t len) {
  if (len < kFrameLen || buf[0] != kUdSendOnly || (buf[1] & 0x3f) != 0) return nullptr;
  if ((be::get32(buf + 4) & 0xffffff) != 1 || be::get32(buf + 12) != kGsiQkey) return nullptr;
  return buf + 20;
}

void put_ip_hdr(const IpHdr &h, uint8_t out[kIpHdrLen]) {
  std::memset(out, 0, kIpHdrLen);
  out[0] = 0x00;        // CM service major/minor version 0.0
  out[1] = 4 << 4;      // IP version 4
  be::put16(out + 2, h.src_port);
  be::put32(out + 16, h.src_ip);   // IPv4: the last 4 bytes of each 16-byte address
  be::put32(out + 32, h.dst_ip);
}

bool get_ip_hdr(const uint8_t in[kIpHdrLen], IpHdr &h) {
  if (in[0] != 0 || (in[1] >> 4) != 4) return false;
  h.src_port = be::get16(in + 2);
  h.src_ip = be::get32(in + 16);
  h.dst_ip = be::get32(in + 32);
  return true;
}

}  // namespace usrc::cm
