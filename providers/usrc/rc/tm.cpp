// Tag matching, the responder's side (tm.h): a SEND to a QP on a TM SRQ
// is classified at its first packet (tm_receive) and completed at its
// last (tm_complete); in between it is received as any SEND, into the
// WQE it took (RespState::cur for a matched tag). A rendezvous's READ and
// FIN are WQEs of the engine's own on the QP's send queue (kTmInternal).
#include <algorithm>
#include <cstring>

#include "usrc/rc/engine.h"
#include "usrc/rc/packet_view.h"
#include "usrc/rc/psn.h"

namespace usrc::rc {

static uint64_t get_be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = v << 8 | p[i];
  return v;
}

bool Engine::tm_receive(Qp &qp, Request &r) {
  TmRecv &t = qp.resp.tm;
  if (!r.first) return true;   // (the rest of a message: as its first packet said)
  t = {};
  // A SEND with Invalidate, or one too short for a TMH, or whose TMH is
  // no request (a FIN, an unknown opcode): an ordinary receive.
  const uint8_t *p = r.v.p.payload;
  if ((r.mask & wire::HAS_IETH) || r.len < kTmhLen || (p[0] != kTmhEager && p[0] != kTmhRndv && p[0] != kTmhNoTag))
    return true;
  TagList &l = *qp.rq->tm;
  t.priv = static_cast<uint32_t>(get_be(p + 4, 4));
  t.tag = get_be(p + 8, 8);
  // A rendezvous request is matched if it is one packet with the RVH, and
  // not longer than max_rndv_hdr_size.
  const bool rndv = p[0] == kTmhRndv;
  const uint32_t h = p[0] == kTmhNoTag || (rndv && (!r.last || r.len < kTmhLen + kRvhLen || r.len > kTmMaxRndvHdr))
                         ? TagList::kNone
                         : l.match(t.tag);
  if (h != TagList::kNone) {
    // The tag's buffer is the message's WQE; the tag is consumed (a DEL of
    // it fails from now on).
    const RecvWqe &w = l.e[h].wqe;
    copy_wr(qp.resp.cur.wr, w.wr);
    qp.resp.cur.length = w.length;
    qp.resp.cur.bad = w.bad;
    qp.resp.has_cur = true;
    l.remove(h);
    if (!rndv) {
      t.kind = TmRecv::Kind::eager;
      r.skip = kTmhLen;
      r.len -= kTmhLen;
      return true;
    }
    t.va = get_be(p + kTmhLen, 8);
    t.rkey = static_cast<uint32_t>(get_be(p + kTmhLen + 8, 4));
    t.len = static_cast<uint32_t>(get_be(p + kTmhLen + 12, 4));
    // This side READs the data if it can: a QP that sends (RTS), room for
    // the READ and the FIN, a buffer that holds it. Otherwise the request
    // itself goes into the buffer for the application.
    if (qp.state == QpState::rts && qp.tm_wqes + 2 <= kTmWqes && t.len <= w.length) {
      t.kind = TmRecv::Kind::rndv;
      r.skip = r.len;
      r.len = 0;
    } else {
      t.kind = TmRecv::Kind::rndv_sw;
    }
    return true;
  }
  // Unexpected, or no tag asked for: an SRQ WQE (none: RNR, and the
  // message is classified again when it comes back).
  if (qp.rq->empty()) {
    r.err = RespErr::rnr;
    return false;
  }
  t.kind = p[0] == kTmhNoTag ? TmRecv::Kind::no_tag : TmRecv::Kind::unexpected;
  if (t.kind == TmRecv::Kind::unexpected) l.unexp_hw++;
  return true;
}

