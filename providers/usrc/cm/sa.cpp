// The SA's answers (IBA vol. 1 15.2-15.4), the requester, and their UDP
// carrier. docs/sa.md.
#include "usrc/cm/sa.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>

#include "usrc/wire/hdr.h"
#include "usrc/wire/icrc.h"

namespace usrc::sa {

namespace {

uint64_t peer_key(Endpoint e) { return uint64_t(e.ip) << 16 | e.port; }

// IBA MTU code to bytes and back.
uint8_t min_mtu(uint8_t a, uint8_t b) { return std::min(a ? a : b, b ? b : a); }

// ClassPortInfo (IBA 13.4.8.1, 72 bytes): the fields a requester reads.
constexpr size_t kClassPortInfoLen = 72;

}  // namespace

uint64_t mono_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// ---- Server ----

uint64_t Server::deadline() const {
  uint64_t d = UINT64_MAX;
  for (auto &[k, x] : transfers_) d = std::min(d, x.tx.deadline());
  return d;
}

void Server::reply(Endpoint to, SaMad m, uint16_t status, Out &out) {
  // IBA 15.2.2: Get and Set are answered by GetResp, Delete by DeleteResp.
  if (m.hdr.method == kSet || m.hdr.method == kGet) m.hdr.method = kGetResp;
  else m.hdr.method = uint8_t(m.hdr.method | kResponseBit);
  m.hdr.status = status;
  m.rmpp = Rmpp{kRmppVersion, kRmppNone, 0, 0, 0, 0, 0};
  if (status) {
    m.attr_offset = 0;
    std::memset(m.data, 0, kSaData);
    stats.errors++;
  }
  out.emplace_back(to, m);
}

void Server::on_mad(Endpoint from, const uint8_t *mad, size_t len, uint64_t now, Out &out) {
  stats.rcvd++;
  SaMad m;
  const SaError e = decode(mad, len, m);
  if (e == SaError::bad_version && len >= kMadLen && mad[1] == kMgmtClassSa && !(mad[3] & kResponseBit)) {
    // IBA 13.4.7: a class version the agent does not speak is answered.
    SaMad r;
    cm::get_hdr(mad, r.hdr);
    r.hdr.class_version = kSaClassVersion;
    return reply(from, r, kStatusBadVersion, out);
  }
  if (e != SaError::ok) {
    stats.malformed++;
    return;
  }
  // RMPP control from a requester: ACK, STOP, ABORT of a transfer.
  if (m.rmpp.active() && m.rmpp.type != kRmppData) {
    auto it = transfers_.find({peer_key(from), m.hdr.tid});
    if (it == transfers_.end() || !(it->second.to == from)) {
      stats.unexpected++;   // a transfer that is over, or never was
      return;
    }
    std::vector<SaMad> o;
    it->second.tx.on_mad(m, now, o);
    for (auto &s : o) out.emplace_back(from, s);
    if (it->second.tx.state() != RmppSender::State::sending) {
      finish(it->second);
      transfers_.erase(it);
    }
    return;
  }
  if (m.hdr.method & kResponseBit) {
    stats.unexpected++;   // the SA sends responses, it does not take them
    return;
  }
  // A multi-MAD request (SubnAdmConfig): usrc takes none. IBA 13.6.3.3:
  // a receiver that cannot take the transfer STOPs it.
  if (m.rmpp.active() && (m.rmpp.flags & (kRmppFirst | kRmppLast)) != (kRmppFirst | kRmppLast)) {
    SaMad s = m;
    s.rmpp = Rmpp{kRmppVersion, kRmppStop, kNoRespTime, kRmppActive, kRmppResources, 0, 0};
    out.emplace_back(from, s);
    stats.errors++;
    return;
  }
  if (transfers_.count({peer_key(from), m.hdr.tid})) {
    stats.duplicates++;   // a resent request while its answer is under way
    return;
  }
  answer(from, m, now, out);
}

void Server::finish(Transfer &x) {
  const RmppStats &s = x.tx.stats;
  stats.rmpp.segments_sent += s.segments_sent;
  stats.rmpp.segments_resent += s.segments_resent;
  stats.rmpp.acks_rcvd += s.acks_rcvd;
  stats.rmpp.timeouts += s.timeouts;
  stats.rmpp.duplicates += s.duplicates;
  stats.rmpp.malformed += s.malformed;
  stats.rmpp.aborts_sent += s.aborts_sent;
  stats.rmpp.aborts_rcvd += s.aborts_rcvd;
  if (x.tx.state() == RmppSender::State::done) stats.transfers_done++;
  else stats.transfers_aborted++;
}

void Server::tick(uint64_t now, Out &out) {
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    std::vector<SaMad> o;
    it->second.tx.tick(now, o);
    for (auto &s : o) out.emplace_back(it->second.to, s);
    if (it->second.tx.state() != RmppSender::State::sending) {
      finish(it->second);
      it = transfers_.erase(it);
    } else {
      ++it;
    }
  }
}

