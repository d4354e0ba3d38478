#!/bin/bash
# Port events follow the netdev: stock ibv_asyncwatch on a usrc device bound
# to a veth in a private namespace sees IBV_EVENT_PORT_ERR when the veth goes
# down, IBV_EVENT_PORT_ACTIVE when it comes back, IBV_EVENT_GID_CHANGE on an
# address change; ibv_devinfo shows the port state.
# Usage: async_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (netns)"; exit 77; }
command -v ibv_asyncwatch >/dev/null || { echo "ibv_asyncwatch not installed"; exit 77; }
new_root
NS=usrcev$$
LOG=$(mktemp /tmp/usrc-async.XXXXXX)
trap 'kill $wpid 2>/dev/null; ip netns del $NS 2>/dev/null; rm -rf "$USRC_ROOT" "$LOG"' EXIT
ip netns add $NS || fail "netns"
ip -n $NS link add ev0 type veth peer name ev1 || fail "veth"
ip -n $NS addr add 10.77.0.1/24 dev ev0
ip -n $NS link set ev0 up
ip -n $NS link set ev1 up
ip netns exec $NS "$USRC" link add evd netdev ev0 || fail "link add"
ip netns exec $NS timeout 60 "$USRC" exec -- stdbuf -oL ibv_asyncwatch -d evd >"$LOG" 2>&1 &
wpid=$!
for i in $(seq 50); do grep -q "async event FD" "$LOG" && break; sleep 0.1; done
ip netns exec $NS "$USRC" exec -- ibv_devinfo -d evd | grep -q "PORT_ACTIVE" || fail "port not active"
ip -n $NS link set ev1 down   # the veth loses carrier: ev0 is no longer running
sleep 0.5
ip netns exec $NS "$USRC" exec -- ibv_devinfo -d evd | grep -q "PORT_DOWN" || fail "port not down"
ip -n $NS link set ev1 up
sleep 0.5
ip -n $NS addr add 10.77.0.9/24 dev ev0
sleep 0.5
cat "$LOG"
grep -q "IBV_EVENT_PORT_ERR" "$LOG" || fail "no PORT_ERR event"
grep -q "IBV_EVENT_PORT_ACTIVE" "$LOG" || fail "no PORT_ACTIVE event"
grep -q "IBV_EVENT_GID_CHANGE" "$LOG" || fail "no GID_CHANGE event"
echo PASS
