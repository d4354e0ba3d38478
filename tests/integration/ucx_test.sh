#!/bin/bash
# UCX (Debian's 1.13) over usrc: ucx_perftest's UCP tests between two
# network namespaces with only usrc's transports allowed (rc_verbs, with
# ud_verbs to connect it; no shared memory, no TCP), the counters showing the
# traffic went through usrc; and UCX with its defaults where usrc devices
# merely exist (no error, no crash).
# Usage: ucx_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
need_tools ucx_perftest ucx_info
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, namespaces)"; exit 77; }
A=uxA$$ B=uxB$$
new_root
cleanup() {
  "$USRC" link del ux_lo >/dev/null 2>&1
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
  rm -rf "$USRC_ROOT" "${OUT:-/nonexistent}"*
}
trap cleanup EXIT
OUT=$(mktemp /tmp/usrc-out.XXXXXX)
veth_pair $A $B uxa$$ uxb$$ 10.205.0
ip netns exec $A "$USRC" link add uxa netdev uxa$$ port 50000 || fail "link add A"
ip netns exec $B "$USRC" link add uxb netdev uxb$$ port 50000 || fail "link add B"
export UCX_TLS=rc_verbs,ud_verbs,self
tx_of() { "$USRC" stats "$1" | awk '{for (i = 1; i < NF; i++) if ($i == "tx_packets") print $(i + 1)}'; }
# perf TEST ARGS...: ucx_perftest server in B, client in A.
perf() {
  local t=$1 port; port=$(pick_port); shift
  local before; before=$(tx_of uxa)
  ip netns exec $B env UCX_NET_DEVICES=uxb:1 timeout 120 "$USRC" exec -- ucx_perftest -p $port >"$OUT.srv" 2>&1 &
  wait_listen $B $port || { cat "$OUT.srv"; fail "$t: server did not listen"; }
  ip netns exec $A env UCX_NET_DEVICES=uxa:1 timeout 120 "$USRC" exec -- ucx_perftest -p $port 10.205.0.2 -t $t "$@" >"$OUT.cli" 2>&1
  local crc=$?; wait $!; local src=$?
  [ $crc = 0 ] && [ $src = 0 ] || { echo "== server ($src):"; cat "$OUT.srv"; echo "== client ($crc):"; cat "$OUT.cli"; fail "ucx_perftest $t"; }
  grep -q "^Final:" "$OUT.cli" || { cat "$OUT.cli"; fail "$t: no result"; }
  local after; after=$(tx_of uxa)
  [ "$after" -gt $((before + 1000)) ] || fail "$t: usrc sent $((after - before)) packets: not through usrc"
  note "$t $*: $(grep '^Final:' "$OUT.cli" | tr -s ' ') (usrc packets sent: $((after - before)))"
}
perf tag_lat -n 2000
perf tag_bw -n 1000 -s 65536
perf ucp_put_bw -n 1000 -s 65536
perf ucp_get -n 1000 -s 65536
perf ucp_put_lat -n 2000
# UCX's own choice, usrc devices present: it must start, run and end cleanly.
unset UCX_TLS
"$USRC" link add ux_lo netdev lo port 51000 || fail "link add lo"
out=$(timeout 60 "$USRC" exec -- ucx_info -d 2>&1) || { echo "$out"; fail "ucx_info -d with defaults"; }
echo "$out" | grep -q "Device: ux_lo:1" || { echo "$out"; fail "ucx_info does not list ux_lo"; }
# (UCX reports its errors as "... ERROR ..." lines; "error handling:" is a capability.)
if echo "$out" | grep -v "error handling:" | grep -qi "error"; then echo "$out" | grep -i error; fail "ucx_info printed errors"; fi
port=$(pick_port)
timeout 60 "$USRC" exec -- ucx_perftest -p $port >"$OUT.srv" 2>&1 &
wait_listen "" $port || fail "defaults: server did not listen"
timeout 60 "$USRC" exec -- ucx_perftest -p $port 127.0.0.1 -t tag_lat -n 1000 >"$OUT.cli" 2>&1 ||
  { cat "$OUT.srv" "$OUT.cli"; fail "ucx_perftest with UCX's defaults"; }
wait $! || { cat "$OUT.srv"; fail "defaults: server"; }
note "defaults tag_lat: $(grep '^Final:' "$OUT.cli" | tr -s ' ')"
echo PASS
