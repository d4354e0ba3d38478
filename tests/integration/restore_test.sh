#!/bin/bash
# `usrc link restore` / `usrc link flush` with a temporary links.conf and a
# private USRC_ROOT: the devices appear, a second restore changes nothing,
# flush removes them, a bad line rejects the whole file.
# Usage: restore_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
CONF=$USRC_ROOT/links.conf
trap '"$USRC" link flush --config "$CONF" >/dev/null 2>&1; rm -rf "$USRC_ROOT"' EXIT

cat >"$CONF" <<'CONF'
# test devices
r_ib netdev lo port 33000        # trailing comment

r_roce   netdev lo type roce port 34000
CONF
"$USRC" link restore --config "$CONF" || fail "restore"
[ "$("$USRC" link show | awk '{print $2}' | tr '\n' ' ')" = "r_ib/1 r_roce/1 " ] || fail "both devices"
"$USRC" link show r_roce | grep -q ' type roce ' || fail "type from the config"
"$USRC" link show r_roce | grep -q ' port 34000' || fail "port from the config"
before=$(cat "$USRC_ROOT"/sys/class/infiniband/r_ib/node_guid "$USRC_ROOT"/sys/class/infiniband_verbs/*/ibdev)
"$USRC" link restore --config "$CONF" || fail "second restore (idempotent)"
after=$(cat "$USRC_ROOT"/sys/class/infiniband/r_ib/node_guid "$USRC_ROOT"/sys/class/infiniband_verbs/*/ibdev)
[ "$before" = "$after" ] || fail "second restore changed the devices"
[ "$(ls "$USRC_ROOT"/sys/class/infiniband_verbs | grep -c uverbs)" = 2 ] || fail "no extra uverbs entries"

# Recreates a device removed by hand, leaves the other alone.
"$USRC" link del r_ib || fail "del"
"$USRC" link restore --config "$CONF" || fail "restore after del"
"$USRC" link show r_ib >/dev/null || fail "r_ib back"

"$USRC" link flush --config "$CONF" || fail "flush"
[ -z "$("$USRC" link show)" ] || fail "flush left devices"
"$USRC" link flush --config "$CONF" || fail "flush of nothing"

echo "r_x netdev lo bogus 1" >>"$CONF"
"$USRC" link restore --config "$CONF" 2>"$USRC_ROOT/err" && fail "bad line accepted"
grep -q "$CONF: line 5: unknown keyword 'bogus'" "$USRC_ROOT/err" || fail "the bad line not named: $(cat "$USRC_ROOT/err")"
[ -z "$("$USRC" link show)" ] || fail "bad config half-applied"
"$USRC" link restore --config "$USRC_ROOT/nonexistent" 2>/dev/null && fail "missing config accepted"
echo "restore_test: ok"
