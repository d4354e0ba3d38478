#!/bin/bash
# `usrc trace`: a stock ibv_rc_pingpong's packets land in a pcap file that
# tshark dissects as InfiniBand over UDP: SEND ONLY requests with
# consecutive PSNs from each side (resends aside), each answered by an ACK
# of that PSN. On loopback every ICRC is 0 (left out: USRC_ICRC_LOCAL);
# with USRC_ICRC_LOCAL=1 every one is there, and the peer verifies them.
# Usage: trace_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
command -v tshark >/dev/null || { echo "tshark not installed"; exit 77; }
command -v ibv_rc_pingpong >/dev/null || { echo "ibv_rc_pingpong not installed"; exit 77; }
new_root
DIR=$(mktemp -d /tmp/usrc-trace.XXXXXX)
trap '"$USRC" link del tr0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$DIR"' EXIT
"$USRC" link add tr0 netdev lo port 46000 || fail "link add"
port=$(pick_port)
timeout 30 "$USRC" trace "$DIR/srv.pcap" -- ibv_rc_pingpong -d tr0 -n 5 -s 100 -p $port >/dev/null 2>&1 &
wait_listen "" $port || fail "server did not listen"
timeout 30 "$USRC" trace "$DIR/cli-%p.pcap" -- ibv_rc_pingpong -d tr0 -n 5 -s 100 -p $port 127.0.0.1 >/dev/null ||
  fail "pingpong under trace"
wait
cli=$(ls "$DIR"/cli-*.pcap) || fail "%p was not replaced by the pid"
rows=$(tshark -r "$cli" -d "udp.port==46001-50095,infiniband" -T fields -e ip.src -e udp.srcport \
         -e infiniband.bth.opcode -e infiniband.bth.psn -e infiniband.invariant.crc 2>/dev/null)
echo "$rows"
me=$(echo "$rows" | head -1 | cut -f2)   # the client sends first
# A resend repeats a PSN (the retransmission timer may fire while the
# server is slow to answer): PSNs are checked as distinct, in order.
sends=$(echo "$rows" | awk -v me="$me" '$2 == me && $3 == 4 {print $4}' | uniq)
acks=$(echo "$rows" | awk -v me="$me" '$2 != me && $3 == 17 {print $4}')
[ "$(echo "$sends" | wc -l)" -ge 5 ] || fail "expected 5 SEND ONLY from the client"
# Consecutive PSNs (mod 2^24), and every one acknowledged.
echo "$sends" | awk 'NR > 1 && $1 != (prev + 1) % 16777216 {bad = 1} {prev = $1} END {exit bad}' ||
  fail "client PSNs not consecutive"
for p in $sends; do echo "$acks" | grep -qx "$p" || fail "PSN $p not acknowledged in the trace"; done
[ -s "$DIR/srv.pcap" ] || fail "no server trace"
echo "$rows" | awk '$5 != "0x00000000" {bad = 1} END {exit bad}' || fail "an ICRC on loopback"

# USRC_ICRC_LOCAL=1: the ICRCs are computed (and checked: the run works).
port=$(pick_port)
rm -f "$DIR"/*.pcap
USRC_ICRC_LOCAL=1 timeout 30 "$USRC" trace "$DIR/srv.pcap" -- ibv_rc_pingpong -d tr0 -n 5 -s 100 -p $port >/dev/null 2>&1 &
wait_listen "" $port || fail "server did not listen"
USRC_ICRC_LOCAL=1 timeout 30 "$USRC" trace "$DIR/cli.pcap" -- ibv_rc_pingpong -d tr0 -n 5 -s 100 -p $port 127.0.0.1 >/dev/null ||
  fail "pingpong with USRC_ICRC_LOCAL=1"
wait
crcs=$(tshark -r "$DIR/cli.pcap" -d "udp.port==46001-50095,infiniband" -T fields -e infiniband.invariant.crc 2>/dev/null)
[ "$(echo "$crcs" | wc -l)" -ge 10 ] || fail "expected 10 packets with USRC_ICRC_LOCAL=1"
echo "$crcs" | grep -qx "0x00000000" && fail "an ICRC left out with USRC_ICRC_LOCAL=1"
echo PASS
