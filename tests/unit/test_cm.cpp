// The rdma_cm emulation (providers/usrc/cm, docs/cm.md): the CM MAD codec
// and framing, and the state machine driven through the ucma ABI between
// two Cm instances over a fake network and clock.
// First, as in cm.cpp: <rdma/rdma_user_cm.h> before the libc socket
// headers gives every translation unit the kernel's struct in6_addr and
// sockaddr_in6 (the link-time optimiser checks they are one type).
#include "usrc/cm/cm.h"

#include <arpa/inet.h>
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>

#include "usrc/common/guard.h"

using namespace usrc;
using namespace usrc::cm;

TEST_CASE("CM MADs round-trip through encode and decode", "[cm]") {
  Msg m;
  m.attr = Attr::req;
  m.tid = 0x1122334455667788ull;
  m.local_comm = 0x00100005;
  m.service_id = kServiceIdTcp | 7174;
  m.ca_guid = 0x0255530000000001ull;
  m.qpn = 0x001003;
  m.psn = 0xabcdef;
  m.responder_resources = 4;
  m.initiator_depth = 2;
  m.remote_cm_timeout = 18;
  m.local_cm_timeout = 17;
  m.max_cm_retries = 3;
  m.retry_count = 6;
  m.rnr_retry_count = 7;
  m.mtu = 3;
  m.srq = true;
  m.local_lid = 0x101;
  m.remote_lid = 0x102;
  m.local_gid[15] = 1;
  m.remote_gid[15] = 2;
  m.hop_limit = 64;
  m.local_ack_timeout = 14;
  m.priv_len = 40;
  for (int i = 0; i < 40; i++) m.priv[i] = uint8_t(i + 1);
  uint8_t mad[kMadLen];
  encode(m, mad);
  CHECK(mad[1] == kMgmtClassCm);
  CHECK(mad[16] == 0x00);
  CHECK(mad[17] == 0x10);
  Msg d;
  REQUIRE(decode(mad, sizeof mad, d) == MadError::ok);
  CHECK(d.attr == Attr::req);
  CHECK(d.tid == m.tid);
  CHECK(d.local_comm == m.local_comm);
  CHECK(d.service_id == m.service_id);
  CHECK(d.ca_guid == m.ca_guid);
  CHECK(d.qpn == m.qpn);
  CHECK(d.psn == m.psn);
  CHECK(d.responder_resources == 4);
  CHECK(d.initiator_depth == 2);
  CHECK(d.remote_cm_timeout == 18);
  CHECK(d.local_cm_timeout == 17);
  CHECK(d.max_cm_retries == 3);
  CHECK(d.retry_count == 6);
  CHECK(d.rnr_retry_count == 7);
  CHECK(d.mtu == 3);
  CHECK(d.srq);
  CHECK(d.local_lid == 0x101);
  CHECK(d.remote_lid == 0x102);
  CHECK(d.local_gid[15] == 1);
  CHECK(d.remote_gid[15] == 2);
  CHECK(d.hop_limit == 64);
  CHECK(d.local_ack_timeout == 14);
  CHECK(d.priv_len == kReqPrivate);
  CHECK(std::memcmp(d.priv, m.priv, 40) == 0);
  CHECK(d.priv[40] == 0);

  for (Attr a : {Attr::rep, Attr::rej, Attr::rtu, Attr::dreq, Attr::drep, Attr::mra}) {
    Msg r;
    r.attr = a;
    r.local_comm = 0x200001;
    r.remote_comm = 0x100005;
    r.qpn = 0x2007;
    r.psn = 0x123456;
    r.reason = kRejConsumer;
    r.rejected = 1;
    r.service_timeout = 20;
    r.rnr_retry_count = 5;
    r.priv_len = 3;
    r.priv[0] = 9;
    encode(r, mad);
    Msg o;
    REQUIRE(decode(mad, sizeof mad, o) == MadError::ok);
    CHECK(o.attr == a);
    CHECK(o.local_comm == r.local_comm);
    CHECK(o.remote_comm == r.remote_comm);
    CHECK(o.priv[0] == 9);
    CHECK(o.priv_len == private_capacity(a));
    if (a == Attr::rep) {
      CHECK(o.qpn == r.qpn);
      CHECK(o.psn == r.psn);
      CHECK(o.rnr_retry_count == 5);
    }
    if (a == Attr::rej) {
      CHECK(o.reason == kRejConsumer);
      CHECK(o.rejected == 1);
    }
    if (a == Attr::dreq) CHECK(o.qpn == r.qpn);
    if (a == Attr::mra) CHECK(o.service_timeout == 20);
  }
}

