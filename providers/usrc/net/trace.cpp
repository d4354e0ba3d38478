#include "usrc/net/trace.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>

#include "usrc/net/ipv4.h"
#include "usrc/wire/hdr.h"
#include "usrc/wire/icrc.h"

namespace usrc::net {

namespace {

constexpr uint32_t kLinktypeIpv4 = 228;   // raw IPv4, no link header

struct PcapHeader {
  uint32_t magic = 0xa1b23c4d;   // nanosecond timestamps
  uint16_t major = 2, minor = 4;
  int32_t zone = 0;
  uint32_t sigfigs = 0, snaplen = 65535, linktype = kLinktypeIpv4;
};

struct RecordHeader {
  uint32_t sec, nsec, caplen, len;
};

// One pcap file per path and process: the devices' NICs and the CM's
// datagrams (trace_datagram) share it. Never closed (flushed as written):
// it lives as long as the process.
FILE *open_shared(const std::string &path, std::string *err) {
  static std::mutex mu;
  static auto *files = new std::map<std::string, FILE *>;
  std::lock_guard g(mu);
  if (auto it = files->find(path); it != files->end()) return it->second;
  FILE *f = fopen(path.c_str(), "wbe");
  if (!f) {
    *err = path + ": " + strerror(errno);
    return nullptr;
  }
  PcapHeader h;
  fwrite(&h, sizeof h, 1, f);
  fflush(f);
  files->emplace(path, f);
  return f;
}

// One IPv4/UDP datagram as the kernel sends it: DF, IP ID 0 (segment i of
// a GSO send: i), the TOS and TTL the packet asked for, UDP checksum 0 (not
// computed here). One record at a time in the file, whoever writes it.
void write_record(FILE *f, Endpoint src, Endpoint dst, uint8_t tos, uint8_t ttl, uint16_t ip_id,
                  const iovec *iov, size_t iovcnt) {
  size_t len = 0;
  for (size_t i = 0; i < iovcnt; i++) len += iov[i].iov_len;
  uint8_t h[28] = {};
  const size_t total = sizeof h + len;
  if (total > 65535) return;
  h[0] = 0x45;
  h[1] = tos;
  wire::be::put16(h + 2, uint16_t(total));
  wire::be::put16(h + 4, ip_id);
  h[6] = 0x40;   // DF
  h[8] = ttl ? ttl : 64;
  h[9] = 17;     // UDP
  wire::be::put32(h + 12, src.ip);
  wire::be::put32(h + 16, dst.ip);
  wire::be::put16(h + 10, ipv4_header_checksum(h, 20));
  const size_t ulen = 8 + len;
  wire::be::put16(h + 20, src.port);
  wire::be::put16(h + 22, dst.port);
  wire::be::put16(h + 24, uint16_t(ulen));
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  RecordHeader r{uint32_t(t.tv_sec), uint32_t(t.tv_nsec), uint32_t(total), uint32_t(total)};
  flockfile(f);
  fwrite(&r, sizeof r, 1, f);
  fwrite(h, sizeof h, 1, f);
  for (size_t i = 0; i < iovcnt; i++) fwrite(iov[i].iov_base, 1, iov[i].iov_len, f);
  funlockfile(f);
}

}  // namespace

void trace_datagram(Endpoint src, Endpoint dst, const uint8_t *p, size_t n) {
  static FILE *f = [] {
    const char *t = getenv("USRC_TRACE");
    std::string err;
    return t && *t ? open_shared(trace_path(t), &err) : nullptr;
  }();
  if (!f) return;
  iovec v{const_cast<uint8_t *>(p), n};
  write_record(f, src, dst, 0, 0, 0, &v, 1);
  fflush(f);
}

std::string trace_path(const std::string &pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); i++) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(getpid());
      i++;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

std::unique_ptr<Nic> TraceNic::wrap(std::unique_ptr<Nic> &inner, const std::string &path,
                                    std::string *err) {
  FILE *f = open_shared(path, err);
  if (!f) return nullptr;
  return std::unique_ptr<Nic>(new TraceNic(std::move(inner), f));
}

