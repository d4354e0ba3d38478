// The Reliable Multi-Packet Transaction Protocol (IBA vol. 1 13.6, the SA's
// multi-MAD transfers of 15.4 built on it): the sender of a segmented
// transfer (the SA answering a GetTable) and its receiver (the requester).
// Pure state machines: they are given MADs and the time and return the
// MADs to send; no I/O, no clock of their own (the tests drive them over
// net/sim.cpp's virtual time). docs/sa.md tells the whole protocol.
#pragma once

#include <cstdint>
#include <vector>

#include "usrc/cm/sa_mad.h"

namespace usrc::sa {

struct RmppTimers {
  // Response Timeout (IBA 13.6.3.2: 2 x flight + processing): how long the
  // sender waits for the ACK of a window's last segment.
  uint64_t response_ns = 400'000'000;
  // Segment Timeout (flight + processing): the longest silence the
  // receiver bears while segments are still expected.
  uint64_t segment_ns = 350'000'000;
  // Retries of either before the transfer is aborted (IBA: at most seven).
  unsigned max_retries = 7;
  uint32_t window = 16;   // the receiver's window: segments per ACK
};

// Counted by both sides; the owner sums them into its statistics.
struct RmppStats {
  uint64_t segments_sent = 0, segments_resent = 0, acks_sent = 0, acks_rcvd = 0;
  uint64_t timeouts = 0, duplicates = 0, discarded = 0, malformed = 0;
  uint64_t aborts_sent = 0, aborts_rcvd = 0;
};

// The sender. `proto` is the response's first MAD (common and SA headers,
// copied into every segment); `payload` the records, AttributeOffset apart.
class RmppSender {
 public:
  RmppSender(const SaMad &proto, std::vector<uint8_t> payload, const RmppTimers &t);
  // The first segment. The window opens as the receiver ACKs (it starts at 1).
  void start(uint64_t now, std::vector<SaMad> &out);
  // An RMPP MAD of this transfer from the receiver (ACK, STOP, ABORT).
  void on_mad(const SaMad &m, uint64_t now, std::vector<SaMad> &out);
  void tick(uint64_t now, std::vector<SaMad> &out);
  uint64_t deadline() const { return state_ == State::sending ? deadline_ : UINT64_MAX; }

  enum class State { sending, done, aborted };
  State state() const { return state_; }
  uint8_t status() const { return status_; }   // why it was aborted
  uint32_t seg_count() const { return seg_count_; }
  RmppStats stats;

 private:
  SaMad segment(uint32_t n) const;
  void send_window(uint64_t now, std::vector<SaMad> &out);
  void abort(uint8_t status, std::vector<SaMad> &out);

  SaMad proto_;
  std::vector<uint8_t> payload_;
  RmppTimers t_;
  uint32_t seg_count_ = 1, pad_ = 0;
  uint32_t last_ack_ = 0;   // every segment up to it is acknowledged
  uint32_t newwin_ = 1;     // the receiver lets us send up to it
  uint32_t next_ = 1;       // the next segment to send
  unsigned retries_ = 0;
  uint64_t deadline_ = UINT64_MAX;
  State state_ = State::sending;
  uint8_t status_ = kRmppOk;
};

// The receiver: made on the first DATA segment of a transfer it expects.
class RmppReceiver {
 public:
  explicit RmppReceiver(const RmppTimers &t) : t_(t) {}
  // A MAD of this transfer (DATA, STOP, ABORT) from the sender. `out`
  // gets the ACKs (or an ABORT).
  void on_mad(const SaMad &m, uint64_t now, std::vector<SaMad> &out);
  void tick(uint64_t now, std::vector<SaMad> &out);
  uint64_t deadline() const { return state_ == State::receiving ? deadline_ : UINT64_MAX; }

  enum class State { receiving, done, aborted };
  State state() const { return state_; }
  uint8_t status() const { return status_; }   // RMPPStatus of an abort, either side's
  // The first segment (its headers) and the records of all, once done.
  const SaMad &first() const { return first_; }
  const std::vector<uint8_t> &payload() const { return payload_; }
  RmppStats stats;

 private:
  SaMad ack(uint32_t seg, uint32_t newwin) const;
  void abort(uint8_t status, std::vector<SaMad> &out);

  RmppTimers t_;
  SaMad first_;
  std::vector<uint8_t> payload_;
  uint32_t expected_ = 1;     // the next segment in order
  uint32_t ack_at_ = 1;       // the window's last segment: ACKed on arrival
  uint32_t last_acked_ = 0;   // the segment the last ACK named
  uint32_t total_segs_ = 0;   // from the first segment's PayloadLength
  bool gap_acked_ = false;    // a resend request for expected_ went out
  unsigned retries_ = 0;
  uint64_t deadline_ = UINT64_MAX;
  State state_ = State::receiving;
  uint8_t status_ = kRmppOk;
};

// Transfers larger than this are refused (the receiver aborts with
// kRmppBadLength): bounds the memory a peer can make us hold.
constexpr uint32_t kMaxRmppPayload = 64u << 20;

}  // namespace usrc::sa
