#!/bin/bash
# A representative subset of the stock perftest matrix over usrc (the whole
# matrix: perftest-configs/matrix.sh).
# Usage: perftest_test.sh USRC_CLI PROVIDER_SO MATRIX_SCRIPT
USRC=$1 USRC_PROVIDER=$2 MATRIX=$3
. "$(dirname "$0")/lib.sh"
command -v ib_write_bw >/dev/null || { echo "perftest not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
trap '"$USRC" link del pt0 >/dev/null 2>&1; rm -rf "$USRC_ROOT"' EXIT
"$USRC" link add pt0 netdev lo port 33000 || fail "link add"
USRC=$USRC TMO=120 bash "$MATRIX" pt0 subset || fail "perftest subset"
echo PASS
