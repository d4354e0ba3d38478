// The SA's MADs and RMPP (docs/sa.md): encode/decode, and the SA and its
// requester talking over the simulated network (net/sim.cpp), which loses,
// duplicates, reorders and corrupts datagrams on a virtual clock.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <functional>

#include "usrc/cm/sa.h"
#include "usrc/net/sim.h"
#include "usrc/wire/hdr.h"
#include "usrc/wire/icrc.h"

using namespace usrc;
using namespace usrc::sa;

namespace {

constexpr Endpoint kSa{0x0a000001, 4791}, kCl{0x0a000002, 29500};

// A RoCE v2 datagram to QP1 (cm/mad.h) with its ICRC.
std::vector<uint8_t> wrap(const SaMad &m, Endpoint src, Endpoint dst) {
  uint8_t mad[kMadLen];
  encode(m, mad);
  std::vector<uint8_t> pkt(cm::kFrameLen);
  cm::frame(mad, 1, pkt.data());
  wire::Ipv4Pseudo ip{src.ip, dst.ip, src.port, dst.port};
  iovec v{pkt.data(), pkt.size() - 4};
  wire::store_icrc(pkt.data() + pkt.size() - 4, wire::icrc_ipv4(ip, &v, 1));
  return pkt;
}

const uint8_t *unwrap(const net::RxPacket &p, Endpoint local) {
  wire::Ipv4Pseudo ip{p.src.ip, local.ip, p.src.port, local.port};
  if (wire::check_icrc_ipv4(ip, p.data, p.len) != wire::ParseError::ok) return nullptr;
  return cm::unframe(p.data, p.len);
}

// A record's RMPP view of a datagram in flight (for chosen losses).
bool rmpp_of(const std::vector<uint8_t> &d, Rmpp *r, uint8_t *method) {
  SaMad m;
  if (d.size() != cm::kFrameLen || decode(d.data() + 20, kMadLen, m) != SaError::ok) return false;
  *r = m.rmpp;
  *method = m.hdr.method;
  return true;
}

struct Rig {
  net::SimNetwork net;
  net::SimNic sn, cn;
  RmppTimers t;
  Server srv;
  Requester rq;
  uint64_t sa_bad = 0, cl_bad = 0;
  bool sa_alive = true;

  explicit Rig(uint64_t seed, net::SimFaults f = {})
      : net(seed, f), sn(net, kSa), cn(net, kCl), srv(t), rq(t) {}