TEST_CASE("malformed CM MADs are refused by decode", "[cm]") {
  Msg m;
  uint8_t mad[kMadLen];
  encode(m, mad);
  Msg d;
  CHECK(decode(mad, kMadLen - 1, d) == MadError::too_short);
  uint8_t b[kMadLen];
  std::memcpy(b, mad, kMadLen);
  b[1] = 0x04;   // subnet administration
  CHECK(decode(b, kMadLen, d) == MadError::not_cm);
  std::memcpy(b, mad, kMadLen);
  b[2] = 1;
  CHECK(decode(b, kMadLen, d) == MadError::bad_version);
  std::memcpy(b, mad, kMadLen);
  b[3] = 0x81;   // a response method
  CHECK(decode(b, kMadLen, d) == MadError::bad_method);
  std::memcpy(b, mad, kMadLen);
  b[17] = 0x19;  // LAP: not handled
  CHECK(decode(b, kMadLen, d) == MadError::unknown_attr);
}

TEST_CASE("SIDR MADs round-trip through encode and decode", "[cm]") {
  uint8_t mad[kMadLen];
  Msg q;
  q.attr = Attr::sidr_req;
  q.local_comm = 0x100007;
  q.service_id = service_id(0x0111, 7174);
  q.priv_len = kSidrReqPrivate;
  for (size_t i = 0; i < kSidrReqPrivate; i++) q.priv[i] = uint8_t(i);
  encode(q, mad);
  CHECK(mad[17] == 0x17);
  CHECK(mad[kMadHdrLen + 16] == 0);   // private data at byte 16 (IBA table 112)
  CHECK(mad[kMadHdrLen + 16 + 215] == 215);
  Msg d;
  REQUIRE(decode(mad, sizeof mad, d) == MadError::ok);
  CHECK(d.attr == Attr::sidr_req);
  CHECK(d.local_comm == q.local_comm);
  CHECK(d.service_id == 0x01111c06ull);
  CHECK(d.pkey == 0xffff);
  CHECK(d.priv_len == kSidrReqPrivate);
  CHECK(std::memcmp(d.priv, q.priv, kSidrReqPrivate) == 0);

  Msg r;
  r.attr = Attr::sidr_rep;
  r.remote_comm = 0x100007;
  r.sidr_status = kSidrRejected;
  r.qpn = 0x3004;
  r.qkey = 0x01234567;
  r.service_id = q.service_id;
  r.priv_len = 2;
  r.priv[0] = 'o';
  r.priv[1] = 'k';
  encode(r, mad);
  CHECK(mad[17] == 0x18);
  CHECK(mad[kMadHdrLen + 96] == 'o');   // private data at byte 96 (IBA table 113)
  REQUIRE(decode(mad, sizeof mad, d) == MadError::ok);
  CHECK(d.attr == Attr::sidr_rep);
  CHECK(d.remote_comm == 0x100007);
  CHECK(d.sidr_status == kSidrRejected);
  CHECK(d.qpn == 0x3004);
  CHECK(d.qkey == 0x01234567);
  CHECK(d.service_id == q.service_id);
  CHECK(d.priv_len == kSidrRepPrivate);
  CHECK(d.priv[1] == 'k');
}

TEST_CASE("CM MADs are framed as UD datagrams to QP1", "[cm]") {
  uint8_t mad[kMadLen], pkt[kFrameLen];
  Msg m;
  encode(m, mad);
  frame(mad, 5, pkt);
  const uint8_t *in = unframe(pkt, sizeof pkt);
  REQUIRE(in == pkt + 20);
  CHECK(std::memcmp(in, mad, kMadLen) == 0);
  CHECK(unframe(pkt, sizeof pkt - 1) == nullptr);
  pkt[7] = 2;   // QP2
  CHECK(unframe(pkt, sizeof pkt) == nullptr);

  IpHdr h{0x0a000001, 0x0a000002, 40000}, o;
  uint8_t ip[kIpHdrLen];
  put_ip_hdr(h, ip);
  REQUIRE(get_ip_hdr(ip, o));
  CHECK(o.src_ip == h.src_ip);
  CHECK(o.dst_ip == h.dst_ip);
  CHECK(o.src_port == h.src_port);
  ip[1] = 6 << 4;
  CHECK_FALSE(get_ip_hdr(ip, o));
}

