// SA MAD and record layouts: IBA vol. 1 13.6.2 (RMPP header), 15.2.1.1
// (SA header), 15.2.5 (records), 14.2.5 (NodeInfo, PortInfo). Offsets are
// from the start of the structure; bit fields count from the most
// significant bit of their byte.
#include "usrc/cm/sa_mad.h"

#include <algorithm>
#include <cstring>

#include "usrc/wire/hdr.h"

namespace usrc::sa {

namespace be = usrc::wire::be;

const char *rmpp_status_name(uint8_t s) {
  switch (s) {
    case kRmppOk: return "normal";
    case kRmppResources: return "resources exhausted";
    case kRmppTotalTimeTooLong: return "total time too long";
    case kRmppBadLength: return "inconsistent last segment and payload length";
    case kRmppBadFirstSegment: return "inconsistent first segment and segment number";
    case kRmppBadType: return "bad RMPPType";
    case kRmppWindowTooSmall: return "NewWindowLast too small";
    case kRmppSegmentTooBig: return "segment number too big";
    case kRmppIllegalStatus: return "illegal status";
    case kRmppBadVersion: return "unsupported version";
    case kRmppTooManyRetries: return "too many retries";
    default: return "unspecified";
  }
}

const char *to_string(SaError e) {
  switch (e) {
    case SaError::ok: return "ok";
    case SaError::too_short: return "too short";
    case SaError::not_sa: return "not an SA MAD";
    case SaError::bad_version: return "bad base or class version";
  }
  return "?";
}

void encode(const SaMad &m, uint8_t out[kMadLen]) {
  std::memset(out, 0, kMadLen);
  cm::put_hdr(m.hdr, out);
  uint8_t *r = out + kRmppHdrOff;
  r[0] = m.rmpp.version;
  r[1] = m.rmpp.type;
  r[2] = uint8_t(m.rmpp.resp_time << 3 | (m.rmpp.flags & 7));
  r[3] = m.rmpp.status;
  be::put32(r + 4, m.rmpp.seg);
  be::put32(r + 8, m.rmpp.len);
  uint8_t *s = out + kSaHdrOff;
  be::put64(s, m.sm_key);
  be::put16(s + 8, m.attr_offset);
  be::put64(s + 12, m.comp_mask);
  std::memcpy(out + kSaDataOff, m.data, kSaData);
}

SaError decode(const uint8_t *mad, size_t len, SaMad &m) {
  if (!mad || len < kMadLen) return SaError::too_short;
  if (mad[1] != kMgmtClassSa) return SaError::not_sa;
  if (mad[0] != 1 || mad[2] != kSaClassVersion) return SaError::bad_version;
  m = SaMad{};
  cm::get_hdr(mad, m.hdr);
  const uint8_t *r = mad + kRmppHdrOff;
  m.rmpp.version = r[0];
  m.rmpp.type = r[1];
  m.rmpp.resp_time = r[2] >> 3;
  m.rmpp.flags = r[2] & 7;
  m.rmpp.status = r[3];
  m.rmpp.seg = be::get32(r + 4);
  m.rmpp.len = be::get32(r + 8);
  const uint8_t *s = mad + kSaHdrOff;
  m.sm_key = be::get64(s);
  m.attr_offset = be::get16(s + 8);
  m.comp_mask = be::get64(s + 12);
  std::memcpy(m.data, mad + kSaDataOff, kSaData);
  return SaError::ok;
}

SaMad request(uint8_t method, uint16_t attr, uint64_t tid) {
  SaMad m;
  m.hdr.mgmt_class = kMgmtClassSa;
  m.hdr.class_version = kSaClassVersion;
  m.hdr.method = method;
  m.hdr.tid = tid;
  m.hdr.attr_id = attr;
  m.rmpp.version = kRmppVersion;
  return m;
}

void PathRecord::put(uint8_t *o) const {
  std::memset(o, 0, kLen);
  std::memcpy(o + 8, dgid, 16);
  std::memcpy(o + 24, sgid, 16);
  be::put16(o + 40, dlid);
  be::put16(o + 42, slid);
  be::put32(o + 44, (raw_traffic ? 1u << 31 : 0) | (flow_label & 0xfffff) << 8 | hop_limit);
  o[48] = tclass;
  o[49] = uint8_t((reversible ? 0x80 : 0) | (numb_path & 0x7f));
  be::put16(o + 50, pkey);
  be::put16(o + 52, sl & 0xf);
  o[54] = uint8_t(mtu_selector << 6 | (mtu & 0x3f));
  o[55] = uint8_t(rate_selector << 6 | (rate & 0x3f));
  o[56] = uint8_t(pkt_life_selector << 6 | (pkt_life & 0x3f));
  o[57] = preference;
}

void PathRecord::get(const uint8_t *i) {
  std::memcpy(dgid, i + 8, 16);
  std::memcpy(sgid, i + 24, 16);
  dlid = be::get16(i + 40);
  slid = be::get16(i + 42);
  const uint32_t w = be::get32(i + 44);
  raw_traffic = w >> 31;
  flow_label = (w >> 8) & 0xfffff;
  hop_limit = uint8_t(w);
  tclass = i[48];
  reversible = i[49] & 0x80;
  numb_path = i[49] & 0x7f;
  pkey = be::get16(i + 50);
  sl = be::get16(i + 52) & 0xf;
  mtu_selector = i[54] >> 6;
  mtu = i[54] & 0x3f;
  rate_selector = i[55] >> 6;
  rate = i[55] & 0x3f;
  pkt_life_selector = i[56] >> 6;
  pkt_life = i[56] & 0x3f;
  preference = i[57];
}

void NodeRecord::put(uint8_t *o) const {
  std::memset(o, 0, kLen);
  be::put16(o, lid);
  uint8_t *n = o + 4;   // NodeInfo
  n[0] = 1;             // BaseVersion
  n[1] = 1;             // ClassVersion (SMP)
  n[2] = node_type;
  n[3] = num_ports;
  be::put64(n + 4, sys_guid);
  be::put64(n + 12, node_guid);
  be::put64(n + 20, port_guid);
  be::put16(n + 28, partition_cap);
  be::put16(n + 30, device_id);
  be::put32(n + 32, revision);
  be::put32(n + 36, uint32_t(local_port) << 24 | (vendor_id & 0xffffff));
  std::memcpy(o + 44, desc, 64);
}

void NodeRecord::get(const uint8_t *i) {
  lid = be::get16(i);
  const uint8_t *n = i + 4;
  node_type = n[2];
  num_ports = n[3];
  sys_guid = be::get64(n + 4);
  node_guid = be::get64(n + 12);
  port_guid = be::get64(n + 20);
  partition_cap = be::get16(n + 28);
  device_id = be::get16(n + 30);
  revision = be::get32(n + 32);
  local_port = n[36];
  vendor_id = be::get32(n + 36) & 0xffffff;
  std::memcpy(desc, i + 44, 64);
}

std::string NodeRecord::description() const { return std::string(desc, strnlen(desc, sizeof desc)); }

void PortInfoRecord::put(uint8_t *o) const {
  std::memset(o, 0, kLen);
  be::put16(o, endport_lid);
  o[2] = port_num;
  uint8_t *p = o + 4;   // PortInfo
  be::put64(p + 8, gid_prefix);
  be::put16(p + 16, lid);
  be::put16(p + 18, sm_lid);
  be::put32(p + 20, cap_mask);
  p[28] = local_port;
  p[32] = uint8_t(state & 0xf);              // LinkSpeedSupported(4) PortState(4)
  p[33] = uint8_t(phys_state << 4);          // PortPhysicalState(4) LinkDownDefaultState(4)
  p[36] = uint8_t(neighbor_mtu << 4);        // NeighborMTU(4) MasterSMSL(4)
  p[41] = uint8_t(mtu_cap & 0xf);            // InitTypeReply(4) MTUCap(4)
  p[51] = uint8_t(subnet_timeout & 0x1f);    // ... SubnetTimeOut(5)
  p[52] = uint8_t(resp_time & 0x1f);         // reserved(3) RespTimeValue(5)
}

void PortInfoRecord::get(const uint8_t *i) {
  endport_lid = be::get16(i);
  port_num = i[2];
  const uint8_t *p = i + 4;
  gid_prefix = be::get64(p + 8);
  lid = be::get16(p + 16);
  sm_lid = be::get16(p + 18);
  cap_mask = be::get32(p + 20);
  local_port = p[28];
  state = p[32] & 0xf;
  phys_state = p[33] >> 4;
  neighbor_mtu = p[36] >> 4;
  mtu_cap = p[41] & 0xf;
  subnet_timeout = p[51] & 0x1f;
  resp_time = p[52] & 0x1f;
}

void UsrcPortRecord::put(uint8_t *o) const {
  std::memset(o, 0, kLen);
  be::put16(o, lid);
  be::put16(o + 2, sm_lid);
  be::put32(o + 4, ipv4);
  be::put64(o + 8, port_guid);
  be::put64(o + 16, node_guid);
  be::put16(o + 24, base_port);
  o[26] = mtu;
  std::memcpy(o + 32, desc, 32);
}

void UsrcPortRecord::get(const uint8_t *i) {
  lid = be::get16(i);
  sm_lid = be::get16(i + 2);
  ipv4 = be::get32(i + 4);
  port_guid = be::get64(i + 8);
  node_guid = be::get64(i + 16);
  base_port = be::get16(i + 24);
  mtu = i[26];
  std::memcpy(desc, i + 32, 32);
}

std::string UsrcPortRecord::description() const { return std::string(desc, strnlen(desc, sizeof desc)); }

void port_gid(uint64_t guid, uint8_t out[16]) {
  std::memset(out, 0, 16);
  out[0] = 0xfe;
  out[1] = 0x80;
  be::put64(out + 8, guid);
}

uint64_t guid_of_gid(const uint8_t gid[16]) {
  if (gid[0] != 0xfe || gid[1] != 0x80) return 0;
  for (int i = 2; i < 8; i++) if (gid[i]) return 0;
  return be::get64(gid + 8);
}

}  // namespace usrc::sa
