// AF_XDP: one XSK on queue 0 of the device's netdev, fed by an XDP program
// that steers UDP packets for usrc's ports to it and passes everything else
// to the kernel. Ethernet/IPv4/UDP frames are built and parsed here, with
// DF set and IP ID 0 like the udp backend (the RoCEv2 ICRC covers both).
#pragma once

#include <memory>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

std::unique_ptr<Nic> open_xdp_nic(Endpoint local, const std::string &netdev, uint32_t rx_batch,
                                  int *errno_out, std::string *err);

}  // namespace usrc::net
