#include "usrc/wire/packet.h"

namespace usrc::wire {

const char *to_string(ParseError e) {
  switch (e) {
    case ParseError::ok: return "ok";
    case ParseError::too_short: return "too short";
    case ParseError::bad_opcode: return "unknown opcode";
    case ParseError::bad_tver: return "unsupported transport header version";
    case ParseError::bad_pad: return "pad count not allowed (larger than the payload, or on a packet without one or not ending a message)";
    case ParseError::bad_length: return "payload length not allowed (not 4-byte aligned with its pad, or on an opcode without payload)";
    case ParseError::bad_icrc: return "bad ICRC";
  }
  return "?";
}

size_t build_headers(const Headers &h, size_t payload_len, uint8_t *out) {
  const OpcodeInfo *info = opcode_info(h.bth.opcode);
  if (!info) return 0;
  const HdrOut o{out, info};
  const Bth &b = h.bth;
  bth::put_words(out, bth::word0(b.opcode, b.se, pad_for(payload_len), b.mig_req, b.tver, b.pkey),
                 bth::word1(b.dest_qp, b.fecn, b.becn), bth::word2(b.psn, b.ack_req));
  if (o.has(HAS_DETH)) deth::put(o.at(DETH), h.deth.qkey, h.deth.src_qp);
  if (o.has(HAS_RETH)) reth::put(o.at(RETH), h.reth.va, h.reth.rkey, h.reth.dma_len);
  if (o.has(HAS_ATOMICETH))
    atomiceth::put(o.at(ATOMICETH), h.atomic.va, h.atomic.rkey, h.atomic.swap_add, h.atomic.compare);
  if (o.has(HAS_AETH)) aeth::put(o.at(AETH), h.aeth.syndrome, h.aeth.msn);
  if (o.has(HAS_ATOMICACKETH)) atomicacketh::put(o.at(ATOMICACKETH), h.atomic_ack);
  if (o.has(HAS_IMMDT)) immdt::put_be(o.at(IMMDT), h.imm_be);
  if (o.has(HAS_IETH)) ieth::put(o.at(IETH), h.ieth);
  if (o.has(HAS_XRCETH)) xrceth::put(o.at(XRCETH), h.xrc_srqn);
  return info->hdr_len;
}

ParseError parse(const uint8_t *buf, size_t len, Parsed &out) {
  if (len < kMinPacketLen) return ParseError::too_short;
  const OpcodeInfo *info = opcode_info(bth::opcode(buf));
  if (!info) return ParseError::bad_opcode;
  const uint32_t m = info->mask;
  if (len < info->hdr_len + kIcrcLen) return ParseError::too_short;
  const HdrView v{buf, info};
  // Each header is read into a local before any store to `out`, which the
  // compiler must otherwise assume may alias buf. Every field of out.h is
  // written: absent headers as zero.
  const Bth b{bth::opcode(buf), bth::se(buf),   bth::mig_req(buf), bth::pad(buf),
              bth::tver(buf),   bth::pkey(buf), bth::fecn(buf),    bth::becn(buf),
              bth::qpn(buf),    bth::ack_req(buf), bth::psn(buf)};
  if (b.tver != 0) return ParseError::bad_tver;
  Headers &h = out.h;
  h.bth = b;
  h.deth = (m & HAS_DETH) ? Deth{v.qkey(), v.src_qp()} : Deth{};
  h.reth = (m & HAS_RETH) ? Reth{v.reth_va(), v.reth_rkey(), v.reth_len()} : Reth{};
  h.atomic = (m & HAS_ATOMICETH)
                 ? AtomicEth{v.atomic_va(), v.atomic_rkey(), v.atomic_swap_add(), v.atomic_compare()}
                 : AtomicEth{};
  h.aeth = (m & HAS_AETH) ? Aeth{v.syndrome(), v.msn()} : Aeth{};
  h.atomic_ack = (m & HAS_ATOMICACKETH) ? v.atomic_orig() : 0;
  h.imm_be = (m & HAS_IMMDT) ? v.imm_be() : 0;
  h.ieth = (m & HAS_IETH) ? v.ieth_rkey() : 0;
  h.xrc_srqn = (m & HAS_XRCETH) ? v.xrc_srqn() : 0;
  size_t body = len - info->hdr_len - kIcrcLen;   // payload + pad
  if (!(m & HAS_PAYLOAD)) {
    // ACKs, READ requests and atomics carry no payload and no pad.
    if (body != 0) return ParseError::bad_length;
    if (b.pad_cnt) return ParseError::bad_pad;
  } else {
    if (body < b.pad_cnt) return ParseError::bad_pad;
    if ((body & 3) != 0) return ParseError::bad_length;   // payload + pad is 4-byte aligned
    // FIRST and MIDDLE packets carry exactly one PMTU (IBA ch. 9, packet
    // sequencing), a multiple of 4, so only a packet ending its message pads.
    if (b.pad_cnt && !(m & IS_LAST)) return ParseError::bad_pad;
  }
  out.info = info;
  out.bth = buf;
  out.payload = v.payload();
  out.payload_len = body - b.pad_cnt;
  out.icrc = icrc::get(buf + len - kIcrcLen);
  return ParseError::ok;
}

}  // namespace usrc::wire
