#!/bin/bash
# Stock /usr/bin/ibv_rc_pingpong over usrc on loopback, both link layers.
# Usage: pingpong_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
command -v ibv_rc_pingpong >/dev/null || { echo "ibv_rc_pingpong not installed"; exit 77; }
new_root
trap '"$USRC" link del pp_ib >/dev/null 2>&1; "$USRC" link del pp_roce >/dev/null 2>&1; rm -rf "$USRC_ROOT" /tmp/usrc-out.*' EXIT

"$USRC" link add pp_ib netdev lo port 23000 || fail "link add ib"
"$USRC" link add pp_roce netdev lo type roce port 25000 || fail "link add roce"

P="ibv_rc_pingpong -d pp_ib"
run_pair "ib defaults"        "" "" 127.0.0.1 60 -- $P
run_pair "ib events (-e)"     "" "" 127.0.0.1 60 -- $P -e
run_pair "ib -s 1"            "" "" 127.0.0.1 60 -- $P -s 1
run_pair "ib -s 1048576"      "" "" 127.0.0.1 120 -- $P -s 1048576 -n 200
run_pair "ib -n 10000"        "" "" 127.0.0.1 120 -- $P -n 10000
run_pair "ib data check (-c)" "" "" 127.0.0.1 60 -- $P -c -s 65536 -n 200
run_pair "ib -m 4096"         "" "" 127.0.0.1 60 -- $P -m 4096 -s 20000 -n 200
for m in 256 512 1024 2048; do
  run_pair "ib -m $m"         "" "" 127.0.0.1 60 -- $P -m $m -s 5000 -n 200 -c
done
run_pair "ib -g 1 (GRH)"      "" "" 127.0.0.1 60 -- $P -g 1

R="ibv_rc_pingpong -d pp_roce -g 0"
run_pair "roce defaults"      "" "" 127.0.0.1 60 -- $R
run_pair "roce events (-e)"   "" "" 127.0.0.1 60 -- $R -e
run_pair "roce -s 1048576"    "" "" 127.0.0.1 120 -- $R -s 1048576 -n 100

# RoCE without a GRH is refused at RTR, cleanly.
port=$(pick_port)
timeout 20 "$USRC" exec -- ibv_rc_pingpong -d pp_roce -p $port >/tmp/usrc-out.nogrh.srv 2>&1 &
wait_listen "" $port || fail "no-GRH server"
timeout 20 "$USRC" exec -- ibv_rc_pingpong -d pp_roce -p $port 127.0.0.1 >/tmp/usrc-out.nogrh 2>&1 && fail "roce without GRH must fail"
wait
# The server connects first, so it is the one whose RTR is refused.
grep -q "Failed to modify QP to RTR" /tmp/usrc-out.nogrh.srv /tmp/usrc-out.nogrh ||
  { cat /tmp/usrc-out.nogrh.srv /tmp/usrc-out.nogrh; fail "roce without GRH: expected RTR failure"; }

run_pair "ib -N (ibv_wr_* API)" "" "" 127.0.0.1 60 -- $P -N
run_pair "ib -t (timestamps)" "" "" 127.0.0.1 60 -- $P -t
run_pair "ib -t -e -N"        "" "" 127.0.0.1 60 -- $P -t -e -N -n 3000
run_pair "ib -l 3 (SL)"       "" "" 127.0.0.1 60 -- $P -l 3
run_pair "ib -o (ODP)"        "" "" 127.0.0.1 60 -- $P -o -c
run_pair "ib -O (implicit ODP)" "" "" 127.0.0.1 60 -- $P -O -c -s 65536 -n 200
run_pair "ib -j (device memory)" "" "" 127.0.0.1 60 -- $P -j -c
run_pair "roce -t -N"         "" "" 127.0.0.1 60 -- $R -t -N

"$USRC" stats pp_ib
echo "PASS"
