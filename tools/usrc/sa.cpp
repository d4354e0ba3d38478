// `usrc sa`: the subnet administrator daemon, `usrc sa query` and
// `usrc sa register` (docs/sa.md). The protocol is cm/sa.h's.
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "usrc/cm/sa.h"
#include "usrc/common/config_text.h"

namespace usrc::cli {

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int fail(const std::string &msg) {
  fprintf(stderr, "usrc: %s\n", msg.c_str());
  return 1;
}

std::string gid_str(const uint8_t g[16]) {
  char b[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, g, b, sizeof b);
}

std::string hex64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "0x%016llx", (unsigned long long)v);
  return b;
}

uint32_t mtu_bytes(uint8_t code) { return code >= 1 && code <= 5 ? 128u << code : 0; }
uint8_t mtu_code(uint32_t bytes) {
  for (uint8_t c = 1; c <= 5; c++) if (mtu_bytes(c) == bytes) return c;
  return 3;
}

bool write_state(const std::string &path, const std::string &text) {
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp);
  f << text;
  f.close();
  return f && rename(tmp.c_str(), path.c_str()) == 0;
}

std::string error_text(const sa::Requester::Result &r, sa::Endpoint at) {
  if (r.err == ETIMEDOUT) return "the SA at " + sa::to_string(at) + " did not answer";
  if (r.err == ECONNABORTED)
    return "the transfer was aborted: RMPP status " + std::to_string(r.rmpp_status) + " (" +
           sa::rmpp_status_name(r.rmpp_status) + ")";
  char b[64];
  const char *what = r.status == sa::kSaNoRecords         ? " (no records)"
                     : r.status == sa::kSaTooManyRecords  ? " (too many records: use a table query)"
                     : r.status == sa::kSaReqInvalid      ? " (invalid request)"
                     : r.status == sa::kSaNoResources     ? " (the SA is out of resources)"
                     : r.status == sa::kStatusBadMethodAttr ? " (not supported)"
                                                            : "";
  snprintf(b, sizeof b, "SA status 0x%04x%s", r.status, what);
  return b;
}

}  // namespace

int sa_serve(const SaArgs &a) {
  sa::Endpoint e;
  if (!sa::parse_endpoint(a.listen, &e) || e.ip == 0)
    return fail("--listen needs ADDR[:PORT] with an address (the ICRC covers it), not '" + a.listen + "'");
  sa::RmppTimers t;
  t.window = uint32_t(a.window);
  sa::Server srv(t);
  if (!a.state.empty()) {
    std::ifstream f(a.state);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      std::string err;
      if (!srv.load(ss.str(), &err)) return fail(a.state + ": " + err);
    }
  }
  sa::MadSocket sock;
  std::string err;
  if (!sock.open(e.ip, e.port, {}, &err)) return fail("sa: " + sa::to_string(e) + ": " + err);
  struct sigaction sa_ {};
  sa_.sa_handler = on_signal;
  sigaction(SIGINT, &sa_, nullptr);
  sigaction(SIGTERM, &sa_, nullptr);
  fprintf(stderr, "usrc sa: serving on %s, SM LID %u, %zu ports registered\n", sa::to_string(e).c_str(),
          sa::kSmLid, srv.ports().size());
  sa::Server::Out out;
  uint64_t sets = 0;
  while (!g_stop) {
    const uint64_t now = sa::mono_ns();
    srv.tick(now, out);
    for (auto &[to, m] : out) {
      if (sock.send(m, to)) srv.stats.sent++;
    }
    out.clear();
    const uint64_t d = srv.deadline();
    const int ms = d <= now ? 0 : int(std::min<uint64_t>((d - now) / 1'000'000 + 1, 1000));
    pollfd p{sock.fd(), POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) continue;
    for (;;) {
      sa::Endpoint from;
      size_t n = 0;
      const uint8_t *mad = sock.recv(&from, &n);
      if (n == 0) break;
      if (mad) srv.on_mad(from, mad, n, sa::mono_ns(), out);
      for (auto &[to, m] : out) {
        if (sock.send(m, to)) srv.stats.sent++;
      }
      out.clear();
    }
    if (srv.stats.sets != sets) {
      sets = srv.stats.sets;
      if (!a.state.empty() && !write_state(a.state, srv.save()))
        fprintf(stderr, "usrc sa: cannot write %s\n", a.state.c_str());
    }
  }
  const auto &s = srv.stats;
  nlohmann::json j = {
      {"ports", srv.ports().size()}, {"rcvd", s.rcvd}, {"sent", s.sent},
      {"malformed", s.malformed + sock.drops}, {"unexpected", s.unexpected},
      {"duplicates", s.duplicates}, {"gets", s.gets}, {"get_tables", s.get_tables},
      {"sets", s.sets}, {"errors", s.errors}, {"transfers", s.transfers},
      {"transfers_done", s.transfers_done}, {"transfers_aborted", s.transfers_aborted},
      {"segments_sent", s.rmpp.segments_sent}, {"segments_resent", s.rmpp.segments_resent},
      {"acks_rcvd", s.rmpp.acks_rcvd}, {"timeouts", s.rmpp.timeouts},
      {"aborts_sent", s.rmpp.aborts_sent}, {"aborts_rcvd", s.rmpp.aborts_rcvd}};
  printf("%s\n", j.dump().c_str());
  return 0;
}