  void send(net::SimNic &nic, Endpoint src, Endpoint dst, const SaMad &m) {
    auto pkt = wrap(m, src, dst);
    send_raw(nic, dst, pkt);
  }
  void send_raw(net::SimNic &nic, Endpoint dst, const std::vector<uint8_t> &pkt) {
    iovec v{const_cast<uint8_t *>(pkt.data()), pkt.size()};
    net::TxPacket p{dst, &v, 1};
    nic.send({&p, 1});
  }
  void flush(Server::Out &so, Requester::Out &co) {
    for (auto &[to, m] : so) send(sn, kSa, to, m);
    for (auto &m : co) send(cn, kCl, kSa, m);
    so.clear();
    co.clear();
  }
  // Runs until `tid` is answered or `limit` virtual ns pass.
  std::optional<Requester::Result> run(uint64_t tid, uint64_t limit = 120'000'000'000ull) {
    const uint64_t end = net.now() + limit;
    Server::Out so;
    Requester::Out co;
    while (net.now() < end) {
      net::RxPacket rx[16];
      bool any = true;
      while (any) {
        any = false;
        if (size_t n = sn.recv(rx); n && sa_alive) {
          any = true;
          for (size_t i = 0; i < n; i++) {
            if (const uint8_t *mad = unwrap(rx[i], kSa)) srv.on_mad(rx[i].src, mad, kMadLen, net.now(), so);
            else sa_bad++;
          }
        }
        if (size_t n = cn.recv(rx)) {
          any = true;
          for (size_t i = 0; i < n; i++) {
            if (const uint8_t *mad = unwrap(rx[i], kCl)) rq.on_mad(mad, kMadLen, net.now(), co);
            else cl_bad++;
          }
        }
        flush(so, co);
      }
      if (sa_alive) srv.tick(net.now(), so);
      rq.tick(net.now(), co);
      flush(so, co);
      if (rq.finished(tid)) return rq.take(tid);
      uint64_t next = std::min({net.next_delivery(), rq.deadline(), sa_alive ? srv.deadline() : UINT64_MAX});
      if (next == UINT64_MAX) next = net.now() + 1'000'000;
      net.advance(std::max<uint64_t>(next > net.now() ? next - net.now() : 0, 1000));
    }
    return std::nullopt;
  }
  uint64_t submit(const SaMad &req) {
    Requester::Out co;
    rq.submit(req, net.now(), co);
    Server::Out so;
    flush(so, co);
    return req.hdr.tid;
  }
  // n ports, LIDs 2..n+1.
  void populate(int n) {
    std::string text;
    for (int i = 0; i < n; i++) {
      char line[128];
      snprintf(line, sizeof line, "%d %016x %016x %08x 20000 3 port%d\n", i + 2, 0x1000 + i, 0x1000 + i,
               0x0a010000 + i, i);
      text += line;
    }
    std::string err;
    REQUIRE(srv.load(text, &err));
  }
};

SaMad node_table(uint64_t tid) { return request(kGetTable, kNodeRecord, tid); }

void check_nodes(const Requester::Result &r, int n) {
  REQUIRE(r.err == 0);
  REQUIRE(r.status == 0);
  auto recs = records(r, NodeRecord::kLen);
  REQUIRE(recs.size() == size_t(n));
  for (int i = 0; i < n; i++) {
    NodeRecord nr;
    nr.get(recs[size_t(i)]);
    CHECK(nr.lid == i + 2);
    CHECK(nr.port_guid == uint64_t(0x1000 + i));
    CHECK(nr.description() == "port" + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("SA MAD and records: encode and decode", "[sa]") {
  SaMad m = request(kGetTableResp, kPathRecord, 0x1122334455667788ull);
  m.rmpp = Rmpp{1, kRmppData, 3, kRmppActive | kRmppFirst, 0, 7, 1234};
  m.comp_mask = 0x30;
  m.attr_offset = 8;
  PathRecord p;
  p.dlid = 0x1234;
  p.slid = 0x0042;
  port_gid(0xabcdef, p.dgid);
  p.flow_label = 0xfffff;
  p.hop_limit = 9;
  p.mtu_selector = 2;
  p.mtu = 4;
  p.reversible = true;
  p.numb_path = 1;
  p.put(m.data);
  uint8_t b[kMadLen];
  encode(m, b);
  CHECK(b[1] == kMgmtClassSa);
  CHECK(b[3] == kGetTableResp);
  CHECK(b[24] == 1);   // RMPPVersion
  CHECK(b[25] == kRmppData);
  CHECK(b[26] == (3 << 3 | 3));
  CHECK(wire::be::get32(b + 28) == 7);
  CHECK(wire::be::get32(b + 32) == 1234);
  CHECK(wire::be::get16(b + 44) == 8);   // AttributeOffset
  CHECK(wire::be::get64(b + 48) == 0x30);
  CHECK(wire::be::get16(b + 56 + 40) == 0x1234);   // PathRecord.DLID
  CHECK(b[56 + 54] == (2 << 6 | 4));
  SaMad d;
  REQUIRE(decode(b, sizeof b, d) == SaError::ok);
  CHECK(d.hdr.tid == m.hdr.tid);
  CHECK(d.rmpp.flags == (kRmppActive | kRmppFirst));
  CHECK(d.rmpp.resp_time == 3);
  PathRecord q;
  q.get(d.data);
  CHECK(q.dlid == 0x1234);
  CHECK(q.flow_label == 0xfffff);
  CHECK(q.hop_limit == 9);
  CHECK(q.reversible);
  CHECK(guid_of_gid(q.dgid) == 0xabcdef);

  NodeRecord n;
  n.lid = 7;
  n.port_guid = 0x77;
  std::snprintf(n.desc, sizeof n.desc, "host a");
  uint8_t nb[NodeRecord::kLen];
  n.put(nb);
  NodeRecord n2;
  n2.get(nb);
  CHECK(n2.lid == 7);
  CHECK(n2.port_guid == 0x77);
  CHECK(n2.vendor_id == 0x025553);
  CHECK(n2.description() == "host a");
  PortInfoRecord pi;
  pi.endport_lid = pi.lid = 5;
  pi.sm_lid = 1;
  pi.mtu_cap = 4;
  uint8_t pb[PortInfoRecord::kLen];
  pi.put(pb);
  CHECK(wire::be::get16(pb + 4 + 16) == 5);   // PortInfo.LID
  CHECK(wire::be::get16(pb + 4 + 18) == 1);   // PortInfo.MasterSMLID
  PortInfoRecord pi2;
  pi2.get(pb);
  CHECK(pi2.sm_lid == 1);
  CHECK(pi2.mtu_cap == 4);

  CHECK(decode(b, kMadLen - 1, d) == SaError::too_short);
  b[1] = 0x07;
  CHECK(decode(b, sizeof b, d) == SaError::not_sa);
  b[1] = kMgmtClassSa;
  b[2] = 3;
  CHECK(decode(b, sizeof b, d) == SaError::bad_version);
  CHECK(words_for(NodeRecord::kLen) == 14);
  CHECK(words_for(PortInfoRecord::kLen) == 9);
}

TEST_CASE("SA: registration, Get and its errors", "[sa]") {
  Rig r(1);
  auto reg = [&](uint64_t guid, uint32_t ip, uint64_t tid) {
    SaMad m = request(kSet, kUsrcPortRecord, tid);
    UsrcPortRecord p;
    p.port_guid = p.node_guid = guid;
    p.ipv4 = ip;
    p.base_port = 29500;
    p.put(m.data);
    auto res = r.run(r.submit(m));
    REQUIRE(res);
    REQUIRE(res->err == 0);
    REQUIRE(res->status == 0);
    UsrcPortRecord got;
    got.get(res->payload.data());
    CHECK(got.sm_lid == kSmLid);
    return got.lid;
  };
  CHECK(reg(0x10, 0x0a000010, 1) == 2);
  CHECK(reg(0x11, 0x0a000011, 2) == 3);
  CHECK(reg(0x10, 0x0a000012, 3) == 2);   // the same port again: its LID, the new address
  REQUIRE(r.srv.ports().at(2).ipv4 == 0x0a000012);

  SaMad g = request(kGet, kPathRecord, 4);
  PathRecord q;
  port_gid(0x10, q.sgid);
  port_gid(0x11, q.dgid);
  q.put(g.data);
  g.comp_mask = PathRecord::kSgid | PathRecord::kDgid;
  auto res = r.run(r.submit(g));
  REQUIRE(res);
  REQUIRE(res->status == 0);
  PathRecord pr;
  pr.get(records(*res, PathRecord::kLen).at(0));
  CHECK(pr.slid == 2);
  CHECK(pr.dlid == 3);

  g.hdr.tid = 5;
  g.comp_mask = 0;   // every pair: more than Get can answer
  res = r.run(r.submit(g));
  CHECK(res->status == kSaTooManyRecords);
  SaMad n = request(kGet, kNodeRecord, 6);
  NodeRecord nq;
  nq.lid = 99;
  nq.put(n.data);
  n.comp_mask = NodeRecord::kLid;
  res = r.run(r.submit(n));
  CHECK(res->status == kSaNoRecords);
  res = r.run(r.submit(request(kGet, 0x0099, 7)));
  CHECK(res->status == kStatusBadMethodAttr);
  res = r.run(r.submit(request(0x07, kNodeRecord, 8)));
  CHECK(res->status == kStatusBadMethod);
  res = r.run(r.submit(request(kGet, kClassPortInfo, 9)));
  CHECK(res->status == 0);
  CHECK((res->payload[7] & 0x1f) == kRespTimeValue);
  // A response sent to the SA is not for it: counted, not answered.
  const uint64_t errors = r.srv.stats.errors;
  SaMad resp = request(kGetResp, kNodeRecord, 10);
  r.send(r.cn, kCl, kSa, resp);
  CHECK_FALSE(r.run(999, 1'000'000'000));
  CHECK(r.srv.stats.unexpected == 1);
  CHECK(r.srv.stats.errors == errors);
}

TEST_CASE("RMPP: a GetTable of many MADs, clean and under loss", "[sa]") {
  constexpr int kPorts = 150;   // 150 NodeRecords of 112 bytes: 84 segments
  SECTION("clean") {
    Rig r(2);
    r.populate(kPorts);
    auto res = r.run(r.submit(node_table(1)));
    REQUIRE(res);
    check_nodes(*res, kPorts);
    r.run(999, 1'000'000'000);   // the last ACK reaches the SA
    CHECK(r.srv.stats.transfers_done == 1);
    CHECK(r.srv.stats.rmpp.segments_sent == 84);
    CHECK(r.srv.stats.rmpp.segments_resent == 0);
  }
  SECTION("a lost segment is resent") {
    Rig r(3);
    r.populate(kPorts);
    int dropped = 0;
    r.net.drop_if = [&](const std::vector<uint8_t> &d) {
      Rmpp m;
      uint8_t method;
      if (rmpp_of(d, &m, &method) && m.type == kRmppData && (m.seg == 5 || m.seg == 16) && dropped < 2) {
        dropped++;
        return true;
      }
      return false;
    };
    auto res = r.run(r.submit(node_table(1)));
    REQUIRE(res);
    check_nodes(*res, kPorts);
    r.run(999, 1'000'000'000);
    CHECK(dropped == 2);
    CHECK(r.srv.stats.rmpp.segments_resent > 0);
    CHECK(r.rq.stats.rmpp.discarded > 0);   // the ones after the gap
  }
  SECTION("a lost ACK: the window is resent and ACKed again") {
    Rig r(4);
    r.populate(kPorts);
    int dropped = 0;
    r.net.drop_if = [&](const std::vector<uint8_t> &d) {
      Rmpp m;
      uint8_t method;
      if (rmpp_of(d, &m, &method) && m.type == kRmppAck && (m.seg == 17 || m.seg == 84) && dropped < 2) {
        dropped++;
        return true;
      }
      return false;
    };
    auto res = r.run(r.submit(node_table(1)));
    REQUIRE(res);
    check_nodes(*res, kPorts);
    CHECK(dropped == 2);
    // The last ACK too: the requester keeps the finished transfer and
    // ACKs the resent last segment.
    r.run(999, 2'000'000'000);
    CHECK(r.srv.stats.rmpp.timeouts >= 1);
    CHECK(r.srv.stats.transfers_done == 1);
    CHECK(r.srv.stats.transfers_aborted == 0);
    CHECK(r.rq.stats.rmpp.duplicates > 0);
  }
  SECTION("random loss, duplication, reordering and corruption") {
    for (uint64_t seed = 10; seed < 16; seed++) {
      net::SimFaults f;
      f.drop = 0.1;
      f.duplicate = 0.05;
      f.reorder = 0.05;
      f.corrupt = 0.02;
      Rig r(seed, f);
      r.populate(kPorts);
      auto res = r.run(r.submit(node_table(seed)));
      REQUIRE(res);
      check_nodes(*res, kPorts);
    }
  }
}

TEST_CASE("RMPP: aborts", "[sa]") {
  SECTION("the requester goes away: the SA gives up and aborts") {
    Rig r(5);
    r.populate(100);
    // After its first ACK, nothing the requester sends arrives.
    int from_requester = 0;
    r.net.drop_if = [&](const std::vector<uint8_t> &d) {
      Rmpp m;
      uint8_t method;
      return rmpp_of(d, &m, &method) && method == kGetTable && m.type != kRmppNone && ++from_requester > 1;
    };
    r.submit(node_table(1));
    r.run(999, 60'000'000'000ull);
    CHECK(r.srv.stats.transfers_aborted == 1);
    CHECK(r.srv.stats.rmpp.aborts_sent == 1);
    CHECK(r.srv.stats.rmpp.timeouts == r.t.max_retries + 1);
    CHECK(r.srv.deadline() == UINT64_MAX);
  }
  SECTION("the SA goes away mid-transfer: the requester aborts (total time too long)") {
    Rig r(6);
    r.populate(100);
    const uint64_t tid = r.submit(node_table(1));
    int segs = 0;
    r.net.drop_if = [&](const std::vector<uint8_t> &d) {
      Rmpp m;
      uint8_t method;
      return rmpp_of(d, &m, &method) && m.type == kRmppData && ++segs > 20;
    };
    r.sa_alive = true;
    auto res = r.run(tid);
    REQUIRE(res);
    CHECK(res->err == ECONNABORTED);
    // Whichever side's timers ran out first: the requester's (T2L) or
    // the SA's (too many retries, its ABORT dropped: the requester's then).
    CHECK((res->rmpp_status == kRmppTotalTimeTooLong || res->rmpp_status == kRmppTooManyRetries));
  }
  SECTION("no SA at all: the request times out") {
    Rig r(7);
    r.sa_alive = false;
    auto res = r.run(r.submit(node_table(1)));
    REQUIRE(res);
    CHECK(res->err == ETIMEDOUT);
    CHECK(r.rq.stats.resent == r.t.max_retries);
  }
  SECTION("an inconsistent segment: the requester aborts, the SA stops") {
    Rig r(8);
    r.populate(100);
    r.net.drop_if = [&](const std::vector<uint8_t> &d) {
      Rmpp m;
      uint8_t method;
      return rmpp_of(d, &m, &method) && m.type == kRmppData && m.seg == 3 && !(m.flags & kRmppFirst);
    };
    const uint64_t tid = r.submit(node_table(1));
    r.run(999, 5'000'000);
    // A forged segment 3 that claims to be a first.
    SaMad bad = node_table(1);
    bad.hdr.method = kGetTableResp;
    bad.rmpp = Rmpp{1, kRmppData, 0, kRmppActive | kRmppFirst, 0, 3, 220};
    r.send(r.sn, kSa, kCl, bad);
    r.net.drop_if = nullptr;
    auto res = r.run(tid);
    REQUIRE(res);
    CHECK(res->err == ECONNABORTED);
    CHECK(res->rmpp_status == kRmppBadFirstSegment);
    r.run(999, 2'000'000'000);
    CHECK(r.srv.stats.transfers_aborted == 1);
    CHECK(r.srv.stats.rmpp.aborts_rcvd == 1);
  }
}

TEST_CASE("RMPP: malformed and unexpected MADs are dropped and counted", "[sa]") {
  Rig r(9);
  r.populate(60);
  const uint64_t tid = r.submit(node_table(1));
  r.run(999, 3'000'000);
  // Mid-transfer, to the requester: a bad ICRC, a truncated datagram, a
  // MAD of another class, and a segment of a transfer it never asked for.
  std::vector<uint8_t> pkt = wrap(node_table(1), kSa, kCl);
  pkt[100] ^= 1;
  r.send_raw(r.sn, kCl, pkt);
  r.send_raw(r.sn, kCl, std::vector<uint8_t>(40, 0));
  SaMad cmm = node_table(1);
  cmm.hdr.mgmt_class = 0x07;
  r.send(r.sn, kSa, kCl, cmm);
  SaMad other = node_table(77);
  other.hdr.method = kGetTableResp;
  other.rmpp = Rmpp{1, kRmppData, 0, kRmppActive | kRmppFirst, 0, 1, 220};
  r.send(r.sn, kSa, kCl, other);
  // And to the SA: an ACK for no transfer, a truncated MAD.
  SaMad ack = node_table(55);
  ack.rmpp = Rmpp{1, kRmppAck, 0, kRmppActive, 0, 1, 2};
  r.send(r.cn, kCl, kSa, ack);
  auto res = r.run(tid);
  REQUIRE(res);
  check_nodes(*res, 60);
  r.run(999, 1'000'000'000);
  CHECK(r.cl_bad == 2);                 // ICRC, truncated: dropped before the MAD layer
  CHECK(r.rq.stats.malformed == 1);     // not an SA MAD
  CHECK(r.rq.stats.unexpected == 1);    // no such transaction
  CHECK(r.srv.stats.unexpected == 1);
  CHECK(r.srv.stats.transfers_done == 1);
}

TEST_CASE("SA: a table too large to send is refused, not built", "[sa]") {
  Rig r(11);
  r.populate(300);   // 90000 paths between all pairs
  auto res = r.run(r.submit(request(kGetTable, kPathRecord, 1)));
  REQUIRE(res);
  CHECK(res->err == 0);
  CHECK(res->status == kSaNoResources);
  // From one source: 300 paths, 94 MADs.
  SaMad q = request(kGetTable, kPathRecord, 2);
  PathRecord p;
  p.slid = 2;
  p.put(q.data);
  q.comp_mask = PathRecord::kSlid;
  res = r.run(r.submit(q));
  REQUIRE(res);
  auto recs = records(*res, PathRecord::kLen);
  REQUIRE(recs.size() == 300);
  PathRecord last;
  last.get(recs.back());
  CHECK(last.slid == 2);
  CHECK(last.dlid == 301);
}
