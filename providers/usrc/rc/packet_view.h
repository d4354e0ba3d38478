#pragma once
#include "usrc/net/nic.h"
#include "usrc/wire/packet.h"

namespace usrc::rc {
// A received, parsed and ICRC-checked packet.
struct PacketView {
  net::Endpoint src;
  wire::Parsed p;
  uint8_t opcode() const { return p.h.bth.opcode; }
  uint32_t psn() const { return p.h.bth.psn; }
};
}  // namespace usrc::rc