namespace {

struct Wire {
  uint64_t now = 1'000'000'000;
  struct Mad {
    uint32_t from, to;
    std::vector<uint8_t> bytes;
  };
  std::vector<Mad> out;
};

class FakeNet : public Net {
 public:
  FakeNet(Wire &w, uint32_t ip, uint32_t slot) : w_(w), slot_(slot) {
    dev_.name = "fake" + std::to_string(slot);
    dev_.ipv4 = ip;
    dev_.guid = 0x0255530000000000ull | slot;
    dev_.base_port = 28700;
    dev_.sgid_index = 1;
  }
  std::vector<Device> devices() override { return {dev_}; }
  uint32_t slot() override { return slot_; }
  uint32_t route(uint32_t) override { return dev_.ipv4; }
  void send(const Device &from, uint32_t dst, const uint8_t mad[kMadLen]) override {
    w_.out.push_back({from.ipv4, dst, std::vector<uint8_t>(mad, mad + kMadLen)});
  }
  int claim_service(uint64_t) override { return 0; }
  void release_service(uint64_t) override {}
  void count(const Device &, Counter c) override { counts[c]++; }
  uint64_t now_ns() override { return w_.now; }
  void timers_changed() override {}
  std::map<Counter, int> counts;
  Device dev_;

 private:
  Wire &w_;
  uint32_t slot_;
};

sockaddr_in6 sin(uint32_t ip, uint16_t port) {
  sockaddr_in6 s6{};
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_addr.s_addr = htonl(ip);
  s.sin_port = htons(port);
  std::memcpy(&s6, &s, sizeof s);
  return s6;
}

constexpr uint32_t kIpA = 0x0a000001, kIpB = 0x0a000002;

struct Side {
  Side(Wire &w, uint32_t ip, uint32_t slot) : net(w, ip, slot), cm(net), file(cm.open(-1)) {
    file->nonblocking = true;
  }
  template <class C>
  int cmd(uint32_t op, C c, uint16_t out = 0) {
    struct {
      rdma_ucm_cmd_hdr h;
      C c;
    } __attribute__((packed)) b{{op, sizeof(C), out}, c};
    ssize_t r = cm.write(file.get(), &b, sizeof b, [&](int) { return file.get(); });
    return r < 0 ? static_cast<int>(-r) : 0;
  }
  uint32_t create(uint64_t uid, bool ud = false) {
    rdma_ucm_create_id c{};
    rdma_ucm_create_id_resp r{};
    c.uid = uid;
    c.response = reinterpret_cast<uintptr_t>(&r);
    c.ps = ud ? 0x0111 : 0x0106;
    c.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC;
    REQUIRE(cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof r) == 0);
    return r.id;
  }
  int event(rdma_ucm_event_resp &e) {
    rdma_ucm_get_event c{reinterpret_cast<uintptr_t>(&e)};
    return cmd(RDMA_USER_CM_CMD_GET_EVENT, c, sizeof e);
  }
  uint32_t next_event() {
    rdma_ucm_event_resp e{};
    REQUIRE(event(e) == 0);
    last = e;
    return e.event;
  }
  ib_uverbs_qp_attr qp_attr(uint32_t id, uint32_t state, int *err = nullptr) {
    ib_uverbs_qp_attr r{};
    rdma_ucm_init_qp_attr c{reinterpret_cast<uintptr_t>(&r), id, state};
    int e = cmd(RDMA_USER_CM_CMD_INIT_QP_ATTR, c, sizeof r);
    if (err) *err = e;
    else REQUIRE(e == 0);
    return r;
  }
  // A new id (user id uid) listening on ip:port.
  uint32_t listen(uint64_t uid, uint32_t ip, uint16_t port, bool ud = false) {
    uint32_t id = create(uid, ud);
    rdma_ucm_bind_ip bi{};
    bi.addr = sin(ip, port);
    bi.id = id;
    REQUIRE(cmd(RDMA_USER_CM_CMD_BIND_IP, bi) == 0);
    REQUIRE(cmd(RDMA_USER_CM_CMD_LISTEN, rdma_ucm_listen{id, 8}) == 0);
    return id;
  }
  // A new id (user id uid) with its address and route resolved to ip:port.
  uint32_t resolve(uint64_t uid, uint32_t ip, uint16_t port, bool ud = false) {
    uint32_t id = create(uid, ud);
    rdma_ucm_resolve_ip ri{};
    ri.dst_addr = sin(ip, port);
    ri.id = id;
    REQUIRE(cmd(RDMA_USER_CM_CMD_RESOLVE_IP, ri) == 0);
    REQUIRE(next_event() == 0);   // ADDR_RESOLVED
    REQUIRE(cmd(RDMA_USER_CM_CMD_RESOLVE_ROUTE, rdma_ucm_resolve_route{id, 100}) == 0);
    REQUIRE(next_event() == 2);   // ROUTE_RESOLVED
    return id;
  }
  // A new RC id (user id 1) that sends a REQ for ip:port with QP 0x1001.
  uint32_t connect_to(uint32_t ip, uint16_t port) {
    uint32_t id = resolve(1, ip, port);
    rdma_ucm_connect c{};
    c.id = id;
    c.conn_param.qp_num = 0x1001;
    REQUIRE(cmd(RDMA_USER_CM_CMD_CONNECT, c) == 0);
    return id;
  }
  FakeNet net;
  Cm cm;
  std::unique_ptr<File> file;
  rdma_ucm_event_resp last{};
};

