#include "usrc/net/pcap.h"

#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "usrc/common/log.h"

namespace usrc::net {

namespace {

void put16(uint8_t *p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
void put32(uint8_t *p, uint32_t v) { put16(p, uint16_t(v >> 16)); put16(p + 2, uint16_t(v)); }

constexpr uint32_t kLinkTypeIpv4 = 228;
constexpr uint16_t kRoceV2Port = 4791;
constexpr size_t kSnapLen = 65535;

}  // namespace

std::shared_ptr<PcapWriter> PcapWriter::open(const std::string &path_pattern) {
  std::string path = path_pattern;
  if (auto i = path.find("%p"); i != std::string::npos)
    path.replace(i, 2, std::to_string(getpid()));
  FILE *f = std::fopen(path.c_str(), "wbe");
  if (!f) {
    log().error("USRC_TRACE: cannot create {}: {}", path, std::strerror(errno));
    return nullptr;
  }
  // Classic pcap header, native byte order, microsecond timestamps.
  struct {
    uint32_t magic = 0xa1b2c3d4;
    uint16_t major = 2, minor = 4;
    int32_t thiszone = 0;
    uint32_t sigfigs = 0, snaplen = kSnapLen, linktype = kLinkTypeIpv4;
  } hdr;
  std::fwrite(&hdr, sizeof hdr, 1, f);
  std::fflush(f);
  return std::shared_ptr<PcapWriter>(new PcapWriter(f));
}

PcapWriter::~PcapWriter() { std::fclose(f_); }

void PcapWriter::write(Endpoint src, Endpoint dst, const iovec *iov, size_t iovcnt) {
  size_t len = 0;
  for (size_t i = 0; i < iovcnt; i++) len += iov[i].iov_len;
  uint8_t h[28] = {};
  // IPv4: as our sockets send it (DF, IP ID 0, TTL 64), checksum left 0.
  h[0] = 0x45;
  put16(h + 2, uint16_t(28 + len));
  put16(h + 6, 0x4000);
  h[8] = 64;
  h[9] = 17;
  put32(h + 12, src.ip);
  put32(h + 16, dst.ip);
  // UDP, checksum 0 (none): the real source port, destination 4791.
  put16(h + 20, src.port);
  put16(h + 22, kRoceV2Port);
  put16(h + 24, uint16_t(8 + len));
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint32_t rec[4] = {uint32_t(ts.tv_sec), uint32_t(ts.tv_nsec / 1000), uint32_t(28 + len),
                     uint32_t(28 + len)};
  std::lock_guard lk(mu_);
  std::fwrite(rec, sizeof rec, 1, f_);
  std::fwrite(h, sizeof h, 1, f_);
  for (size_t i = 0; i < iovcnt; i++) std::fwrite(iov[i].iov_base, 1, iov[i].iov_len, f_);
  std::fflush(f_);   // a killed process still leaves a readable file
}

size_t PcapNic::send(std::span<const TxPacket> pkts) {
  size_t sent = inner_->send(pkts);   // the first `sent` went out
  for (size_t i = 0; i < sent; i++) w_->write(local(), pkts[i].dst, pkts[i].iov, pkts[i].iovcnt);
  return sent;
}

size_t PcapNic::recv(std::span<RxPacket> out) {
  size_t n = inner_->recv(out);
  for (size_t i = 0; i < n; i++) {
    iovec v{const_cast<uint8_t *>(out[i].data), out[i].len};
    w_->write(out[i].src, local(), &v, 1);
  }
  return n;
}

std::shared_ptr<PcapWriter> trace_writer() {
  static std::shared_ptr<PcapWriter> w = [] {
    const char *p = std::getenv("USRC_TRACE");
    return p && *p ? PcapWriter::open(p) : nullptr;
  }();
  return w;
}

}  // namespace usrc::net
