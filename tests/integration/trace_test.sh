#!/bin/bash
# `usrc exec --trace FILE` (USRC_TRACE): the stock ibv_rc_pingpong client's
# packets in a pcap file that tshark dissects as RoCE v2 with no decode-as
# rule: RC SEND ONLY (opcode 4) requests and their ACKs (17), PSNs rising
# per sender.
# Usage: trace_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
command -v ibv_rc_pingpong >/dev/null || { echo "ibv_rc_pingpong not installed"; exit 77; }
command -v tshark >/dev/null || { echo "tshark not installed"; exit 77; }
new_root
TRACE=$USRC_ROOT/client.pcap
trap '"$USRC" link del tr0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" /tmp/usrc-out.*' EXIT
"$USRC" link add tr0 netdev lo port 38000 || fail "link add"

port=$(pick_port)
timeout 60 "$USRC" exec -- ibv_rc_pingpong -d tr0 -n 20 -s 64 -p "$port" >/dev/null 2>&1 & spid=$!
wait_listen "" "$port" || fail "server did not listen"
timeout 60 "$USRC" exec --trace "$TRACE" -- ibv_rc_pingpong -d tr0 -n 20 -s 64 -p "$port" 127.0.0.1 \
  >/dev/null 2>&1 || fail "client"
wait $spid || fail "server"

rows=$(tshark -r "$TRACE" -T fields -e infiniband.bth.opcode -e infiniband.bth.psn -e udp.srcport 2>/dev/null)
[ -n "$rows" ] || fail "tshark found no InfiniBand packets in $TRACE"
echo "$rows" | head -6
echo "$rows" | awk '
  $1 == 4  { sends++; if (($3 in last) && $2 <= last[$3]) bad = "SEND PSNs of port " $3 " not increasing"; last[$3] = $2 }
  $1 == 17 { acks++ }
  $1 != 4 && $1 != 17 { bad = "unexpected opcode " $1 }
  END {
    if (bad) { print bad; exit 1 }
    # -n 20 -s 64: each side sends 20 SEND ONLY; the client traces both
    # directions, so 40 SENDs from two source ports, and the ACKs.
    if (sends != 40 || length(last) != 2) { print "sends " sends " from " length(last) " ports"; exit 1 }
    if (acks < 1) { print "no ACKs"; exit 1 }
  }' || fail "opcodes/PSNs"
echo "trace_test: ok"