uint16_t Server::register_port(const UsrcPortRecord &r) {
  for (auto &[lid, p] : ports_) {
    if (p.port_guid == r.port_guid) {
      p.node_guid = r.node_guid;
      p.ipv4 = r.ipv4;
      p.base_port = r.base_port;
      p.mtu = r.mtu;
      p.desc = r.description();
      return lid;
    }
  }
  // The lowest free LID: LIDs of ports that left are taken again.
  uint16_t lid = kSmLid + 1;
  for (auto &[l, p] : ports_) {
    if (l != lid) break;
    lid++;
  }
  if (lid > kMaxUnicastLid) return 0;
  ports_[lid] = Port{lid, r.port_guid, r.node_guid, r.ipv4, r.base_port, r.mtu, r.description()};
  return lid;
}

std::vector<std::vector<uint8_t>> Server::select(const SaMad &req, size_t *rec_len, size_t limit) const {
  std::vector<std::vector<uint8_t>> recs;
  const uint64_t cm = req.comp_mask;
  // False once there are more than `limit`: the caller needs to know no more.
  auto add = [&](auto &rec) {
    std::vector<uint8_t> b(rec.kLen);
    rec.put(b.data());
    recs.push_back(std::move(b));
    return recs.size() <= limit;
  };
  switch (req.hdr.attr_id) {
    case kNodeRecord: {
      *rec_len = NodeRecord::kLen;
      NodeRecord q;
      q.get(req.data);
      for (auto &[lid, p] : ports_) {
        if ((cm & NodeRecord::kLid) && q.lid != lid) continue;
        if ((cm & NodeRecord::kNodeGuid) && q.node_guid != p.node_guid) continue;
        if ((cm & NodeRecord::kPortGuid) && q.port_guid != p.port_guid) continue;
        if ((cm & NodeRecord::kNodeType) && q.node_type != 1) continue;
        NodeRecord r;
        r.lid = lid;
        r.sys_guid = r.node_guid = p.node_guid;
        r.port_guid = p.port_guid;
        std::snprintf(r.desc, sizeof r.desc, "%s", p.desc.c_str());
        if (!add(r)) return recs;
      }
      break;
    }
    case kPortInfoRecord: {
      *rec_len = PortInfoRecord::kLen;
      PortInfoRecord q;
      q.get(req.data);
      for (auto &[lid, p] : ports_) {
        if ((cm & PortInfoRecord::kLid) && q.endport_lid != lid) continue;
        if ((cm & PortInfoRecord::kPortNum) && q.port_num != 1) continue;
        if ((cm & PortInfoRecord::kBaseLid) && q.lid != lid) continue;
        if ((cm & PortInfoRecord::kSmLid) && q.sm_lid != kSmLid) continue;
        PortInfoRecord r;
        r.endport_lid = r.lid = lid;
        r.sm_lid = kSmLid;
        r.mtu_cap = r.neighbor_mtu = p.mtu;
        r.resp_time = kRespTimeValue;
        if (!add(r)) return recs;
      }
      break;
    }
    case kPathRecord: {
      *rec_len = PathRecord::kLen;
      PathRecord q;
      q.get(req.data);
      const uint64_t sguid = guid_of_gid(q.sgid), dguid = guid_of_gid(q.dgid);
      for (auto &[slid, s] : ports_) {
        if ((cm & PathRecord::kSlid) && q.slid != slid) continue;
        if ((cm & PathRecord::kSgid) && sguid != s.port_guid) continue;
        for (auto &[dlid, d] : ports_) {
          if ((cm & PathRecord::kDlid) && q.dlid != dlid) continue;
          if ((cm & PathRecord::kDgid) && dguid != d.port_guid) continue;
          if ((cm & PathRecord::kPkey) && (q.pkey & 0x7fff) != 0x7fff) continue;
          if ((cm & PathRecord::kSl) && q.sl != 0) continue;
          const uint8_t mtu = min_mtu(s.mtu, d.mtu);
          if ((cm & PathRecord::kMtu) && (cm & PathRecord::kMtuSelector)) {
            // Selector (IBA 15.2.5.16): 0 greater than, 1 less than, 2 exactly, 3 largest.
            if ((q.mtu_selector == 0 && !(mtu > q.mtu)) || (q.mtu_selector == 1 && !(mtu < q.mtu)) ||
                (q.mtu_selector == 2 && mtu != q.mtu))
              continue;
          }
          PathRecord r;
          port_gid(d.port_guid, r.dgid);
          port_gid(s.port_guid, r.sgid);
          r.dlid = dlid;
          r.slid = slid;
          r.reversible = true;
          r.numb_path = 1;
          r.pkey = 0xffff;
          r.mtu_selector = 2;
          r.mtu = mtu;
          r.rate_selector = 2;
          r.rate = 3;   // 10 Gb/s: a UDP path has no rate of its own
          r.pkt_life_selector = 2;
          r.pkt_life = 14;
          if (!add(r)) return recs;
        }
      }
      break;
    }
    case kUsrcPortRecord: {
      *rec_len = UsrcPortRecord::kLen;
      UsrcPortRecord q;
      q.get(req.data);
      for (auto &[lid, p] : ports_) {
        if ((cm & UsrcPortRecord::kLid) && q.lid != lid) continue;
        if ((cm & UsrcPortRecord::kPortGuid) && q.port_guid != p.port_guid) continue;
        if ((cm & UsrcPortRecord::kIpv4) && q.ipv4 != p.ipv4) continue;
        UsrcPortRecord r;
        r.lid = lid;
        r.sm_lid = kSmLid;
        r.ipv4 = p.ipv4;
        r.port_guid = p.port_guid;
        r.node_guid = p.node_guid;
        r.base_port = p.base_port;
        r.mtu = p.mtu;
        std::snprintf(r.desc, sizeof r.desc, "%s", p.desc.c_str());
        if (!add(r)) return recs;
      }
      break;
    }
    default:
      *rec_len = 0;
  }
  return recs;
}

