#!/bin/bash
# The usrc CLI: the device tree it writes, its errors, show/stats/exec.
# Usage: cli_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add)"; exit 77; }
new_root
NS=usrc_cli_$$
trap 'ip netns del $NS 2>/dev/null; rm -rf "$USRC_ROOT"' EXIT
S=$USRC_ROOT/sys/class/infiniband

"$USRC" link add c_ib netdev lo port 31000 || fail "link add"
[ "$(cat $S/c_ib/ports/1/gids/1)" = "0000:0000:0000:0000:0000:ffff:7f00:0001" ] || fail "gid 1"
grep -q '^fe80:0000:0000:0000:' $S/c_ib/ports/1/gids/0 || fail "gid 0 is the port GID"
[ "$(cat $S/c_ib/ports/1/pkeys/0)" = "0xffff" ] || fail "pkey"
[ ! -e $S/c_ib/ports/1/gid_attrs ] || fail "IB link layer has no gid_attrs"
grep -qx 'lid=1' $S/c_ib/usrc.conf || fail "LID of 127.0.0.1 is 1"
grep -qx 'active_mtu=4096' $S/c_ib/usrc.conf || fail "lo MTU gives 4096"
[ "$(cat $USRC_ROOT/sys/class/infiniband_verbs/uverbs0/ibdev)" = c_ib ] || fail "uverbs0"
[ -c /dev/infiniband/uverbs0 ] || fail "/dev/infiniband/uverbs0"

"$USRC" link add c_roce netdev lo type roce port 32000 || fail "link add roce"
[ "$(cat $S/c_roce/ports/1/gid_attrs/types/0)" = "RoCE v2" ] || fail "gid type"
[ "$(cat $S/c_roce/ports/1/gid_attrs/ndevs/0)" = "lo" ] || fail "gid ndev"
[ "$(cat $S/c_roce/ports/1/link_layer)" = "Ethernet" ] || fail "link layer"

"$USRC" link add c_ib netdev lo 2>/dev/null && fail "duplicate name accepted"
"$USRC" link add c_x netdev nosuchdev0 2>/dev/null && fail "unknown netdev accepted"
"$USRC" link add c_x netdev lo type rxe 2>/dev/null && fail "bad type accepted"
"$USRC" link add c_x netdev lo bogus 1 2>/dev/null; [ $? = 2 ] || fail "unknown keyword: usage error"
"$USRC" link add c_x 2>/dev/null; [ $? = 2 ] || fail "missing netdev: usage error"
"$USRC" link 2>/dev/null; [ $? = 2 ] || fail "missing subcommand: usage error"
"$USRC" --help >/dev/null || fail "--help exits with 0"
"$USRC" link add 'bad/name' netdev lo 2>/dev/null && fail "bad name accepted"

"$USRC" link show | grep -q '^link c_ib/1 state ACTIVE physical_state LINK_UP netdev lo type ib lid 1' || fail "show"
"$USRC" link show --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert [x["ifname"] for x in d]==["c_ib","c_roce"], d' || fail "show --json"
"$USRC" stats c_ib | grep -q ' retransmits 0 ' || fail "stats"
"$USRC" stats --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["tx_packets"]==0' || fail "stats --json"
# JSON escapes what it prints: a netdev (in a namespace of this test) named
# with a quote and a backslash.
if ip netns add "$NS" 2>/dev/null; then
  ip -n "$NS" link add 'q"x\y' type veth peer name qq && ip -n "$NS" addr add 10.9.8.7/24 dev 'q"x\y' ||
    fail "veth in $NS"
  ip netns exec "$NS" "$USRC" link add c_q netdev 'q"x\y' port 34000 || fail "link add on q\"x\\y"
  "$USRC" link show c_q --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["netdev"]=="q\"x\\y", d' ||
    fail "show --json escapes the netdev name: $("$USRC" link show c_q --json)"
  "$USRC" link show --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert [x["ifname"] for x in d]==["c_ib","c_q","c_roce"], d' ||
    fail "show --json, three devices"
  "$USRC" link del c_q || fail "link del c_q"
  ip netns del "$NS"
fi

env_out=$("$USRC" exec -- env)
echo "$env_out" | grep -qx "SYSFS_PATH=$USRC_ROOT/sys" || fail "exec sets SYSFS_PATH"
echo "$env_out" | grep -q "^LD_PRELOAD=$USRC_PROVIDER" || fail "exec preloads the provider"
USRC_PROVIDER=/nonexistent "$USRC" exec -- true 2>/dev/null; [ $? = 127 ] || fail "missing provider"
if command -v ibv_devices >/dev/null; then
  "$USRC" exec -- ibv_devices | grep -q c_roce || fail "ibv_devices lists the device"
  # A user without root runs programs on an existing device.
  setpriv --reuid=65534 --regid=65534 --clear-groups "$USRC" exec -- ibv_devinfo -d c_ib | grep -q PORT_ACTIVE ||
    fail "non-root ibv_devinfo"
  # A setting that is not a number is ignored, and said so.
  out=$(USRC_TX_WINDOW=lots "$USRC" exec -- ibv_devinfo -d c_ib 2>&1) || fail "ibv_devinfo with a bad setting"
  echo "$out" | grep -q "USRC_TX_WINDOW=lots is not a number" || fail "a bad setting is reported: $out"
  echo "$out" | grep -q PORT_ACTIVE || fail "a bad setting stops nothing"
fi

"$USRC" link del c_ib || fail "link del"
"$USRC" link del c_roce || fail "link del"
[ ! -e $S/c_ib ] && [ ! -e $USRC_ROOT/counters/c_ib.d ] && [ ! -e $USRC_ROOT/sys/class/infiniband_verbs/uverbs0 ] || fail "link del leaves files"
"$USRC" link del c_ib 2>/dev/null && fail "deleting twice"
echo PASS