// Delivers every MAD in flight to its addressee (repeatedly).
void deliver(Wire &w, Side &a, Side &b) {
  while (!w.out.empty()) {
    auto q = std::move(w.out);
    w.out.clear();
    for (auto &m : q) {
      Side &to = m.to == a.net.dev_.ipv4 ? a : b;
      to.cm.on_mad(to.net.dev_, m.from, m.bytes.data(), m.bytes.size());
    }
  }
}

// A connects to B's listener on port 5000; ids returned.
void connect(Wire &w, Side &a, Side &b, uint32_t &aid, uint32_t &lid, uint32_t &bid) {
  lid = b.listen(100, kIpB, 5000);
  aid = a.resolve(200, kIpB, 5000);
  rdma_ucm_connect c{};
  c.id = aid;
  c.conn_param.qp_num = 0x1001;
  c.conn_param.responder_resources = 1;
  c.conn_param.initiator_depth = 1;
  c.conn_param.retry_count = 7;
  c.conn_param.rnr_retry_count = 7;
  c.conn_param.private_data_len = 4;
  std::memcpy(c.conn_param.private_data, "helo", 4);
  c.conn_param.valid = 1;
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_CONNECT, c) == 0);
  Msg req, rep;
  REQUIRE(decode(w.out.at(0).bytes.data(), kMadLen, req) == MadError::ok);
  deliver(w, a, b);
  REQUIRE(b.next_event() == 4);   // CONNECT_REQUEST
  CHECK(b.last.uid == 100);
  CHECK(b.last.param.conn.qp_num == 0x1001);
  CHECK(std::memcmp(b.last.param.conn.private_data, "helo", 4) == 0);
  bid = b.last.id;
  rdma_ucm_accept ac{};
  ac.uid = 300;
  ac.id = bid;
  ac.conn_param.qp_num = 0x2002;
  ac.conn_param.responder_resources = 1;
  ac.conn_param.initiator_depth = 1;
  ac.conn_param.rnr_retry_count = 7;
  ac.conn_param.valid = 1;
  REQUIRE(b.cmd(RDMA_USER_CM_CMD_ACCEPT, ac) == 0);
  REQUIRE(decode(w.out.at(0).bytes.data(), kMadLen, rep) == MadError::ok);
  deliver(w, a, b);
  REQUIRE(a.next_event() == 5);   // CONNECT_RESPONSE
  CHECK(a.last.param.conn.qp_num == 0x2002);
  rdma_ucm_accept rtu{};
  rtu.id = aid;
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_ACCEPT, rtu) == 0);
  deliver(w, a, b);
  REQUIRE(b.next_event() == 9);   // ESTABLISHED
  CHECK(b.last.uid == 300);
  // A REQ's or REP's starting PSN is its sender's receive PSN (the kernel's
  // ib_cm; a kernel peer sends from it).
  CHECK(a.qp_attr(aid, IBV_QPS_RTR).rq_psn == req.psn);
  CHECK(b.qp_attr(bid, IBV_QPS_RTR).rq_psn == rep.psn);
  CHECK(a.qp_attr(aid, IBV_QPS_RTS).sq_psn == rep.psn);
  CHECK(b.qp_attr(bid, IBV_QPS_RTS).sq_psn == req.psn);
}

}  // namespace