void Server::answer(Endpoint from, const SaMad &req, uint64_t now, Out &out) {
  const uint16_t attr = req.hdr.attr_id;
  const bool known = attr == kNodeRecord || attr == kPortInfoRecord || attr == kPathRecord ||
                     attr == kUsrcPortRecord || attr == kClassPortInfo;
  switch (req.hdr.method) {
    case kGet: {
      stats.gets++;
      if (!known) return reply(from, req, kStatusBadMethodAttr, out);
      SaMad r = req;
      std::memset(r.data, 0, kSaData);
      if (attr == kClassPortInfo) {
        r.data[0] = 1;                  // BaseVersion
        r.data[1] = kSaClassVersion;
        r.data[7] = kRespTimeValue;     // CapabilityMask2(27) RespTimeValue(5)
        r.attr_offset = words_for(kClassPortInfoLen);
        return reply(from, r, kStatusOk, out);
      }
      size_t len = 0;
      auto recs = select(req, &len, 1);
      if (recs.empty()) return reply(from, r, kSaNoRecords, out);
      if (recs.size() > 1) return reply(from, r, kSaTooManyRecords, out);
      std::memcpy(r.data, recs[0].data(), len);
      r.attr_offset = words_for(len);
      return reply(from, r, kStatusOk, out);
    }
    case kSet: {
      stats.sets++;
      if (attr != kUsrcPortRecord) return reply(from, req, kStatusBadMethodAttr, out);
      UsrcPortRecord p;
      p.get(req.data);
      if (p.port_guid == 0 || p.ipv4 == 0) return reply(from, req, kSaReqInvalid, out);
      p.lid = register_port(p);
      if (p.lid == 0) return reply(from, req, kSaNoResources, out);
      p.sm_lid = kSmLid;
      SaMad r = req;
      std::memset(r.data, 0, kSaData);
      p.put(r.data);
      r.attr_offset = words_for(UsrcPortRecord::kLen);
      return reply(from, r, kStatusOk, out);
    }
    case kDelete: {
      if (attr != kUsrcPortRecord) return reply(from, req, kStatusBadMethodAttr, out);
      UsrcPortRecord p;
      p.get(req.data);
      for (auto it = ports_.begin(); it != ports_.end(); ++it) {
        if (it->second.port_guid == p.port_guid) {
          ports_.erase(it);
          return reply(from, req, kStatusOk, out);
        }
      }
      return reply(from, req, kSaNoRecords, out);
    }
    case kGetTable: {
      stats.get_tables++;
      if (!known || attr == kClassPortInfo) return reply(from, req, kStatusBadMethodAttr, out);
      if (transfers_.size() >= kMaxTransfers) return reply(from, req, kSaNoResources, out);
      size_t len = 0;
      auto recs = select(req, &len, kMaxTableRecords);
      if (recs.size() > kMaxTableRecords) return reply(from, req, kSaNoResources, out);
      // Records AttributeOffset words apart (IBA 15.2.1.1), all segments
      // one byte stream (15.4.1).
      const size_t step = size_t(words_for(len)) * 8;
      std::vector<uint8_t> payload(recs.size() * step);
      for (size_t i = 0; i < recs.size(); i++) std::memcpy(payload.data() + i * step, recs[i].data(), len);
      SaMad proto = req;
      proto.hdr.method = kGetTableResp;
      proto.hdr.status = kStatusOk;
      proto.attr_offset = words_for(len);
      auto [it, ok] = transfers_.emplace(std::pair{peer_key(from), req.hdr.tid},
                                         Transfer{from, RmppSender(proto, std::move(payload), t_)});
      stats.transfers++;
      std::vector<SaMad> o;
      it->second.tx.start(now, o);
      for (auto &s : o) out.emplace_back(from, s);
      return;
    }
    default:
      return reply(from, req, kStatusBadMethod, out);
  }
}

