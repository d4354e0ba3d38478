// libfabric FI_EP_DGRAM endpoints: the backend for kernel-bypass datagram
// NICs (usNIC, EFA) and, through libfabric's `udp` provider, plain sockets.
// Peers live in an address vector; the CQ reports each packet's source as an
// fi_addr (FI_SOURCE), mapped back to the Endpoint it was inserted for.
#pragma once

#include <memory>
#include <string>

#include "usrc/net/nic.h"

namespace usrc::net {

// Opens an endpoint of libfabric provider `prov` ("udp" if empty) bound to
// `local`. nullptr with *err set on failure; *errno_out is EADDRINUSE when the
// port is taken (the caller then tries another slot). *max_payload is the
// largest UDP payload the provider carries. A provider whose datagrams wait
// in a kernel socket (udp) gets its buffers sized to sock_buf.
std::unique_ptr<Nic> open_ofi_nic(Endpoint local, const std::string &prov, uint32_t rx_batch,
                                  uint32_t sock_buf, size_t *max_payload, int *errno_out, std::string *err);

}  // namespace usrc::net