TEST_CASE("CM: connect, QP attributes, disconnect", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1), b(w, kIpB, 2);
  uint32_t aid, lid, bid;
  connect(w, a, b, aid, lid, bid);

  auto ar = a.qp_attr(aid, IBV_QPS_RTR), as = a.qp_attr(aid, IBV_QPS_RTS);
  auto br = b.qp_attr(bid, IBV_QPS_RTR), bs = b.qp_attr(bid, IBV_QPS_RTS);
  CHECK(ar.dest_qp_num == 0x2002);
  CHECK(br.dest_qp_num == 0x1001);
  CHECK(ar.rq_psn == bs.sq_psn);
  CHECK(br.rq_psn == as.sq_psn);
  CHECK(ar.ah_attr.is_global == 1);
  CHECK(ar.ah_attr.grh.sgid_index == 1);
  CHECK(ar.ah_attr.grh.dgid[10] == 0xff);
  CHECK(ar.ah_attr.grh.dgid[15] == 2);
  CHECK(ar.ah_attr.dlid == lid_for(kIpB));
  CHECK((a.qp_attr(aid, IBV_QPS_INIT).qp_access_flags & IBV_ACCESS_REMOTE_WRITE));

  REQUIRE(a.cmd(RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{aid}) == 0);
  deliver(w, a, b);
  REQUIRE(b.next_event() == 10);   // DISCONNECTED
  REQUIRE(b.cmd(RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{bid}) == 0);
  deliver(w, a, b);
  REQUIRE(a.next_event() == 10);
  rdma_ucm_event_resp e;
  CHECK(a.event(e) == EAGAIN);
  CHECK(b.event(e) == EAGAIN);
  // Both ends leave timewait after it: TIMEWAIT_EXIT (15), as the kernel reports.
  CHECK(a.cm.next_deadline() != UINT64_MAX);
  w.now += 1'000'000'000;
  a.cm.tick();
  b.cm.tick();
  REQUIRE(a.next_event() == 15);
  CHECK(a.last.id == aid);
  REQUIRE(b.next_event() == 15);
  CHECK(b.last.id == bid);
  CHECK(a.event(e) == EAGAIN);

  rdma_ucm_destroy_id_resp dr{};
  rdma_ucm_destroy_id d{reinterpret_cast<uintptr_t>(&dr), aid, 0};
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof dr) == 0);
  CHECK(dr.events_reported == 5);   // ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_RESPONSE, DISCONNECTED, TIMEWAIT_EXIT
  CHECK(a.cmd(RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof dr) == ENOENT);
}

TEST_CASE("CM: bad, unknown and duplicate MADs are counted and dropped or refused", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1), b(w, kIpB, 2);
  uint32_t aid, lid, bid;
  connect(w, a, b, aid, lid, bid);

  uint8_t junk[kMadLen];
  for (int i = 0; i < 200; i++) {
    for (auto &x : junk) x = uint8_t(rand());
    if (i % 2) {
      junk[0] = 1;
      junk[1] = kMgmtClassCm;
      junk[2] = kCmClassVersion;
      junk[3] = kMethodSend;
      junk[16] = 0;
      junk[17] = uint8_t(0x10 + i % 8);
    }
    b.cm.on_mad(b.net.dev_, kIpA, junk, sizeof junk);
    b.cm.on_mad(b.net.dev_, kIpA, junk, size_t(i % 100));
  }
  CHECK(b.net.counts[Counter::cm_dropped] > 0);
  w.out.clear();

  // A REQ for a port nobody listens on: REJ, invalid service ID, when it
  // comes again (the first may have raced the listener).
  Msg req;
  req.attr = Attr::req;
  req.local_comm = 0x100099;
  req.service_id = kServiceIdTcp | 4444;
  put_ip_hdr({kIpA, kIpB, 1234}, req.priv);
  req.priv_len = kIpHdrLen;
  uint8_t mad[kMadLen];
  encode(req, mad);
  b.cm.on_mad(b.net.dev_, kIpA, mad, sizeof mad);
  CHECK(w.out.empty());
  b.cm.on_mad(b.net.dev_, kIpA, mad, sizeof mad);
  REQUIRE(w.out.size() == 1);
  Msg rej;
  REQUIRE(decode(w.out[0].bytes.data(), kMadLen, rej) == MadError::ok);
  CHECK(rej.attr == Attr::rej);
  CHECK(rej.reason == kRejInvalidServiceId);
  CHECK(rej.remote_comm == 0x100099);
  w.out.clear();

  // A DREQ for no connection is answered with a DREP (IBA 12.9.8.4).
  Msg dreq;
  dreq.attr = Attr::dreq;
  dreq.local_comm = 0x100077;
  dreq.remote_comm = 0x200077;
  encode(dreq, mad);
  b.cm.on_mad(b.net.dev_, kIpA, mad, sizeof mad);
  REQUIRE(w.out.size() == 1);
  Msg drep;
  REQUIRE(decode(w.out[0].bytes.data(), kMadLen, drep) == MadError::ok);
  CHECK(drep.attr == Attr::drep);
  w.out.clear();

  // The connection still works: no events were made up.
  rdma_ucm_event_resp e;
  CHECK(a.event(e) == EAGAIN);
  CHECK(b.event(e) == EAGAIN);
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{aid}) == 0);
  deliver(w, a, b);
  CHECK(b.next_event() == 10);
}