std::string Server::save() const {
  std::ostringstream o;
  for (auto &[lid, p] : ports_) {
    char line[256];
    std::snprintf(line, sizeof line, "%u %016llx %016llx %08x %u %u ", lid,
                  (unsigned long long)p.port_guid, (unsigned long long)p.node_guid, p.ipv4,
                  p.base_port, p.mtu);
    o << line << p.desc << "\n";
  }
  return o.str();
}

bool Server::load(const std::string &text, std::string *err) {
  std::istringstream in(text);
  std::string line;
  std::map<uint16_t, Port> ports;
  int n = 0;
  while (std::getline(in, line)) {
    n++;
    if (line.empty()) continue;
    unsigned lid = 0, ip = 0, base = 0, mtu = 0;
    unsigned long long pg = 0, ng = 0;
    int used = 0;
    if (std::sscanf(line.c_str(), "%u %llx %llx %x %u %u %n", &lid, &pg, &ng, &ip, &base, &mtu, &used) < 6 ||
        lid <= kSmLid || lid > kMaxUnicastLid || base > 0xffff || mtu > 5 || pg == 0 || ports.count(uint16_t(lid))) {
      if (err) *err = "line " + std::to_string(n) + ": not a port registration";
      return false;
    }
    ports[uint16_t(lid)] = Port{uint16_t(lid), pg, ng, ip, uint16_t(base), uint8_t(mtu), line.substr(size_t(used))};
  }
  ports_ = std::move(ports);
  return true;
}

// ---- Requester ----

void Requester::submit(const SaMad &req, uint64_t now, Out &out) {
  Txn &x = txns_[req.hdr.tid];
  x = Txn{};
  x.req = req;
  x.deadline = now + t_.response_ns;
  out.push_back(req);
  stats.sent++;
}

uint64_t Requester::deadline() const {
  uint64_t d = UINT64_MAX;
  for (auto &[tid, x] : txns_) {
    if (!x.result) d = std::min(d, x.rx ? x.rx->deadline() : x.deadline);
    else if (x.taken) d = std::min(d, x.linger_until);   // then forgotten
  }
  return d;
}