std::string sa_register_device(DeviceConfig &c) {
  const sa::Endpoint at{c.sa_ip, c.sa_port};
  sa::Client cl(at, {});
  std::string err;
  if (!cl.open(c.ipv4, &err)) return "sa: " + err;
  sa::SaMad req = sa::request(sa::kSet, sa::kUsrcPortRecord, 0);
  sa::UsrcPortRecord r;
  r.port_guid = r.node_guid = c.node_guid;
  r.ipv4 = c.ipv4;
  r.base_port = c.base_port;
  r.mtu = mtu_code(c.active_mtu);
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  snprintf(r.desc, sizeof r.desc, "%s %s", c.name.c_str(), host);
  r.put(req.data);
  req.comp_mask = sa::UsrcPortRecord::kPortGuid | sa::UsrcPortRecord::kIpv4;
  sa::Requester::Result res;
  if (!cl.query(req, res)) return "sa: cannot send to " + sa::to_string(at);
  if (res.err || res.status) return "sa: registration failed: " + error_text(res, at);
  sa::UsrcPortRecord got;
  got.get(res.payload.data());
  if (got.lid == 0) return "sa: the SA gave no LID";
  c.lid = got.lid;
  c.sm_lid = got.sm_lid;
  return "";
}

int sa_register(const SaArgs &a) {
  sa::Endpoint at;
  if (!sa::parse_endpoint(a.sa, &at)) return fail("bad --sa '" + a.sa + "' (ADDR[:PORT])");
  auto guid = config::to_uint(a.guid, UINT64_MAX, true);
  in_addr ip{};
  if (!guid || *guid == 0) return fail("bad --guid '" + a.guid + "'");
  if (inet_pton(AF_INET, a.addr.c_str(), &ip) != 1) return fail("bad --addr '" + a.addr + "'");
  const std::string desc = a.desc.empty() ? "port" : a.desc;
  const uint32_t own = ntohl(ip.s_addr);
  // Sent from whichever address routes to the SA: the record names the port's.
  sa::Client cl(at, {});
  std::string err;
  if (!cl.open(0, &err)) return fail("sa: " + err);
  sa::SaMad req = sa::request(sa::kSet, sa::kUsrcPortRecord, 0);
  sa::UsrcPortRecord r;
  r.port_guid = r.node_guid = *guid;
  r.ipv4 = own;
  r.base_port = uint16_t(a.port);
  r.mtu = 3;
  snprintf(r.desc, sizeof r.desc, "%s", desc.c_str());
  r.put(req.data);
  req.comp_mask = sa::UsrcPortRecord::kPortGuid | sa::UsrcPortRecord::kIpv4;
  sa::Requester::Result res;
  if (!cl.query(req, res)) return fail("sa: cannot send to " + sa::to_string(at));
  if (res.err || res.status) return fail("sa: registration failed: " + error_text(res, at));
  sa::UsrcPortRecord got;
  got.get(res.payload.data());
  printf("lid %u sm_lid %u\n", got.lid, got.sm_lid);
  return 0;
}

