// Our packets, as tshark's InfiniBand dissector sees them: each built packet
// is dissected as the intended opcode, PSN and destination QP.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/pcap.h"
#include "usrc/wire/icrc.h"
#include "usrc/wire/packet.h"

using namespace usrc;
using wire::Opcode;

int main() {
  if (system("command -v tshark >/dev/null 2>&1") != 0) {
    printf("tshark not installed: skipped\n");
    return 77;
  }
  const Opcode ops[] = {
      Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST,
      Opcode::RC_SEND_LAST_IMM, Opcode::RC_SEND_ONLY, Opcode::RC_SEND_ONLY_IMM,
      Opcode::RC_WRITE_FIRST, Opcode::RC_WRITE_ONLY, Opcode::RC_WRITE_ONLY_IMM,
      Opcode::RC_READ_REQUEST, Opcode::RC_READ_RESPONSE_FIRST, Opcode::RC_READ_RESPONSE_ONLY,
      Opcode::RC_ACKNOWLEDGE, Opcode::RC_COMPARE_SWAP, Opcode::RC_FETCH_ADD,
      Opcode::RC_ATOMIC_ACKNOWLEDGE};
  std::vector<test::UdpFrame> frames;
  uint32_t psn = 0xfffffa;
  for (Opcode op : ops) {
    wire::Headers h;
    h.bth.opcode = uint8_t(op);
    h.bth.psn = psn;
    h.bth.dest_qp = 0x1005;
    h.bth.ack_req = true;
    h.aeth = {op == Opcode::RC_ACKNOWLEDGE ? wire::aeth_nak(wire::NAK_PSN_SEQ) : wire::aeth_ack(), 7};
    std::vector<uint8_t> payload;
    if (wire::opcode_info(h.bth.opcode)->mask & wire::HAS_PAYLOAD) payload.assign(1024, 0xab);
    std::vector<uint8_t> pkt(wire::kMaxHdrLen);
    pkt.resize(wire::build_headers(h, payload.size(), pkt.data()));
    pkt.insert(pkt.end(), payload.begin(), payload.end());
    iovec iov{pkt.data(), pkt.size()};
    uint32_t crc = wire::icrc_ipv4({0x7f000001, 0x7f000001, 20001, wire::kRoceV2Port}, &iov, 1);
    pkt.resize(pkt.size() + 4);
    wire::store_icrc(pkt.data() + pkt.size() - 4, crc);
    frames.push_back({0x7f000001, 0x7f000001, 20001, wire::kRoceV2Port, 0, true, pkt});
    psn = (psn + 1) & 0xffffff;
  }
  char path[] = "/tmp/usrc-tshark-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  test::write_pcap(path, frames);
  std::string cmd = std::string("tshark -r ") + path +
                    " -T fields -E separator=, -e infiniband.bth.opcode -e infiniband.bth.psn"
                    " -e infiniband.bth.destqp 2>/dev/null";
  FILE *p = popen(cmd.c_str(), "r");
  char line[256];
  size_t i = 0;
  int bad = 0;
  while (p && fgets(line, sizeof line, p)) {
    unsigned op = 0, ps = 0, qp = 0;
    if (i >= frames.size() || sscanf(line, "%u,%u,%x", &op, &ps, &qp) != 3 ||
        op != unsigned(ops[i]) || ps != ((0xfffffau + i) & 0xffffff) || qp != 0x1005) {
      fprintf(stderr, "packet %zu: tshark says '%s', wanted opcode %u\n", i, line, unsigned(ops[i]));
      bad++;
    }
    i++;
  }
  if (p) pclose(p);
  unlink(path);
  if (i != frames.size()) {
    fprintf(stderr, "tshark dissected %zu of %zu packets\n", i, frames.size());
    return 1;
  }
  if (bad) return 1;
  printf("tshark dissected all %zu packets as intended\n", i);
  return 0;
}