void Requester::finish(Txn &x, Result r, uint64_t now) {
  if (x.rx) {
    const RmppStats &s = x.rx->stats;
    stats.rmpp.acks_sent += s.acks_sent;
    stats.rmpp.timeouts += s.timeouts;
    stats.rmpp.duplicates += s.duplicates;
    stats.rmpp.discarded += s.discarded;
    stats.rmpp.malformed += s.malformed;
    stats.rmpp.aborts_sent += s.aborts_sent;
    stats.rmpp.aborts_rcvd += s.aborts_rcvd;
  }
  x.result = std::move(r);
  // Kept two Response Timeouts: a sender whose last ACK was lost resends
  // its last segment, and is ACKed again.
  x.linger_until = now + 2 * t_.response_ns;
}

void Requester::on_mad(const uint8_t *mad, size_t len, uint64_t now, Out &out) {
  stats.rcvd++;
  SaMad m;
  if (decode(mad, len, m) != SaError::ok) {
    stats.malformed++;
    return;
  }
  auto it = txns_.find(m.hdr.tid);
  if (it == txns_.end() || !(m.hdr.method & kResponseBit) || m.hdr.attr_id != it->second.req.hdr.attr_id) {
    stats.unexpected++;
    return;
  }
  Txn &x = it->second;
  if (!m.rmpp.active()) {
    if (x.result || x.rx) {
      stats.unexpected++;
      return;
    }
    Result r;
    r.status = m.hdr.status;
    r.first = m;
    r.payload.assign(m.data, m.data + kSaData);
    return finish(x, std::move(r), now);
  }
  if (!x.rx) {
    if (x.result) {
      stats.unexpected++;
      return;
    }
    x.rx.emplace(t_);
  }
  const uint64_t before = x.rx->stats.malformed;
  x.rx->on_mad(m, now, out);
  if (x.rx->stats.malformed != before) stats.malformed++;
  if (x.result) return;   // lingering: only re-ACKs
  if (x.rx->state() == RmppReceiver::State::done) {
    Result r;
    r.status = x.rx->first().hdr.status;
    r.first = x.rx->first();
    r.payload = x.rx->payload();
    finish(x, std::move(r), now);
  } else if (x.rx->state() == RmppReceiver::State::aborted) {
    Result r;
    r.err = ECONNABORTED;
    r.rmpp_status = x.rx->status();
    finish(x, std::move(r), now);
  }
}

void Requester::tick(uint64_t now, Out &out) {
  for (auto it = txns_.begin(); it != txns_.end();) {
    Txn &x = it->second;
    if (x.result) {
      if (x.taken && now >= x.linger_until) {
        it = txns_.erase(it);
        continue;
      }
    } else if (x.rx) {
      x.rx->tick(now, out);
      if (x.rx->state() == RmppReceiver::State::aborted) {
        Result r;
        r.err = ECONNABORTED;
        r.rmpp_status = x.rx->status();
        finish(x, std::move(r), now);
      }
    } else if (now >= x.deadline) {
      // IBA 13.6.3.2 (Response Timeout): resend, at most max_retries times.
      if (++x.retries > t_.max_retries) {
        Result r;
        r.err = ETIMEDOUT;
        finish(x, std::move(r), now);
      } else {
        out.push_back(x.req);
        stats.resent++;
        x.deadline = now + t_.response_ns;
      }
    }
    ++it;
  }
}

bool Requester::finished(uint64_t tid) const {
  auto it = txns_.find(tid);
  return it != txns_.end() && it->second.result && !it->second.taken;
}

std::optional<Requester::Result> Requester::take(uint64_t tid) {
  auto it = txns_.find(tid);
  if (it == txns_.end() || !it->second.result || it->second.taken) return std::nullopt;
  it->second.taken = true;
  return std::move(*it->second.result);
}

std::vector<const uint8_t *> records(const Requester::Result &r, size_t rec_len) {
  std::vector<const uint8_t *> v;
  const size_t step = size_t(r.first.attr_offset) * 8;
  if (r.err || r.status || step < rec_len) return v;
  if (!r.first.rmpp.active()) {
    v.push_back(r.payload.data());
    return v;
  }
  for (size_t off = 0; off + rec_len <= r.payload.size(); off += step) v.push_back(r.payload.data() + off);
  return v;
}

// ---- UDP ----

MadSocket::~MadSocket() {
  if (fd_ >= 0) ::close(fd_);
}