TEST_CASE("CM: an unanswered REQ is resent, then UNREACHABLE", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1);
  a.connect_to(kIpB, 5000);
  rdma_ucm_event_resp e{};
  int r = EAGAIN;
  for (int i = 0; i < 10 && (r = a.event(e)) == EAGAIN; i++) {
    w.now += 2'000'000'000;
    a.cm.tick();
  }
  REQUIRE(r == 0);
  CHECK(w.out.size() == 4);   // the REQ and 3 resends
  CHECK(e.event == 7);        // UNREACHABLE
  CHECK(static_cast<int32_t>(e.status) == -ETIMEDOUT);
}

TEST_CASE("CM: a REQ refused at once for no listener is resent once, then REJECTED", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1);
  a.connect_to(kIpB, 5000);
  REQUIRE(w.out.size() == 1);
  Msg req;
  REQUIRE(decode(w.out[0].bytes.data(), kMadLen, req) == MadError::ok);
  // (A kernel CM, as rxe's, refuses at once.)
  Msg rej;
  rej.attr = Attr::rej;
  rej.local_comm = 0x2000001;
  rej.remote_comm = req.local_comm;
  rej.reason = kRejInvalidServiceId;
  uint8_t mad[kMadLen];
  encode(rej, mad);
  a.cm.on_mad(a.net.dev_, kIpB, mad, sizeof mad);
  rdma_ucm_event_resp e{};
  CHECK(a.event(e) == EAGAIN);
  w.now += 2'000'000'000;
  a.cm.tick();
  REQUIRE(w.out.size() == 2);   // resent
  a.cm.on_mad(a.net.dev_, kIpB, mad, sizeof mad);
  REQUIRE(a.next_event() == 8);   // REJECTED
  CHECK(a.last.status == kRejInvalidServiceId);
}

TEST_CASE("CM: commands the kernel refuses are refused alike", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1);
  rdma_ucm_cmd_hdr h{RDMA_USER_CM_CMD_JOIN_MCAST + 1, 0, 0};
  CHECK(a.cm.write(a.file.get(), &h, sizeof h, nullptr) == -EINVAL);
  CHECK(a.cm.write(a.file.get(), &h, 3, nullptr) == -EINVAL);
  h = {RDMA_USER_CM_CMD_GET_OPTION, 0, 0};
  CHECK(a.cm.write(a.file.get(), &h, sizeof h, nullptr) == -ENOSYS);
  h = {RDMA_USER_CM_CMD_CREATE_ID, 200, 0};   // in beyond the write
  CHECK(a.cm.write(a.file.get(), &h, sizeof h, nullptr) == -EINVAL);
  rdma_ucm_create_id c{};
  rdma_ucm_create_id_resp r{};
  c.response = reinterpret_cast<uintptr_t>(&r);
  c.ps = 0x0002;   // RDMA_PS_IPOIB: its Q_Key comes from the SA
  c.qp_type = IBV_QPT_UD;
  CHECK(a.cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof r) == EOPNOTSUPP);
  c.ps = 0x0106;
  c.qp_type = IBV_QPT_RC;
  CHECK(a.cmd(RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{1234}) == ENOENT);
  uint32_t id = a.create(5);
  rdma_ucm_bind_ip bi{};
  bi.addr = sin(0x0b000001, 0);   // no usrc device has it
  bi.id = id;
  CHECK(a.cmd(RDMA_USER_CM_CMD_BIND_IP, bi) == EADDRNOTAVAIL);
  bi.addr.sin6_family = AF_INET6;
  CHECK(a.cmd(RDMA_USER_CM_CMD_BIND_IP, bi) == EAFNOSUPPORT);
  CHECK(a.cmd(RDMA_USER_CM_CMD_CONNECT, rdma_ucm_connect{{}, id, 0, {}}) == EINVAL);
  // A loopback address no device has: bound, to no device yet (libfabric's
  // verbs provider binds "localhost" and then looks at the interfaces).
  uint32_t lo = a.create(6);
  bi.addr = sin(0x7f000001, 0);
  bi.id = lo;
  CHECK(a.cmd(RDMA_USER_CM_CMD_BIND_IP, bi) == 0);
  rdma_ucm_query_addr_resp q{};
  rdma_ucm_query qc{reinterpret_cast<uintptr_t>(&q), lo, RDMA_USER_CM_QUERY_ADDR};
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_QUERY, qc, sizeof q) == 0);
  CHECK(q.node_guid == 0);
}

