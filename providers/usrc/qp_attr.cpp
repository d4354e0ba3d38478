// The RC, UC, UD and XRC rows of the IBA's QP state transition table (IBA 11.2.4.2 and the
// ibv_modify_qp man page): which transitions exist, which attributes each
// one requires and which it allows. Pure: no side effects.
#include <array>
#include <cerrno>
#include <span>

#include "usrc/usrc.h"

namespace usrc {

namespace {

struct Rule {
  ibv_qp_state from, to;
  int required, optional;
};

constexpr int kRtrRequired = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsRequired = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
// Alternate paths (APM) are not supported, so IBV_QP_ALT_PATH and
// IBV_QP_PATH_MIG_STATE appear in no row.
constexpr Rule kRules[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR, kRtrRequired, IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_RTR, IBV_QPS_RTS, kRtsRequired,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_RATE_LIMIT},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_RATE_LIMIT},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT |
         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PKEY_INDEX | IBV_QP_AV | IBV_QP_PATH_MTU},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_RATE_LIMIT},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
};

// XRC (the kernel's table): RC's rows, an initiator's access flags and
// responder attributes optional (it takes no requests), a target's retry
// and initiator depth optional (it sends no requests).
template <size_t N>
constexpr std::array<Rule, N> relaxed(const Rule (&rc)[N], ibv_qp_state from, ibv_qp_state to, int bits) {
  std::array<Rule, N> out{};
  for (size_t i = 0; i < N; i++) {
    out[i] = rc[i];
    if (rc[i].from == from && rc[i].to == to) {
      out[i].required &= ~bits;
      out[i].optional |= rc[i].required & bits;
    }
  }
  return out;
}
constexpr auto kXrcIniRules = [] {
  auto r = relaxed(kRules, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_ACCESS_FLAGS);
  Rule a[std::size(kRules)];
  for (size_t i = 0; i < r.size(); i++) a[i] = r[i];
  return relaxed(a, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}();
constexpr auto kXrcTgtRules =
    relaxed(kRules, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);

// UC: RC's path and PSNs, none of its ACK, retry or READ/ATOMIC attributes.
constexpr int kUcPath = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
constexpr Rule kUcRules[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR, kUcPath, IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0, IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_AV | IBV_QP_PATH_MTU},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

// UD: no path, PSNs only to send, and the Q_Key.
constexpr Rule kUdRules[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
    {IBV_QPS_INIT, IBV_QPS_RTR, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
};

}  // namespace

int check_modify_qp(ibv_qp_type type, ibv_qp_state cur, const ibv_qp_attr &attr, int mask, ibv_qp_state *next) {
  if (mask & IBV_QP_CUR_STATE) {
    // The application's idea of the current state must be right (SQE/RTS
    // are the only states it may name, IBA 11.2.4.2).
    if (attr.cur_qp_state != cur) return EINVAL;
  }
  ibv_qp_state to = (mask & IBV_QP_STATE) ? attr.qp_state : cur;
  if (to > IBV_QPS_ERR) return EINVAL;
  *next = to;
  // Any state may go to RESET or ERR, with no other attribute.
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR)
    return (mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE)) ? EINVAL : 0;
  const std::span<const Rule> rules = type == IBV_QPT_UD         ? std::span<const Rule>(kUdRules)
                                      : type == IBV_QPT_UC       ? std::span<const Rule>(kUcRules)
                                      : type == IBV_QPT_XRC_SEND ? std::span<const Rule>(kXrcIniRules)
                                      : type == IBV_QPT_XRC_RECV ? std::span<const Rule>(kXrcTgtRules)
                                                                 : std::span<const Rule>(kRules);
  for (const Rule &r : rules) {
    if (r.from != cur || r.to != to) continue;
    int given = mask & ~IBV_QP_STATE;
    if ((given & r.required) != r.required) return EINVAL;
    if (given & ~(r.required | r.optional)) return EINVAL;
    return 0;
  }
  return EINVAL;
}

}  // namespace usrc