bool MadSocket::open(uint32_t ip, uint16_t port, Endpoint toward, std::string *err) {
  auto fail = [&](const char *what) {
    if (err) *err = std::string(what) + ": " + std::strerror(errno);
    return false;
  };
  if (ip == 0) {
    // The source address the route to the peer takes (the ICRC covers it).
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return fail("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(toward.ip);
    a.sin_port = htons(toward.port);
    socklen_t l = sizeof a;
    const bool ok = connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
                    getsockname(s, reinterpret_cast<sockaddr *>(&a), &l) == 0;
    ::close(s);
    if (!ok) return fail("no route to the SA");
    ip = ntohl(a.sin_addr.s_addr);
  }
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) return fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip);
  a.sin_port = htons(port);
  socklen_t l = sizeof a;
  if (::bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) return fail("bind");
  if (getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &l) != 0) return fail("getsockname");
  int df = IP_PMTUDISC_DO;   // DF and IP ID 0: what the ICRC assumes (icrc.h)
  setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df);
  local_ = {ip, ntohs(a.sin_port)};
  return true;
}

bool MadSocket::send(const SaMad &m, Endpoint to) {
  uint8_t mad[kMadLen], pkt[cm::kFrameLen];
  encode(m, mad);
  cm::frame(mad, ++psn_, pkt);
  wire::Ipv4Pseudo ip{local_.ip, to.ip, local_.port, to.port};
  iovec v{pkt, cm::kFrameLen - 4};
  wire::store_icrc(pkt + cm::kFrameLen - 4, wire::icrc_ipv4(ip, &v, 1));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(to.ip);
  a.sin_port = htons(to.port);
  return sendto(fd_, pkt, sizeof pkt, 0, reinterpret_cast<sockaddr *>(&a), sizeof a) == ssize_t(sizeof pkt);
}

const uint8_t *MadSocket::recv(Endpoint *from, size_t *len) {
  sockaddr_in a{};
  socklen_t l = sizeof a;
  const ssize_t n = recvfrom(fd_, buf_, sizeof buf_, 0, reinterpret_cast<sockaddr *>(&a), &l);
  *len = 0;
  if (n < 0) return nullptr;
  *len = 1;
  *from = {ntohl(a.sin_addr.s_addr), ntohs(a.sin_port)};
  const uint8_t *mad = cm::unframe(buf_, size_t(n));
  wire::Ipv4Pseudo ip{from->ip, local_.ip, from->port, local_.port};
  if (!mad || size_t(n) != cm::kFrameLen ||
      wire::check_icrc_ipv4(ip, buf_, size_t(n)) != wire::ParseError::ok) {
    drops++;
    return nullptr;
  }
  *len = kMadLen;
  return mad;
}

bool Client::open(uint32_t local_ip, std::string *err) { return sock_.open(local_ip, 0, sa_, err); }

bool Client::query(SaMad req, Requester::Result &out) {
  if (tid_ == 0) tid_ = (mono_ns() & 0xffffffffull) << 24;   // distinct from an earlier process's
  req.hdr.tid = ++tid_;
  std::vector<SaMad> o;
  req_.submit(req, mono_ns(), o);
  bool sent = false;
  for (;;) {
    for (auto &m : o) sent |= sock_.send(m, sa_);
    o.clear();
    if (req_.finished(req.hdr.tid)) break;
    const uint64_t now = mono_ns(), d = req_.deadline();
    const int ms = d <= now ? 0 : int(std::min<uint64_t>((d - now) / 1'000'000 + 1, 1000));
    pollfd p{sock_.fd(), POLLIN, 0};
    if (poll(&p, 1, ms) > 0) {
      Endpoint from;
      size_t n = 0;
      while (true) {
        const uint8_t *mad = sock_.recv(&from, &n);
        if (n == 0) break;
        if (mad && from == sa_) req_.on_mad(mad, n, mono_ns(), o);
      }
    }
    req_.tick(mono_ns(), o);
  }
  out = *req_.take(req.hdr.tid);
  return sent;
}