namespace {
// A asks B's UD service on port 6000 for its QPN and Q_Key (SIDR). Returns
// A's id and B's new id (after CONNECT_REQUEST).
void sidr_request(Wire &w, Side &a, Side &b, uint32_t &aid, uint32_t &bid, uint16_t port = 6000) {
  aid = a.resolve(200, kIpB, port, true);
  int err = -1;
  ib_uverbs_qp_attr init = a.qp_attr(aid, IBV_QPS_INIT);
  CHECK((init.qp_attr_mask & IBV_QP_QKEY));
  CHECK(init.qkey == 0x01234567);
  CHECK(init.port_num == 1);
  CHECK(a.qp_attr(aid, IBV_QPS_RTR).qp_attr_mask == IBV_QP_STATE);
  CHECK(a.qp_attr(aid, IBV_QPS_RTS).qp_attr_mask == (IBV_QP_STATE | IBV_QP_SQ_PSN));
  a.qp_attr(aid, IBV_QPS_SQD, &err);
  CHECK(err == EINVAL);
  rdma_ucm_connect c{};
  c.id = aid;
  c.conn_param.qp_num = 0x1005;
  c.conn_param.private_data_len = 180;   // a SIDR REQ's 216 bytes less the IP CM header
  std::memcpy(c.conn_param.private_data, "udp?", 4);
  c.conn_param.valid = 1;
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_CONNECT, c) == 0);
  deliver(w, a, b);
  if (b.event(b.last) == 0) {
    bid = b.last.id;
  } else {
    bid = UINT32_MAX;
  }
}
}  // namespace

// (Tagged [guard] too: a guarded copy's fault is not for ThreadSanitizer,
// tests/sanitize.sh.)
TEST_CASE("CM: a response pointer to nowhere is EFAULT, not a crash", "[cm][guard]") {
  Wire w;
  Side a(w, kIpA, 1);
  guard::install();
  rdma_ucm_create_id c{};
  c.ps = 0x0106;
  c.qp_type = IBV_QPT_RC;
  c.response = 8;   // an unmapped page
  CHECK(a.cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp)) == EFAULT);
}