void Engine::tm_complete(Qp &qp, const Request &r) {
  TmRecv &t = qp.resp.tm;
  const wire::Headers &hd = r.v.p.h;
  const RecvWqe &w = *recv_wqe(qp);
  qp.resp.in_msg = false;
  qp.resp.in_send = true;
  const bool imm = r.mask & wire::HAS_IMMDT;
  Completion c{w.wr.wr_id, WcStatus::success, WcOpcode::tm_recv, imm, hd.bth.se, qp.resp.recv_offset,
               imm ? hd.imm_be : 0, qp.qpn, qp.attr.dest_qpn, qp.attr.dlid, stamp()};
  switch (t.kind) {
    case TmRecv::Kind::eager: c.tm_flags = kWcTmMatch | kWcTmDataValid; break;
    case TmRecv::Kind::rndv: c.tm_flags = kWcTmMatch; break;
    case TmRecv::Kind::rndv_sw:
      c.tm_flags = kWcTmMatch;
      c.status = WcStatus::tm_rndv_incomplete;
      break;
    case TmRecv::Kind::no_tag: c.opcode = WcOpcode::tm_no_tag; break;
    default: break;   // unexpected: no flags, no tag (the application reads the TMH)
  }
  if (c.tm_flags & kWcTmMatch) c.tm_tag = t.tag, c.tm_priv = t.priv;
  push(qp.recv_cq, c);
  if (t.kind == TmRecv::Kind::rndv) {
    // The READ of the sender's data into the tag's buffer (its SGEs cut to
    // the length), completed IBV_WC_TM_RECV with IBV_WC_TM_DATA_VALID
    // (tm_wqe_done) ...
    SendWqe &rd = qp.sq.back();
    rd.wr.wr_id = w.wr.wr_id;
    rd.wr.opcode = WrOpcode::rdma_read;
    rd.wr.flags = kTmInternal;
    rd.wr.remote_va = t.va;
    rd.wr.rkey = t.rkey;
    rd.wr.num_sge = 0;
    for (uint32_t i = 0, left = t.len; i < w.wr.num_sge && left; i++) {   // (their lkeys kept: invalidate_lkey)
      const Sge &g = w.wr.sge[i];
      rd.wr.sge[rd.wr.num_sge++] = {g.addr, std::min(g.length, left), g.lkey};
      left -= std::min(g.length, left);
    }
    tm_post(qp, t.len);
    // ... then, once it is done (fenced), the FIN: a TMH that tells the
    // sender its buffer is free (its receive completes IBV_WC_RECV).
    SendWqe &fin = qp.sq.back();
    fin.wr.wr_id = w.wr.wr_id;
    fin.wr.opcode = WrOpcode::send;
    fin.wr.flags = kTmInternal | kFence;
    fin.wr.imm_be = 0;
    std::memset(fin.inline_data, 0, kTmhLen);
    fin.inline_data[0] = kTmhFin;
    for (int i = 0; i < 4; i++) fin.inline_data[4 + i] = static_cast<uint8_t>(t.priv >> (24 - 8 * i));
    for (int i = 0; i < 8; i++) fin.inline_data[8 + i] = static_cast<uint8_t>(t.tag >> (56 - 8 * i));
    fin.wr.num_sge = 1;
    fin.wr.sge[0] = {fin.inline_data, kTmhLen, 0};
    tm_post(qp, kTmhLen);
  }
  release_recv(qp);
  t.kind = TmRecv::Kind::none;
}

// Queues the WQE at the send queue's back, filled, for the requester (the
// pass's transmit sends it): post_slot's bookkeeping, without sending
// from inside the responder.
void Engine::tm_post(Qp &qp, uint32_t len) {
  SendWqe &w = qp.sq.back();
  qp.local.small_run = false;
  start_wqe(qp, w, len, len <= qp.attr.pmtu ? 1 : (len + qp.attr.pmtu - 1) / qp.attr.pmtu, false);
  qp.req.rd_posted += is_rd_atomic(w.wr.opcode);
  qp.sq.push();
  qp.tm_wqes++;
  qp.req.next_psn = psn_add(qp.req.next_psn, w.npkts);
}

void Engine::tm_wqe_done(Qp &qp, const SendWqe &w, WcStatus st) {
  qp.tm_wqes--;
  if (w.wr.opcode == WrOpcode::rdma_read) {
    // The rendezvous's second completion: the data is in the buffer (or,
    // failed, it is not: the error, no flag).
    Completion c{w.wr.wr_id, st, WcOpcode::tm_recv, false, false, st == WcStatus::success ? w.length : 0, 0,
                 qp.qpn, qp.attr.dest_qpn, qp.attr.dlid, stamp()};
    c.tm_flags = st == WcStatus::success ? kWcTmDataValid : 0;
    push(qp.recv_cq, c);
  } else if (st != WcStatus::success && st != WcStatus::wr_flush_err && hooks_) {
    // A FIN that failed (its data was delivered): the QP fails, which no
    // completion tells.
    hooks_->qp_event(qp, QpEvent::fatal);
  }
}

}  // namespace usrc::rc
