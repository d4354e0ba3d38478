#!/bin/bash
# The transport over one NIC backend: our verbs test program, the stock
# pingpong (polling and -e), perftest RC, and interop with a udp-backend
# device (the wire is the same). Exit 77 when the backend cannot run here.
# Usage: backend_test.sh USRC_CLI PROVIDER_SO VERBS_TESTS BACKEND
USRC=$1 USRC_PROVIDER=$2 PROG=$3 BACKEND=$4
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
A=bk_a$$ B=bk_u$$
trap '"$USRC" link del $A >/dev/null 2>&1; "$USRC" link del $B >/dev/null 2>&1; rm -rf "$USRC_ROOT" "${OUT:-/nonexistent}"*' EXIT
"$USRC" link add $A netdev lo port 27000 backend "$BACKEND" || fail "link add backend $BACKEND"
"$USRC" link show $A | grep -q "backend $BACKEND" || fail "link show does not report the backend"
"$USRC" link add $B netdev lo port 27000 || fail "link add udp"
probe=$(timeout 20 "$USRC" exec -- ibv_devinfo -d $A 2>&1)
if echo "$probe" | grep -q "built without"; then echo "$probe"; exit 77; fi
USRC_TEST_DEV=$A USRC_TEST_PORT=27000 timeout 120 "$USRC" exec -- "$PROG" || fail "verbs tests ($BACKEND)"
run_pair "pingpong $BACKEND" "" "" 127.0.0.1 60 -- ibv_rc_pingpong -d $A -m 1024 -n 2000
run_pair "pingpong -e $BACKEND" "" "" 127.0.0.1 60 -- ibv_rc_pingpong -d $A -m 1024 -e
run_pair "ib_write_bw $BACKEND" "" "" 127.0.0.1 60 -- ib_write_bw -d $A -s 65536 -n 1000 -F
grep -h "^ 65536" "$OUT.cli"
run_pair "ib_send_lat $BACKEND" "" "" 127.0.0.1 60 -- ib_send_lat -d $A -s 2 -n 1000 -F
grep -h "^ 2 " "$OUT.cli"
# Interop: the client on a udp-backend device, the server on this backend.
OUT2=$(mktemp /tmp/usrc-out.XXXXXX); port=$(pick_port)
timeout 60 "$USRC" exec -- ibv_rc_pingpong -d $A -m 1024 -p $port >"$OUT2" 2>&1 &
wait_listen "" $port || fail "interop: server did not listen"
timeout 60 "$USRC" exec -- ibv_rc_pingpong -d $B -m 1024 -p $port 127.0.0.1 || fail "interop $BACKEND <-> udp"
wait $! || { cat "$OUT2"; fail "interop server"; }
rm -f "$OUT2"
"$USRC" stats $A
echo PASS
