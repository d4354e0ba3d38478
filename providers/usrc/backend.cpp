// The context's NIC: the device's backend (Backend, common/device.h) on a
// free process slot, and the decorators that apply over it.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "usrc/common/log.h"
#include "usrc/common/random.h"
#include "usrc/common/tunables.h"
#include "usrc/net/ofi.h"
#include "usrc/net/shm.h"
#include "usrc/net/trace.h"
#include "usrc/rc/types.h"
#include "usrc/net/udp.h"
#include "usrc/net/xdp.h"
#include "usrc/usrc.h"

namespace usrc {

std::unique_ptr<net::Nic> open_nic(const DeviceConfig &cfg, uint32_t *slot, uint32_t *window,
                                   std::string *err) {
  const Tunables &t = Tunables::get();

  // Pick a free process slot: its UDP port is base_port + slot. Start at a
  // random slot: concurrent openers rarely collide, and a process restarted
  // with the same pid (a fresh pid namespace) does not get its
  // predecessor's slot, hence QPNs and port, back: its predecessor's
  // packets still on their way find no QP.
  std::unique_ptr<net::Nic> nic;
  uint32_t rcvbuf = 0;
  size_t max_payload = SIZE_MAX;
  uint32_t start = random_u32() % kMaxSlots;
  for (uint32_t i = 0; i < kMaxSlots && !nic; i++) {
    *slot = 1 + (start + i) % kMaxSlots;
    if (uint32_t(cfg.base_port) + *slot > 65535) continue;
    int e = 0;
    net::Endpoint local{cfg.ipv4, static_cast<uint16_t>(cfg.base_port + *slot)};
    if (cfg.backend == Backend::udp) {
      auto u = net::UdpNic::open(local, t.sock_buf, t.rx_batch, t.gso, &e, err);
      if (u) rcvbuf = u->rcvbuf();
      // Peers on other hosts send to the RoCE v2 port (docs/design.md
      // "Addressing"); a loopback address has none but this host's, which
      // send to base_port + slot.
      std::string rerr;
      if (u && cfg.roce_port_in_use() &&
          !u->join_roce(cfg.roce_port, uint16_t(*slot), root_dir() + "/roce", t.sock_buf, &rerr))
        log().warn("{}: no RoCE v2 port, only peers that send to port {} + slot reach this process: {}",
                   cfg.name, cfg.base_port, rerr);
      nic = std::move(u);
    } else if (cfg.backend == Backend::ofi) {
#ifdef USRC_HAVE_OFI
      nic = net::open_ofi_nic(local, cfg.provider, t.rx_batch, t.sock_buf, &max_payload, &e, err);
#else
      *err = "backend ofi: this usrc was built without libfabric (libfabric-dev)";
      return nullptr;
#endif
    } else if (cfg.backend == Backend::xdp) {
#ifdef USRC_HAVE_XDP
      nic = net::open_xdp_nic(local, cfg.netdev, t.rx_batch, &e, err);
      max_payload = net::kXdpMaxPayload;
#else
      *err = "backend xdp: this usrc was built without AF_XDP support (libxdp-dev, libbpf-dev, clang)";
      return nullptr;
#endif
    }
    if (!nic && e == EBUSY && err->empty()) return nullptr;   // nested libfabric probe
    if (!nic && e != EADDRINUSE) {
      *err = std::string("cannot open the ") + backend_name(cfg.backend) +
             " NIC on the device address (" + *err + "); is " + cfg.netdev +
             " up with that address in this network namespace?";
      return nullptr;
    }
  }
  if (!nic) {
    *err = "no free UDP port in the device's range";
    return nullptr;
  }
  // The largest packet: a full PMTU payload plus BTH, RETH/ImmDt and ICRC.
  if (max_payload < cfg.active_mtu + 64) {
    *err = "the NIC carries at most " + std::to_string(max_payload) + " bytes: MTU " +
           std::to_string(cfg.active_mtu) + " is too large";
    return nullptr;
  }
  // Size the send window to what the peer's socket buffer can hold (we
  // assume the peer is configured like us): loss from buffer overflow would
  // otherwise be the common case on loopback. It must also cover the time
  // a receiver on a busy host is not running (milliseconds): a sender whose
  // window is full waits for it, however fast the link. Backends with
  // their own receive rings get a fixed window below their ring size.
  uint32_t per_pkt = cfg.active_mtu + 1024;
  *window = t.tx_window ? t.tx_window
            : rcvbuf    ? std::clamp<uint32_t>(rcvbuf / (2 * per_pkt), rc::kMinWindow, rc::kMaxWindow)
                        : 64;
  std::unique_ptr<net::Nic> dev = std::move(nic);
  if (cfg.backend == Backend::udp && t.shm) {
    // Peers on this host: through shared memory (net/shm.h).
    std::string serr;
    if (auto s = net::ShmNic::wrap(dev, &serr)) dev = std::move(s);
    else log().warn("{}: no shared-memory ring, peers on this host use the socket: {}", cfg.name, serr);
  }
  if (const char *trace = getenv("USRC_TRACE"); trace && *trace) {
    // Packet capture (usrc trace): every datagram to a pcap file.
    std::string path = net::trace_path(trace), terr;
    if (auto t = net::TraceNic::wrap(dev, path, &terr)) dev = std::move(t);
    else log().warn("{}: no trace: {}", cfg.name, terr);
  }
  return dev;
}

}  // namespace usrc
