#!/bin/bash
# Runs our verbs test program through `usrc exec` on both link layers.
# Usage: verbs_test.sh USRC_CLI PROVIDER_SO VERBS_TESTS
USRC=$1 USRC_PROVIDER=$2 PROG=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
trap '"$USRC" link del vt_ib >/dev/null 2>&1; "$USRC" link del vt_roce >/dev/null 2>&1; rm -rf "$USRC_ROOT"' EXIT
"$USRC" link add vt_ib netdev lo port 27000 || fail "link add"
"$USRC" link add vt_roce netdev lo type roce port 29000 || fail "link add roce"
# (udp backend, shared memory on: small WRITEs are placed directly.)
export USRC_TEST_PLACED=1
USRC_TEST_DEV=vt_ib USRC_TEST_PORT=27000 timeout 120 "$USRC" exec -- "$PROG" || fail "verbs tests (ib)"
USRC_TEST_DEV=vt_roce USRC_TEST_PORT=29000 timeout 120 "$USRC" exec -- "$PROG" || fail "verbs tests (roce)"
"$USRC" stats vt_ib
echo PASS