TraceNic::TraceNic(std::unique_ptr<Nic> inner, FILE *f) : NicDecorator(std::move(inner)), f_(f) {
  if (LocalPeers *lp = inner_->local_peers()) peers_.emplace(*lp, *this);
}

TraceNic::~TraceNic() { fflush(f_); }

// Calls f(iov, iovcnt, index) for each datagram of a segmented TxPacket
// (gso_size bytes each, the last may be shorter).
template <class F>
static void for_each_segment(const TxPacket &p, F &&f) {
  constexpr size_t kMaxPieces = 32;
  iovec piece[kMaxPieces];
  size_t i = 0, off = 0;   // position in p.iov
  for (uint16_t k = 0; i < p.iovcnt; k++) {
    size_t want = p.gso_size ? p.gso_size : SIZE_MAX, n = 0;
    while (want && i < p.iovcnt && n < kMaxPieces) {
      size_t take = std::min(want, p.iov[i].iov_len - off);
      piece[n++] = {static_cast<uint8_t *>(p.iov[i].iov_base) + off, take};
      want -= take;
      off += take;
      if (off == p.iov[i].iov_len) i++, off = 0;
    }
    f(static_cast<const iovec *>(piece), n, k);
  }
}

void TraceNic::record(Endpoint src, Endpoint dst, uint8_t tos, uint8_t ttl, uint16_t ip_id,
                      const iovec *iov, size_t iovcnt) {
  write_record(f_, src, dst, tos, ttl, ip_id, iov, iovcnt);
}

size_t TraceNic::send(std::span<const TxPacket> pkts) {
  const Endpoint me = inner_->local();
  for (const TxPacket &p : pkts)
    for_each_segment(p, [&](const iovec *iov, size_t n, uint16_t k) {
      record({me.ip, p.src_port ? p.src_port : me.port}, p.dst, p.tos, p.ttl, k, iov, n);
    });
  fflush(f_);
  return inner_->send(pkts);
}

size_t TraceNic::recv(std::span<RxPacket> out) {
  size_t n = inner_->recv(out);
  for (size_t i = 0; i < n; i++) {
    iovec v{const_cast<uint8_t *>(out[i].data), out[i].len};
    const Endpoint to{inner_->local().ip, out[i].dst_port ? out[i].dst_port : inner_->local().port};
    // The IP ID its sender's kernel gave it (a GSO segment's index, a RoCE
    // NIC's counter), which the ICRC tells (wire::solve_ip_id); else 0.
    uint16_t id = 0;
    if (out[i].len >= wire::kMinPacketLen) {
      iovec body{v.iov_base, v.iov_len - wire::kIcrcLen};
      const uint32_t icrc = wire::icrc::get(out[i].data + out[i].len - wire::kIcrcLen);
      const uint32_t icrc0 = wire::icrc_ipv4({out[i].src.ip, to.ip, out[i].src.port, to.port}, &body, 1);
      if (icrc && icrc != icrc0 && !wire::solve_ip_id(icrc0, icrc, out[i].len, &id)) id = 0;
    }
    record(out[i].src, to, 0, 0, id, &v, 1);
  }
  if (n) fflush(f_);
  return n;
}

uint8_t *TraceNic::Peers::tx_begin(Endpoint dst, uint16_t src_port, size_t *room) {
  buf_ = inner_.tx_begin(dst, src_port, room);
  dst_ = dst;
  src_port_ = src_port;
  return buf_;
}

// Recorded as send() records a segmented packet, before the datagrams are
// handed on (after that the slot is the receiver's). The IP TOS and TTL
// are not in a ring: 0, as a received datagram's.
void TraceNic::Peers::tx_end(size_t len, size_t seg) {
  const Endpoint me = t_.inner_->local();
  const size_t step = seg ? seg : len;
  uint16_t k = 0;
  for (size_t off = 0; off < len; off += step, k++) {
    iovec v{buf_ + off, std::min(step, len - off)};
    t_.record({me.ip, src_port_ ? src_port_ : me.port}, dst_, 0, 0, k, &v, 1);
  }
  fflush(t_.f_);
  inner_.tx_end(len, seg);
}

}  // namespace usrc::net