TEST_CASE("CM: UD port space, SIDR REQ and REP", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1), b(w, kIpB, 2);
  b.listen(100, kIpB, 6000, true);
  // An RC id may take the same port: another port space.
  rdma_ucm_bind_ip bi{};
  bi.addr = sin(kIpB, 6000);
  bi.id = b.create(101);
  CHECK(b.cmd(RDMA_USER_CM_CMD_BIND_IP, bi) == 0);

  uint32_t aid, bid;
  sidr_request(w, a, b, aid, bid);
  REQUIRE(bid != UINT32_MAX);
  CHECK(b.last.event == 4);   // CONNECT_REQUEST, on the listener
  CHECK(b.last.uid == 100);
  CHECK(b.last.param.ud.private_data_len == 180);
  CHECK(std::memcmp(b.last.param.ud.private_data, "udp?", 4) == 0);
  CHECK(b.last.param.ud.qp_num == 0);   // the kernel gives no QPN nor AH here
  // The passive id's QP: INIT with the Q_Key, before it accepts.
  CHECK(b.qp_attr(bid, IBV_QPS_INIT).qkey == 0x01234567);
  rdma_ucm_accept ac{};
  ac.uid = 300;
  ac.id = bid;
  ac.conn_param.qp_num = 0x2006;
  ac.conn_param.private_data_len = 2;
  std::memcpy(ac.conn_param.private_data, "ok", 2);
  ac.conn_param.valid = 1;
  REQUIRE(b.cmd(RDMA_USER_CM_CMD_ACCEPT, ac) == 0);
  deliver(w, a, b);
  REQUIRE(a.next_event() == 9);   // ESTABLISHED with the UD parameters
  CHECK(a.last.uid == 200);
  const rdma_ucm_ud_param &u = a.last.param.ud;
  CHECK(u.qp_num == 0x2006);
  CHECK(u.qkey == 0x01234567);
  CHECK(u.ah_attr.is_global == 1);
  CHECK(u.ah_attr.port_num == 1);
  CHECK(u.ah_attr.grh.dgid[10] == 0xff);
  CHECK(u.ah_attr.grh.dgid[15] == 0x02);   // ::ffff:10.0.0.2
  CHECK(u.ah_attr.grh.sgid_index == 1);
  CHECK(std::memcmp(u.private_data, "ok", 2) == 0);
  // No further event on B (no RTU in SIDR), and a repeated SIDR REQ is
  // answered again without a second CONNECT_REQUEST.
  rdma_ucm_event_resp e{};
  CHECK(b.event(e) == EAGAIN);
  // Disconnecting a UD id is quietly nothing.
  CHECK(a.cmd(RDMA_USER_CM_CMD_DISCONNECT, rdma_ucm_disconnect{aid}) == 0);
  CHECK(a.event(e) == EAGAIN);
}

TEST_CASE("CM: a SIDR REQ refused, unanswered, or for no listener", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1), b(w, kIpB, 2);
  b.listen(100, kIpB, 6000, true);
  uint32_t aid, bid;
  sidr_request(w, a, b, aid, bid);
  REQUIRE(bid != UINT32_MAX);
  rdma_ucm_reject rj{};
  rj.id = bid;
  rj.private_data_len = 3;
  std::memcpy(rj.private_data, "no!", 3);
  REQUIRE(b.cmd(RDMA_USER_CM_CMD_REJECT, rj) == 0);
  deliver(w, a, b);
  REQUIRE(a.next_event() == 7);   // UNREACHABLE, status: SIDR "rejected"
  CHECK(a.last.status == kSidrRejected);
  CHECK(std::memcmp(a.last.param.ud.private_data, "no!", 3) == 0);

  // Nobody on port 6001: refused when it comes again (status 1).
  uint32_t aid2, none;
  sidr_request(w, a, b, aid2, none, 6001);
  CHECK(none == UINT32_MAX);
  rdma_ucm_event_resp e{};
  CHECK(a.event(e) == EAGAIN);
  w.now += 2'000'000'000;
  a.cm.tick();   // the resend
  deliver(w, a, b);
  REQUIRE(a.next_event() == 7);
  CHECK(a.last.status == kSidrNoService);

  // Nobody answers at all: resent, then UNREACHABLE, -ETIMEDOUT.
  uint32_t aid3 = a.resolve(201, kIpB, 6002, true);
  rdma_ucm_connect c{};
  c.id = aid3;
  c.conn_param.valid = 1;
  c.conn_param.private_data_len = 181;   // too much for a SIDR REQ
  CHECK(a.cmd(RDMA_USER_CM_CMD_CONNECT, c) == EINVAL);
  c.conn_param.private_data_len = 0;
  REQUIRE(a.cmd(RDMA_USER_CM_CMD_CONNECT, c) == 0);
  w.out.clear();
  for (int i = 0; i < 4; i++) {
    w.now += 2'000'000'000;
    a.cm.tick();
  }
  CHECK(w.out.size() == 3);
  REQUIRE(a.next_event() == 7);
  CHECK(static_cast<int32_t>(a.last.status) == -ETIMEDOUT);
}

TEST_CASE("CM: an accepted connection does not hold its listener's port", "[cm]") {
  Wire w;
  Side a(w, kIpA, 1), b(w, kIpB, 2);
  uint32_t aid, lid, bid;
  connect(w, a, b, aid, lid, bid);
  rdma_ucm_destroy_id_resp dr{};
  REQUIRE(b.cmd(RDMA_USER_CM_CMD_DESTROY_ID,
                rdma_ucm_destroy_id{reinterpret_cast<uintptr_t>(&dr), lid, 0}, sizeof dr) == 0);
  // perftest -R: a new listener on the same port while the first connection lives.
  b.listen(102, kIpB, 5000);
}
