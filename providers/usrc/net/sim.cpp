#include "usrc/net/sim.h"

#include <algorithm>
#include <cstring>

namespace usrc::net {

uint64_t SimNetwork::next_delivery() const {
  return flight_.empty() ? UINT64_MAX : flight_.begin()->first;
}

void SimNetwork::submit(Endpoint src, const TxPacket &p) {
  stats.sent++;
  if (partitioned_[key(src)] || partitioned_[key(p.dst)] || chance(faults_.drop)) {
    stats.dropped++;
    return;
  }
  std::vector<uint8_t> data;
  for (size_t i = 0; i < p.iovcnt; i++) {
    auto *b = static_cast<const uint8_t *>(p.iov[i].iov_base);
    data.insert(data.end(), b, b + p.iov[i].iov_len);
  }
  if (drop_if && drop_if(data)) {
    stats.dropped++;
    return;
  }
  if (tap) tap(data);
  if (!data.empty() && chance(faults_.corrupt)) {
    stats.corrupted++;
    if (faults_.udp_checksum) return;   // (the receiving kernel's checksum finds it)
    data[std::uniform_int_distribution<size_t>(0, data.size() - 1)(rng_)] ^= 0x5a;
  }
  int copies = chance(faults_.duplicate) ? 2 : 1;
  if (copies == 2) stats.duplicated++;
  for (int c = 0; c < copies; c++) {
    uint64_t at = now_ + faults_.delay_ns;
    if (chance(faults_.reorder)) {
      stats.reordered++;
      at += faults_.reorder_extra_ns;
    }
    // seq keeps same-time packets in send order (multimap keeps insertion order).
    flight_.emplace(at, InFlight{at, seq_++, src, p.dst, data});
  }
}

size_t SimNic::send(std::span<const TxPacket> pkts) {
  for (const auto &p : pkts) net_.submit(local_, p);
  return pkts.size();
}

uint8_t *SimNic::tx_begin(Endpoint dst, uint16_t, size_t *room) {
  if (!net_.loopback) return nullptr;
  tx_buf_.assign(4352, 0);   // (the shared-memory ring's slot size)
  tx_dst_ = dst;
  *room = tx_buf_.size();
  return tx_buf_.data();
}

void SimNic::tx_end(size_t len, size_t seg) {
  for (size_t off = 0; off < len; off += seg) {
    iovec iov{tx_buf_.data() + off, std::min(seg, len - off)};
    net_.stats.in_place++;
    net_.submit(local_, TxPacket{tx_dst_, &iov, 1});
  }
}

size_t SimNic::recv(std::span<RxPacket> out) {
  held_.clear();
  if (const size_t most = net_.rx_batch_[SimNetwork::key(local_)]) out = out.first(std::min(most, out.size()));
  size_t n = 0;
  for (auto it = net_.flight_.begin(); it != net_.flight_.end() && n < out.size();) {
    if (it->first > net_.now_) break;
    if (it->second.dst == local_) {
      if (net_.partitioned_[SimNetwork::key(local_)]) {
        net_.stats.dropped++;
      } else {
        held_.push_back(std::move(it->second.data));
        out[n++] = {it->second.src, held_.back().data(), held_.back().size()};
      }
      it = net_.flight_.erase(it);
    } else {
      ++it;
    }
  }
  // held_ may have reallocated while growing: refresh the pointers.
  for (size_t i = 0; i < n; i++) out[i].data = held_[i].data();
  return n;
}

}  // namespace usrc::net