namespace {

// resolve_lid's cache: (SA, LID) -> address, until a time.
struct LidEntry { uint32_t ip; uint64_t until; };
std::mutex g_lid_mu;
std::map<std::pair<uint64_t, uint16_t>, LidEntry> g_lid_cache;

// A verbs call waits for these: fewer retries than a CLI (1.6 s at most).
RmppTimers verbs_timers() {
  RmppTimers t;
  t.max_retries = 3;
  return t;
}

// One query, its outcome as an errno: 0, EHOSTUNREACH (not sent),
// ETIMEDOUT (no answer) or EINVAL (the SA refused it).
int ask(Client &cl, const SaMad &req, Requester::Result &r) {
  if (!cl.query(req, r)) return EHOSTUNREACH;
  if (r.err) return ETIMEDOUT;
  return r.status ? EINVAL : 0;
}

// The record (attribute attr) that matches q on the comp_mask fields.
template <class Record>
int get_record(Client &cl, uint16_t attr, const Record &q, uint64_t comp_mask, Record *out) {
  SaMad req = request(kGet, attr, 0);
  q.put(req.data);
  req.comp_mask = comp_mask;
  Requester::Result r;
  if (int e = ask(cl, req, r)) return e;
  out->get(r.payload.data());
  return 0;
}

int open_client(Client &cl, uint32_t local_ip) {
  std::string err;
  return cl.open(local_ip, &err) ? 0 : errno ? errno : EHOSTUNREACH;
}

}  // namespace

int port_lids(Endpoint sa, uint32_t local_ip, std::unordered_map<uint32_t, uint16_t> *out) {
  Client cl(sa, verbs_timers());
  if (int e = open_client(cl, local_ip)) return e;
  Requester::Result r;
  if (int e = ask(cl, request(kGetTable, kUsrcPortRecord, 0), r)) return e;
  std::lock_guard lock(g_lid_mu);
  for (const uint8_t *p : records(r, UsrcPortRecord::kLen)) {
    UsrcPortRecord rec;
    rec.get(p);
    if (rec.lid == 0 || rec.ipv4 == 0) continue;
    (*out)[rec.ipv4] = rec.lid;
    g_lid_cache[{peer_key(sa), rec.lid}] = {rec.ipv4, mono_ns() + kLidCacheNs};
  }
  return 0;
}

int resolve_lid(Endpoint sa, uint32_t local_ip, uint16_t lid, uint32_t *ip) {
  auto &cache = g_lid_cache;
  std::lock_guard lock(g_lid_mu);
  const auto key = std::pair{peer_key(sa), lid};
  if (auto it = cache.find(key); it != cache.end() && it->second.until > mono_ns()) {
    *ip = it->second.ip;
    return 0;
  }
  Client cl(sa, verbs_timers());
  if (int e = open_client(cl, local_ip)) return e;
  UsrcPortRecord q, got;
  q.lid = lid;
  if (int e = get_record(cl, kUsrcPortRecord, q, UsrcPortRecord::kLid, &got)) return e;
  if (got.lid != lid || got.ipv4 == 0) return EINVAL;
  cache[key] = {got.ipv4, mono_ns() + kLidCacheNs};
  *ip = got.ipv4;
  return 0;
}

int path_to(Endpoint sa, uint32_t local_ip, uint16_t slid, uint32_t dst_ip, PathRecord *out) {
  Client cl(sa, verbs_timers());
  if (int e = open_client(cl, local_ip)) return e;
  UsrcPortRecord q, port;
  q.ipv4 = dst_ip;
  if (int e = get_record(cl, kUsrcPortRecord, q, UsrcPortRecord::kIpv4, &port)) return e;
  if (port.ipv4 != dst_ip || port.lid == 0) return EINVAL;
  PathRecord p;
  p.slid = slid;
  p.dlid = port.lid;
  p.numb_path = 1;
  p.reversible = true;
  const uint64_t mask = PathRecord::kSlid | PathRecord::kDlid | PathRecord::kNumbPath | PathRecord::kReversible;
  if (int e = get_record(cl, kPathRecord, p, mask, out)) return e;
  return out->dlid == port.lid ? 0 : EINVAL;
}

bool parse_endpoint(const std::string &s, Endpoint *e) {
  std::string host = s;
  unsigned long port = kDefaultPort;
  if (auto c = s.find(':'); c != std::string::npos) {
    host = s.substr(0, c);
    char *end = nullptr;
    port = std::strtoul(s.c_str() + c + 1, &end, 10);
    if (c + 1 == s.size() || *end || port == 0 || port > 65535) return false;
  }
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  *e = {ntohl(a.s_addr), uint16_t(port)};
  return true;
}

std::string to_string(Endpoint e) {
  in_addr a{htonl(e.ip)};
  char b[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, b, sizeof b);
  return std::string(b) + ":" + std::to_string(e.port);
}

}  // namespace usrc::sa
