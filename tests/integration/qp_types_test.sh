#!/bin/bash
# Stock programs on the QP types and queues beyond a plain RC QP's: shared
# receive queues (ibv_srq_pingpong, perftest --use-srq), UD QPs
# (ibv_ud_pingpong, perftest -c UD, qperf ud_*), UC QPs (ibv_uc_pingpong,
# perftest -c UC, qperf uc_*) and XRC (ibv_xsrq_pingpong, perftest -c XRC),
# on loopback on both link layers and between two network namespaces joined
# by a veth pair.
# Usage: qp_types_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
need_tools ibv_srq_pingpong ibv_ud_pingpong ibv_uc_pingpong ibv_xsrq_pingpong ib_send_bw qperf
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, namespaces)"; exit 77; }
A=qtA$$ B=qtB$$
new_root
cleanup() {
  "$USRC" link del qt_ib >/dev/null 2>&1; "$USRC" link del qt_roce >/dev/null 2>&1
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
  rm -rf "$USRC_ROOT" "${OUT:-/nonexistent}"*
}
trap cleanup EXIT
"$USRC" link add qt_ib netdev lo port 41000 || fail "link add ib"
"$USRC" link add qt_roce netdev lo type roce port 42000 || fail "link add roce"

S="ibv_srq_pingpong -d qt_ib"
run_pair "srq ib defaults -c"      "" "" 127.0.0.1 60 -- $S -c
run_pair "srq ib 64 KB -c"         "" "" 127.0.0.1 120 -- $S -c -s 65536 -n 200
run_pair "srq ib events (-e) -c"   "" "" 127.0.0.1 60 -- $S -e -c -n 300
run_pair "srq ib 1 QP, rx-depth 4" "" "" 127.0.0.1 60 -- $S -q 1 -r 4 -c -n 2000
run_pair "srq roce -c"             "" "" 127.0.0.1 60 -- ibv_srq_pingpong -d qt_roce -g 0 -c -s 20000 -n 300
run_pair "ib_send_bw --use-srq -q 4" "" "" 127.0.0.1 120 -- ib_send_bw -d qt_ib --use-srq -q 4 -n 2000
run_pair "ib_send_lat --use-srq"   "" "" 127.0.0.1 120 -- ib_send_lat -d qt_roce --use-srq -n 2000
U="ibv_ud_pingpong -d qt_ib"
run_pair "ud ib -c"                "" "" 127.0.0.1 60 -- $U -c -n 2000
run_pair "ud ib events (-e) -c"    "" "" 127.0.0.1 60 -- $U -e -c -s 1024
run_pair "ud roce -c"              "" "" 127.0.0.1 60 -- ibv_ud_pingpong -d qt_roce -g 0 -c -s 1500
run_pair "ib_send_lat -c UD"       "" "" 127.0.0.1 60 -- ib_send_lat -d qt_ib -c UD -n 2000
run_pair "ib_send_bw -c UD -q 2"   "" "" 127.0.0.1 60 -- ib_send_bw -d qt_roce -x 0 -c UD -q 2 -n 2000
run_pair "uc ib -c"                "" "" 127.0.0.1 60 -- ibv_uc_pingpong -d qt_ib -c -n 2000
run_pair "uc roce 20000 B -c"      "" "" 127.0.0.1 60 -- ibv_uc_pingpong -d qt_roce -g 0 -c -s 20000 -n 500
run_pair "ib_send_lat -c UC"       "" "" 127.0.0.1 60 -- ib_send_lat -d qt_ib -c UC -n 2000
run_pair "ib_write_bw -c UC"       "" "" 127.0.0.1 60 -- ib_write_bw -d qt_ib -c UC -n 2000
# XRC: one client per server, and several: the clients share the XRC
# domain of their host's /tmp/xrc_domain, each one's target receiving for
# the others' SRQs too (forwarded to them, docs/xrc.md).
run_pair "xsrq ib"                 "" "" 127.0.0.1 60 -- ibv_xsrq_pingpong -d qt_ib -n 2000 -s 4096
run_pair "xsrq roce"               "" "" 127.0.0.1 60 -- ibv_xsrq_pingpong -d qt_roce -g 0 -n 500
# xsrq_clients NAME CLIENTS SERVER_NS CLIENT_NS ADDR SERVER_DEV CLIENT_DEV ARGS...:
# ibv_xsrq_pingpong, a server of -c CLIENTS and as many client processes.
xsrq_clients() {
  local name=$1 n=$2 sns=$3 cns=$4 addr=$5 sdev=$6 cdev=$7 port i rc=0 pids=; shift 7
  OUT=$(mktemp /tmp/usrc-out.XXXXXX)
  port=$(pick_port)
  ${sns:+ip netns exec $sns} timeout 120 "$USRC" exec -- ibv_xsrq_pingpong -d "$sdev" "$@" -p "$port" -c "$n" \
    >"$OUT.srv" 2>&1 &
  local spid=$!
  wait_listen "$sns" "$port" || { kill $spid 2>/dev/null; cat "$OUT.srv"; fail "$name: server did not listen"; }
  for i in $(seq "$n"); do
    ${cns:+ip netns exec $cns} timeout 120 "$USRC" exec -- ibv_xsrq_pingpong -d "$cdev" "$@" -p "$port" "$addr" \
      >"$OUT.cli$i" 2>&1 &
    pids="$pids $!"
  done
  for i in $pids; do wait $i || rc=1; done
  wait $spid || rc=1
  if [ $rc -ne 0 ]; then
    for i in "$OUT".*; do echo "== $i:"; cat "$i"; done
    fail "$name"
  fi
  note "$name: server and $n clients succeeded"
}
xsrq_clients "xsrq ib -c 2"   2 "" "" 127.0.0.1 qt_ib qt_ib -n 500 -s 4096
xsrq_clients "xsrq roce -c 3" 3 "" "" 127.0.0.1 qt_roce qt_roce -g 0 -n 200 -s 8192
run_pair "ib_send_bw -c XRC"       "" "" 127.0.0.1 60 -- ib_send_bw -d qt_ib -c XRC -n 2000
run_pair "ib_read_lat -c XRC"      "" "" 127.0.0.1 60 -- ib_read_lat -d qt_roce -x 0 -c XRC -n 2000
run_pair "ib_atomic_bw -c XRC"     "" "" 127.0.0.1 60 -- ib_atomic_bw -d qt_ib -c XRC -n 2000
# qperf addresses its peer by LID and waits on completion events.
port=$(pick_port)
timeout 120 "$USRC" exec -- qperf -lp $port >/dev/null 2>&1 &
qpid=$!
wait_listen "" $port || fail "qperf server did not listen"
for t in ud_lat ud_bw uc_lat uc_bw uc_rdma_write_lat uc_rdma_write_bw; do
  out=$(timeout 60 "$USRC" exec -- qperf -lp $port -t 1 -i qt_ib:1 127.0.0.1 $t 2>&1) || { echo "$out"; fail "qperf $t"; }
  line=$(echo "$out" | grep -E '^ +(latency|recv_bw) += +[0-9][0-9.,]* ') || { echo "$out"; fail "qperf $t: no result"; }
  note "qperf $t: $(echo $line)"
