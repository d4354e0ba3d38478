// The IBA modify_qp rules for RC and UD: legal and illegal transitions, required
// and forbidden attributes.
#include <catch2/catch.hpp>

#include "usrc/usrc.h"

using usrc::check_modify_qp;

static int check(ibv_qp_state cur, ibv_qp_state to, int mask, ibv_qp_state *next = nullptr,
                 ibv_qp_type type = IBV_QPT_RC) {
  ibv_qp_attr a{};
  a.qp_state = to;
  ibv_qp_state n;
  int r = check_modify_qp(type, cur, a, mask | IBV_QP_STATE, &n);
  if (next) *next = n;
  return r;
}

constexpr int kInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtr = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRts = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                     IBV_QP_MAX_QP_RD_ATOMIC;

TEST_CASE("the RC connection sequence is legal", "[qp]") {
  ibv_qp_state n;
  CHECK(check(IBV_QPS_RESET, IBV_QPS_INIT, kInit, &n) == 0);
  CHECK(n == IBV_QPS_INIT);
  CHECK(check(IBV_QPS_INIT, IBV_QPS_RTR, kRtr) == 0);
  CHECK(check(IBV_QPS_RTR, IBV_QPS_RTS, kRts) == 0);
  CHECK(check(IBV_QPS_RTS, IBV_QPS_SQD, 0) == 0);
  CHECK(check(IBV_QPS_SQD, IBV_QPS_RTS, 0) == 0);
  CHECK(check(IBV_QPS_SQE, IBV_QPS_RTS, 0) == 0);
  CHECK(check(IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_ACCESS_FLAGS) == 0);
  CHECK(check(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER) == 0);
}

TEST_CASE("every state may go to RESET and ERR with no other attribute", "[qp]") {
  for (auto s : {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD,
                 IBV_QPS_SQE, IBV_QPS_ERR}) {
    CHECK(check(s, IBV_QPS_RESET, 0) == 0);
    CHECK(check(s, IBV_QPS_ERR, 0) == 0);
    CHECK(check(s, IBV_QPS_ERR, IBV_QP_TIMEOUT) == EINVAL);
  }
}

TEST_CASE("illegal transitions are refused", "[qp]") {
  CHECK(check(IBV_QPS_RESET, IBV_QPS_RTR, kRtr) == EINVAL);
  CHECK(check(IBV_QPS_RESET, IBV_QPS_RTS, kRts) == EINVAL);
  CHECK(check(IBV_QPS_INIT, IBV_QPS_RTS, kRts) == EINVAL);
  CHECK(check(IBV_QPS_RTR, IBV_QPS_INIT, kInit) == EINVAL);
  CHECK(check(IBV_QPS_ERR, IBV_QPS_RTS, 0) == EINVAL);
  CHECK(check(IBV_QPS_ERR, IBV_QPS_INIT, kInit) == EINVAL);
  CHECK(check(IBV_QPS_RTS, IBV_QPS_RTR, kRtr) == EINVAL);
}

TEST_CASE("a missing required attribute is refused", "[qp]") {
  for (int bit = 0; bit < 21; bit++) {
    int b = 1 << bit;
    if (kInit & b) CHECK(check(IBV_QPS_RESET, IBV_QPS_INIT, kInit & ~b) == EINVAL);
    if (kRtr & b) CHECK(check(IBV_QPS_INIT, IBV_QPS_RTR, kRtr & ~b) == EINVAL);
    if (kRts & b) CHECK(check(IBV_QPS_RTR, IBV_QPS_RTS, kRts & ~b) == EINVAL);
  }
}

TEST_CASE("a forbidden attribute is refused", "[qp]") {
  CHECK(check(IBV_QPS_RESET, IBV_QPS_INIT, kInit | IBV_QP_SQ_PSN) == EINVAL);
  CHECK(check(IBV_QPS_INIT, IBV_QPS_RTR, kRtr | IBV_QP_SQ_PSN) == EINVAL);
  CHECK(check(IBV_QPS_RTR, IBV_QPS_RTS, kRts | IBV_QP_DEST_QPN) == EINVAL);
  CHECK(check(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_PATH_MTU) == EINVAL);
  CHECK(check(IBV_QPS_INIT, IBV_QPS_RTR, kRtr | IBV_QP_ALT_PATH) == EINVAL);   // no APM
}

TEST_CASE("IBV_QP_CUR_STATE must name the current state", "[qp]") {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.cur_qp_state = IBV_QPS_SQE;
  ibv_qp_state n;
  CHECK(check_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, a, IBV_QP_STATE | IBV_QP_CUR_STATE, &n) == EINVAL);
  a.cur_qp_state = IBV_QPS_RTS;
  CHECK(check_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, a, IBV_QP_STATE | IBV_QP_CUR_STATE, &n) == 0);
}

TEST_CASE("the UD sequence: the Q_Key at INIT, nothing at RTR, the SQ PSN at RTS; no path", "[qp]") {
  constexpr int kUdInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  auto ud = [](ibv_qp_state cur, ibv_qp_state to, int mask) { return check(cur, to, mask, nullptr, IBV_QPT_UD); };
  CHECK(ud(IBV_QPS_RESET, IBV_QPS_INIT, kUdInit) == 0);
  CHECK(ud(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL);      // no Q_Key
  CHECK(ud(IBV_QPS_RESET, IBV_QPS_INIT, kUdInit | IBV_QP_ACCESS_FLAGS) == EINVAL);      // RC's
  CHECK(ud(IBV_QPS_INIT, IBV_QPS_RTR, 0) == 0);
  CHECK(ud(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV) == EINVAL);
  CHECK(ud(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_DEST_QPN) == EINVAL);
  CHECK(ud(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN) == 0);
  CHECK(ud(IBV_QPS_RTR, IBV_QPS_RTS, 0) == EINVAL);
  CHECK(ud(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT) == EINVAL);
  CHECK(ud(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_QKEY) == 0);
  CHECK(ud(IBV_QPS_SQE, IBV_QPS_RTS, 0) == 0);
  // RC's RESET to INIT is not UD's.
  CHECK(check(IBV_QPS_RESET, IBV_QPS_INIT, kUdInit) == EINVAL);
}

TEST_CASE("the UC sequence: RC's path and PSNs, none of its ACK, retry or READ attributes", "[qp]") {
  auto uc = [](ibv_qp_state cur, ibv_qp_state to, int mask) { return check(cur, to, mask, nullptr, IBV_QPT_UC); };
  constexpr int kUcRtr = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  CHECK(uc(IBV_QPS_RESET, IBV_QPS_INIT, kInit) == 0);
  CHECK(uc(IBV_QPS_INIT, IBV_QPS_RTR, kUcRtr) == 0);
  CHECK(uc(IBV_QPS_INIT, IBV_QPS_RTR, kRtr) == EINVAL);                     // MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER
  CHECK(uc(IBV_QPS_INIT, IBV_QPS_RTR, kUcRtr & ~IBV_QP_DEST_QPN) == EINVAL);
  CHECK(uc(IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN) == 0);
  CHECK(uc(IBV_QPS_RTR, IBV_QPS_RTS, kRts) == EINVAL);                      // TIMEOUT, RETRY_CNT, ...
  CHECK(uc(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_ACCESS_FLAGS) == 0);
}
