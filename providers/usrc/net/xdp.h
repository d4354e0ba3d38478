// AF_XDP through libxdp: an XSK on queue 0 of the device's netdev receives,
// fed by an XDP program (xdp_steer.bpf.c, attached through a BPF link) that
// steers UDP packets for the process's port to it and passes everything
// else to the kernel. Ethernet/IPv4/UDP frames are built and parsed here, with
// DF set and IP ID 0 like the udp backend (the RoCEv2 ICRC covers both).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

// The largest UDP payload: one UMEM frame (4096 bytes) less the headroom
// the kernel keeps in front of a received frame (XDP_PACKET_HEADROOM) and
// the Ethernet/IPv4/UDP headers. The largest IBA MTU it carries is 2048
// (`usrc link add ... backend xdp` sets no more).
constexpr size_t kXdpMaxPayload = 4096 - 256 - 42;

std::unique_ptr<Nic> open_xdp_nic(Endpoint local, const std::string &netdev, uint32_t rx_batch,
                                  int *errno_out, std::string *err);

}  // namespace usrc::net