done
kill $qpid; wait $qpid 2>/dev/null

# Across hosts' stand-in: two namespaces, a device on each side.
veth_pair $A $B qa$$ qb$$ 10.204.0
ip netns exec $A "$USRC" link add qta netdev qa$$ port 43000 || fail "link add A"
ip netns exec $B "$USRC" link add qtb netdev qb$$ port 43000 || fail "link add B"
ip netns exec $A "$USRC" link add qra netdev qa$$ type roce port 44000 || fail "link add A roce"
ip netns exec $B "$USRC" link add qrb netdev qb$$ type roce port 44000 || fail "link add B roce"
# pair NAME TIMEOUT SERVER_DEV(B) CLIENT_DEV(A) PROGRAM ARGS...
pair() {
  local name=$1 tmo=$2 sdev=$3 cdev=$4 port; port=$(pick_port); shift 4
  OUT=$(mktemp /tmp/usrc-out.XXXXXX)
  ip netns exec $B timeout $tmo "$USRC" exec -- "$@" -d $sdev -p $port >"$OUT.srv" 2>&1 &
  wait_listen $B $port || { cat "$OUT.srv"; fail "$name: server did not listen"; }
  ip netns exec $A timeout $tmo "$USRC" exec -- "$@" -d $cdev -p $port 10.204.0.2 >"$OUT.cli" 2>&1
  local crc=$?; wait $!; local src=$?
  [ $crc = 0 ] && [ $src = 0 ] || { echo "== server ($src):"; cat "$OUT.srv"; echo "== client ($crc):"; cat "$OUT.cli"; fail "$name"; }
  note "$name: $(grep -h 'bytes in' "$OUT.cli" | head -1)"
}
pair "netns srq ib -c"          60 qtb qta ibv_srq_pingpong -c -s 16384 -n 300
pair "netns srq roce -c"        60 qrb qra ibv_srq_pingpong -g 0 -c -n 500
pair "netns ib_send_bw --use-srq" 120 qtb qta ib_send_bw --use-srq -q 2 -n 2000
grep -h "^ 65536" "$OUT.cli"
pair "netns ud ib -c"           60 qtb qta ibv_ud_pingpong -c -n 1000
pair "netns ud roce -c"         60 qrb qra ibv_ud_pingpong -g 0 -c -s 1024 -n 1000
pair "netns ib_send_lat -c UD"  60 qrb qra ib_send_lat -x 0 -c UD -n 2000
pair "netns uc ib -c"           60 qtb qta ibv_uc_pingpong -c -s 8192 -n 1000
pair "netns ib_send_lat -c UC"  60 qtb qta ib_send_lat -c UC -n 2000
pair "netns xsrq ib"            60 qtb qta ibv_xsrq_pingpong -n 1000 -s 8192
xsrq_clients "netns xsrq ib -c 3" 3 $B $A 10.204.0.2 qtb qta -n 200 -s 4096
pair "netns ib_write_bw -c XRC" 60 qrb qra ib_write_bw -x 0 -c XRC -n 2000
"$USRC" stats qta
echo PASS