int sa_query(const SaArgs &a) {
  sa::Endpoint at{};
  uint32_t local = 0;
  if (!a.sa.empty()) {
    if (!sa::parse_endpoint(a.sa, &at)) return fail("bad --sa '" + a.sa + "' (ADDR[:PORT])");
  } else {
    std::vector<std::string> names;
    if (!a.device.empty()) names.push_back(a.device);
    else names = device_names();
    for (auto &n : names) {
      std::string err;
      auto c = DeviceConfig::load(n, &err);
      if (!c) {
        if (!a.device.empty()) return fail(err);
        continue;
      }
      if (c->sa_ip && (!c->netns || c->netns == net_namespace())) {
        at = {c->sa_ip, c->sa_port};
        local = c->ipv4;
        break;
      }
    }
    if (at.ip == 0) return fail("no SA: give --sa ADDR[:PORT] or a device linked with 'sa ADDR'");
  }
  sa::RmppTimers t;
  t.window = uint32_t(a.window);
  sa::Client cl(at, t);
  std::string err;
  if (!cl.open(local, &err)) return fail("sa: " + err);

  sa::SaMad req;
  size_t rec_len = 0;
  if (a.kind == "path") {
    req = sa::request(a.get ? sa::kGet : sa::kGetTable, sa::kPathRecord, 0);
    sa::PathRecord q;
    auto gid = [&](const std::string &s, uint8_t *out, uint64_t bit) {
      if (s.empty()) return true;
      if (inet_pton(AF_INET6, s.c_str(), out) != 1) return false;
      req.comp_mask |= bit;
      return true;
    };
    if (!gid(a.sgid, q.sgid, sa::PathRecord::kSgid) || !gid(a.dgid, q.dgid, sa::PathRecord::kDgid))
      return fail("bad GID (an IPv6 address: fe80::...)");
    if (a.slid >= 0) q.slid = uint16_t(a.slid), req.comp_mask |= sa::PathRecord::kSlid;
    if (a.dlid >= 0) q.dlid = uint16_t(a.dlid), req.comp_mask |= sa::PathRecord::kDlid;
    q.numb_path = 1;
    q.reversible = true;
    req.comp_mask |= sa::PathRecord::kNumbPath | sa::PathRecord::kReversible;
    q.put(req.data);
    rec_len = sa::PathRecord::kLen;
  } else if (a.kind == "node") {
    req = sa::request(a.get ? sa::kGet : sa::kGetTable, sa::kNodeRecord, 0);
    sa::NodeRecord q;
    if (a.lid >= 0) q.lid = uint16_t(a.lid), req.comp_mask |= sa::NodeRecord::kLid;
    if (!a.guid.empty()) {
      auto g = config::to_uint(a.guid, UINT64_MAX, true);
      if (!g) return fail("bad --guid '" + a.guid + "'");
      q.port_guid = *g;
      req.comp_mask |= sa::NodeRecord::kPortGuid;
    }
    q.put(req.data);
    rec_len = sa::NodeRecord::kLen;
  } else {
    req = sa::request(a.get ? sa::kGet : sa::kGetTable, sa::kPortInfoRecord, 0);
    sa::PortInfoRecord q;
    if (a.lid >= 0) q.endport_lid = uint16_t(a.lid), req.comp_mask |= sa::PortInfoRecord::kLid;
    q.put(req.data);
    rec_len = sa::PortInfoRecord::kLen;
  }
  sa::Requester::Result res;
  if (!cl.query(req, res)) return fail("sa: cannot send to " + sa::to_string(at));
  if (res.err || (res.status && !(res.status == sa::kSaNoRecords && !a.get)))
    return fail(error_text(res, at));

  nlohmann::json arr = nlohmann::json::array();
  for (const uint8_t *p : sa::records(res, rec_len)) {
    if (a.kind == "path") {
      sa::PathRecord r;
      r.get(p);
      if (a.json) {
        arr.push_back({{"slid", r.slid}, {"dlid", r.dlid}, {"sgid", gid_str(r.sgid)}, {"dgid", gid_str(r.dgid)},
                       {"mtu", mtu_bytes(r.mtu)}, {"pkey", r.pkey}, {"sl", r.sl}, {"rate", r.rate},
                       {"reversible", r.reversible}, {"packet_life", r.pkt_life}});
      } else {
        printf("path slid %u dlid %u sgid %s dgid %s mtu %u pkey 0x%04x sl %u%s\n", r.slid, r.dlid,
               gid_str(r.sgid).c_str(), gid_str(r.dgid).c_str(), mtu_bytes(r.mtu), r.pkey, r.sl,
               r.reversible ? " reversible" : "");
      }
    } else if (a.kind == "node") {
      sa::NodeRecord r;
      r.get(p);
      if (a.json) {
        arr.push_back({{"lid", r.lid}, {"node_guid", hex64(r.node_guid)}, {"port_guid", hex64(r.port_guid)},
                       {"node_type", r.node_type}, {"ports", r.num_ports}, {"description", r.description()}});
      } else {
        printf("node lid %u guid %s port_guid %s type %s desc \"%s\"\n", r.lid, hex64(r.node_guid).c_str(),
               hex64(r.port_guid).c_str(), r.node_type == 1 ? "CA" : "other", r.description().c_str());
      }
    } else {
      sa::PortInfoRecord r;
      r.get(p);
      if (a.json) {
        arr.push_back({{"lid", r.lid}, {"sm_lid", r.sm_lid}, {"port", r.port_num}, {"state", r.state},
                       {"mtu", mtu_bytes(r.mtu_cap)}});
      } else {
        printf("port lid %u port %u sm_lid %u state %s mtu %u\n", r.lid, r.port_num, r.sm_lid,
               r.state == 4 ? "ACTIVE" : "other", mtu_bytes(r.mtu_cap));
      }
    }
  }
  if (a.json) printf("%s\n", arr.dump(2).c_str());
  return 0;
}

}  // namespace usrc::cli
