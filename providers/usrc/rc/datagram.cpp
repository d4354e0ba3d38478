// The unreliable datagram service (IBA 9.8.2, 10.2.5): each SEND is one
// packet (BTH, DETH, [ImmDt], payload) to the address its WR names, done
// once sent; a datagram is taken by a QP that has its Q_Key and a receive
// posted, else dropped (counted). No PSN checks, no ACKs, no retries. (UC's
// responder, the other unreliable one, is responder.cpp's uc_rx.)
#include <cstring>

#include "usrc/net/ipv4.h"
#include "usrc/rc/engine.h"
#include "usrc/rc/packet_view.h"
#include "usrc/wire/opcode.h"

namespace usrc::rc {

using wire::Opcode;

void Engine::post_datagram(Qp &qp, const SendWr &wr, uint32_t len, const UdDest &d) {
  // tx_commit sends along the QP's path: this datagram's, for its packet.
  qp.attr.peer = d.peer;
  qp.attr.tos = d.tos;
  qp.attr.ttl = d.ttl;
  qp.attr.sport = d.sport;
  qp.local.same_host = d.same_host;
  wire::Headers h;
  h.bth.opcode = uint8_t(wr.opcode == WrOpcode::send_imm ? Opcode::UD_SEND_ONLY_IMM : Opcode::UD_SEND_ONLY);
  h.bth.se = wr.flags & kSolicited;
  h.bth.dest_qp = d.qpn;
  h.bth.psn = qp.req.next_psn;
  h.deth = {d.qkey, qp.qpn};
  h.imm_be = wr.imm_be;
  // (Every PSN is sent at once: none is left for the requester's passes.)
  set_sq_psn(qp, psn_add(qp.req.next_psn, 1));
  TxSlot &s = tx_slot();
  const size_t hl = wire::build_headers(h, len, s.hdr);
  size_t pieces = 0;
  for_each_piece(wr.sge, wr.num_sge, 0, len, [&](uint8_t *p, uint32_t n) {
    s.iov[1 + pieces++] = {p, n};
    return true;
  });
  tx_commit(qp, hl, len, pieces);
  tx_flush();   // sent before the WR completes: its buffers are the application's again
  if ((wr.flags & kSignaled) || qp.sq_sig_all) {
    push(qp.send_cq, {wr.wr_id, WcStatus::success, WcOpcode::send, false, false, len, 0, qp.qpn, 0, 0, stamp()});
    completed_at_post.store(true, std::memory_order_relaxed);
  }
}

// A datagram for a UD QP in RTR, RTS or SQD (handle_packet checked that).
void Engine::datagram_rx(Qp &qp, const PacketView &v, size_t pkt_len) {
  const wire::Headers &h = v.p.h;
  if (h.deth.qkey != qp.attr.qkey) {
    count(Counter::qkey_drops);
    return;
  }
  const RecvWqe *r = recv_wqe(qp);
  if (!r) {
    count(Counter::no_recv_drops);
    return;
  }
  const uint32_t len = static_cast<uint32_t>(v.p.payload_len);
  const bool imm = v.p.info->mask & wire::HAS_IMMDT;
  Completion c{r->wr.wr_id, WcStatus::success, WcOpcode::recv, imm, h.bth.se, kGrhLen + len, imm ? h.imm_be : 0,
               qp.qpn, h.deth.src_qp, ud_grh_ipv4 ? uint16_t(0) : slid_of(v.src.ip), stamp()};
  c.grh = ud_grh_ipv4;
  if (r->bad) {
    c.status = WcStatus::loc_prot_err, c.byte_len = 0;   // (an SGE that failed its lkey check)
  } else if (kGrhLen + len > r->length) {
    c.status = WcStatus::loc_len_err;   // (the QP stays as it is: IBA 10.8.3.1 for UD)
    c.byte_len = 0;
  } else {
    uint8_t grh[kGrhLen] = {};
    if (ud_grh_ipv4) {
      // RoCE v2 over IPv4: 20 bytes left undefined (zero), then the IPv4
      // header. (The UDP socket does not tell the datagram's TOS and TTL:
      // 0 and 64.)
      uint8_t *ip = grh + 20;
      const uint32_t total = static_cast<uint32_t>(20 + 8 + pkt_len);
      ip[0] = 0x45;
      ip[2] = uint8_t(total >> 8), ip[3] = uint8_t(total);
      ip[6] = 0x40;   // DF
      ip[8] = 64;
      ip[9] = IPPROTO_UDP;
      const uint32_t src = v.src.ip, dst = nic_->local().ip;
      for (int i = 0; i < 4; i++) ip[12 + i] = uint8_t(src >> (24 - 8 * i)), ip[16 + i] = uint8_t(dst >> (24 - 8 * i));
      const uint16_t sum = net::ipv4_header_checksum(ip, 20);
      ip[10] = uint8_t(sum >> 8), ip[11] = uint8_t(sum);
    }
    if ((ud_grh_ipv4 && !scatter(r->wr.sge, r->wr.num_sge, 0, grh, kGrhLen)) ||
        !scatter(r->wr.sge, r->wr.num_sge, kGrhLen, v.p.payload, len))
      c.status = WcStatus::loc_prot_err, c.byte_len = 0;   // (its buffer unmapped)
  }
  push(qp.recv_cq, c);
  release_recv(qp);
}

}  // namespace usrc::rc
