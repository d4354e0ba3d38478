// RMPP sender and receiver (IBA vol. 1 13.6.3-13.6.5; the SA's
// description of the same protocol is 15.4). Recovery is the IBA's
// go-back-N: the receiver keeps only in-order segments, discards the rest
// and asks for the missing one by ACKing the last segment it has (the
// "resend request"); the sender then resends from the one after it. A
// window's last segment and the Last segment are ACKed; a timer on each
// side resends (sender: the unacknowledged segments; receiver: its last
// ACK) and, after max_retries, aborts with a status.
#include "usrc/cm/rmpp.h"

#include <algorithm>
#include <cstring>

namespace usrc::sa {

RmppSender::RmppSender(const SaMad &proto, std::vector<uint8_t> payload, const RmppTimers &t)
    : proto_(proto), payload_(std::move(payload)), t_(t) {
  seg_count_ = std::max<uint32_t>(1, uint32_t((payload_.size() + kSaData - 1) / kSaData));
  pad_ = uint32_t(seg_count_ * kSaData - payload_.size());
}

SaMad RmppSender::segment(uint32_t n) const {
  SaMad m = proto_;
  m.rmpp.version = kRmppVersion;
  m.rmpp.type = kRmppData;
  m.rmpp.resp_time = kNoRespTime;
  m.rmpp.flags = kRmppActive;
  m.rmpp.status = kRmppOk;
  m.rmpp.seg = n;
  m.rmpp.len = 0;
  // PayloadLength: the whole transfer in the first segment, the last
  // segment's own bytes in the last (both count the 20-byte SA header
  // each segment repeats; sa_mad.h).
  if (n == 1) {
    m.rmpp.flags |= kRmppFirst;
    m.rmpp.len = uint32_t(seg_count_ * kRmppPayload - pad_);
  }
  if (n == seg_count_) {
    m.rmpp.flags |= kRmppLast;
    m.rmpp.len = uint32_t(kRmppPayload - pad_);
  }
  std::memset(m.data, 0, kSaData);
  const size_t off = size_t(n - 1) * kSaData;
  if (off < payload_.size())
    std::memcpy(m.data, payload_.data() + off, std::min(kSaData, payload_.size() - off));
  return m;
}

void RmppSender::start(uint64_t now, std::vector<SaMad> &out) { send_window(now, out); }

// Sends what the window allows; the Response Timer runs while anything
// sent is unacknowledged.
void RmppSender::send_window(uint64_t now, std::vector<SaMad> &out) {
  const uint32_t end = std::min(newwin_, seg_count_);
  for (; next_ <= end; next_++) {
    out.push_back(segment(next_));
    stats.segments_sent++;
  }
  deadline_ = now + t_.response_ns;
}

void RmppSender::abort(uint8_t status, std::vector<SaMad> &out) {
  SaMad m = proto_;
  m.rmpp = Rmpp{kRmppVersion, kRmppAbort, kNoRespTime, kRmppActive, status, 0, 0};
  std::memset(m.data, 0, kSaData);
  out.push_back(m);
  stats.aborts_sent++;
  state_ = State::aborted;
  status_ = status;
}

void RmppSender::on_mad(const SaMad &m, uint64_t now, std::vector<SaMad> &out) {
  if (state_ != State::sending) return;
  if (m.rmpp.type == kRmppStop || m.rmpp.type == kRmppAbort) {
    stats.aborts_rcvd++;
    state_ = State::aborted;
    status_ = m.rmpp.status;
    return;
  }
  if (m.rmpp.type != kRmppAck) {
    stats.malformed++;
    return abort(kRmppBadType, out);
  }
  stats.acks_rcvd++;
  const uint32_t seg = m.rmpp.seg, win = m.rmpp.len;
  // IBA 13.6.3.3: an ACK beyond what was sent, or a window that ends
  // before the segment it acknowledges, ends the transfer.
  if (seg >= next_ || seg > seg_count_) return abort(kRmppSegmentTooBig, out);
  if (win < seg) return abort(kRmppWindowTooSmall, out);
  if (seg < last_ack_) {   // older than one already taken: a late duplicate
    stats.duplicates++;
    return;
  }
  if (seg > last_ack_) {
    last_ack_ = seg;
    retries_ = 0;
  }
  newwin_ = std::max(newwin_, std::min(win, seg_count_));
  if (last_ack_ == seg_count_) {
    state_ = State::done;
    return;
  }
  // An ACK short of what was sent asks for the rest again (go-back-N).
  if (seg + 1 < next_) {
    stats.segments_resent += next_ - 1 - seg;
    next_ = seg + 1;
  }
  send_window(now, out);
}

void RmppSender::tick(uint64_t now, std::vector<SaMad> &out) {
  if (state_ != State::sending || now < deadline_) return;
  stats.timeouts++;
  if (++retries_ > t_.max_retries) return abort(kRmppTooManyRetries, out);
  stats.segments_resent += next_ - 1 - last_ack_;
  next_ = last_ack_ + 1;
  send_window(now, out);
}

SaMad RmppReceiver::ack(uint32_t seg, uint32_t newwin) const {
  SaMad m = first_;
  m.hdr.method = uint8_t(first_.hdr.method & ~kResponseBit);   // ACKs travel as the request's method
  m.rmpp = Rmpp{kRmppVersion, kRmppAck, kNoRespTime, kRmppActive, kRmppOk, seg, newwin};
  std::memset(m.data, 0, kSaData);
  return m;
}

void RmppReceiver::abort(uint8_t status, std::vector<SaMad> &out) {
  SaMad m = ack(0, 0);
  m.rmpp.type = kRmppAbort;
  m.rmpp.status = status;
  out.push_back(m);
  stats.aborts_sent++;
  state_ = State::aborted;
  status_ = status;
}

void RmppReceiver::on_mad(const SaMad &m, uint64_t now, std::vector<SaMad> &out) {
  if (state_ == State::aborted) return;
  if (expected_ == 1 && state_ == State::receiving) first_ = m;   // the headers ACKs and ABORTs carry
  if (m.rmpp.type == kRmppStop || m.rmpp.type == kRmppAbort) {
    if (state_ != State::receiving) return;
    stats.aborts_rcvd++;
    state_ = State::aborted;
    status_ = m.rmpp.status ? m.rmpp.status : uint8_t(kRmppUnspecified);
    return;
  }
  if (m.rmpp.version != kRmppVersion) {
    stats.malformed++;
    if (state_ == State::receiving) abort(kRmppBadVersion, out);
    return;
  }
  if (m.rmpp.type != kRmppData) {
    stats.malformed++;
    if (state_ == State::receiving) abort(kRmppBadType, out);
    return;
  }
  const uint32_t seg = m.rmpp.seg;
  const bool first = m.rmpp.flags & kRmppFirst, last = m.rmpp.flags & kRmppLast;
  // A segment already taken: our ACK may have been lost. Answer the one
  // the sender waits on (the last ACKed) and let the rest pass.
  if (seg < expected_ && seg != 0) {
    stats.duplicates++;
    if (seg == last_acked_) {
      out.push_back(ack(last_acked_, state_ == State::done ? last_acked_ : ack_at_));
      stats.acks_sent++;
    }
    return;
  }
  if (state_ != State::receiving) return;
  if (seg == 0 || (first && seg != 1) || (seg == 1 && !first)) {
    stats.malformed++;
    return abort(kRmppBadFirstSegment, out);
  }
  if (seg > expected_) {
    // A gap: keep nothing beyond it and ask once for the missing segment
    // (IBA 15.4.3 "segment error recovery"; the Segment Timer asks again).
    stats.discarded++;
    if (!gap_acked_) {
      gap_acked_ = true;
      out.push_back(ack(expected_ - 1, ack_at_));
      stats.acks_sent++;
    }
    return;
  }
  if (first) {
    const uint32_t len = m.rmpp.len;
    if (len < kSaHdrLen || len > kMaxRmppPayload) {
      stats.malformed++;
      return abort(kRmppBadLength, out);
    }
    total_segs_ = uint32_t((len + kRmppPayload - 1) / kRmppPayload);
    payload_.reserve(size_t(total_segs_) * kSaData);
    first_ = m;
  }
  if (seg > total_segs_ || (last && seg != total_segs_) || (!last && seg == total_segs_)) {
    stats.malformed++;
    return abort(last ? kRmppBadLength : kRmppSegmentTooBig, out);
  }
  size_t bytes = kSaData;
  if (last) {
    if (m.rmpp.len < kSaHdrLen || m.rmpp.len > kRmppPayload) {
      stats.malformed++;
      return abort(kRmppBadLength, out);
    }
    bytes = m.rmpp.len - kSaHdrLen;
  }
  payload_.insert(payload_.end(), m.data, m.data + bytes);
  expected_ = seg + 1;
  gap_acked_ = false;
  retries_ = 0;
  deadline_ = now + t_.segment_ns;
  if (last) {
    state_ = State::done;
    last_acked_ = seg;
    out.push_back(ack(seg, seg));
    stats.acks_sent++;
  } else if (seg >= ack_at_) {
    ack_at_ = seg + t_.window;
    last_acked_ = seg;
    out.push_back(ack(seg, ack_at_));
    stats.acks_sent++;
  }
}

void RmppReceiver::tick(uint64_t now, std::vector<SaMad> &out) {
  if (state_ != State::receiving || now < deadline_) return;
  stats.timeouts++;
  if (++retries_ > t_.max_retries) return abort(kRmppTotalTimeTooLong, out);
  // Ask again for what is missing: the ACK of the last in-order segment.
  out.push_back(ack(expected_ - 1, ack_at_));
  stats.acks_sent++;
  deadline_ = now + t_.segment_ns;
}

}  // namespace usrc::sa
