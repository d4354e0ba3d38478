#!/bin/bash
# Stock qperf RC tests over usrc on loopback: a qperf server and a client,
# both through `usrc exec` (qperf addresses its peer by LID and waits on
# completion events).
# Usage: qperf_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
command -v qperf >/dev/null || { echo "qperf not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
port=$(pick_port)
trap 'kill $spid 2>/dev/null; "$USRC" link del qp0 >/dev/null 2>&1; rm -rf "$USRC_ROOT"' EXIT
"$USRC" link add qp0 netdev lo port 35000 || fail "link add"
timeout 300 "$USRC" exec -- qperf -lp $port >/dev/null 2>&1 &
spid=$!
wait_listen "" $port || fail "qperf server did not listen"
for t in rc_bw rc_bi_bw rc_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_bw \
         rc_rdma_write_lat rc_rdma_write_poll_lat rc_compare_swap_mr rc_fetch_add_mr \
         ver_rc_compare_swap ver_rc_fetch_add; do
  out=$(timeout 60 "$USRC" exec -- qperf -lp $port -t 1 -i qp0:1 127.0.0.1 $t 2>&1) ||
    { echo "$out"; fail "qperf $t"; }
  # A result line: "bw = N MB/sec", "latency = N us" or "msg_rate = N K/sec"
  # (qperf groups thousands: "1,000 K/sec").
  line=$(echo "$out" | grep -E '^ +(bw|latency|msg_rate) += +[0-9][0-9.,]* ') ||
    { echo "$out"; fail "qperf $t: no result"; }
  note "$t: $(echo $line)"
done
"$USRC" stats qp0
echo PASS
