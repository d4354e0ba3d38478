#!/bin/bash
# 64 KiB ib_write_bw and 2 B ib_send_lat over each NIC backend, on one veth
# pair between two network namespaces, printed as a table. Needs root.
# Usage: backends.sh USRC_CLI PROVIDER_SO [BACKENDS...]   (default: udp ofi xdp)
set -u
USRC=$(realpath "${1:?usrc CLI}")
export USRC_PROVIDER=$(realpath "${2:?provider .so}")
shift 2
BACKENDS=${*:-udp ofi xdp}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 77; }
A=bkA$$ B=bkB$$
export USRC_ROOT=$(mktemp -d /tmp/usrc-bk.XXXXXX)
chmod 755 "$USRC_ROOT"
TMP=$(mktemp -d /tmp/usrc-bkout.XXXXXX)
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$USRC_ROOT" "$TMP"; }
trap cleanup EXIT
ip netns add $A && ip netns add $B || exit 1
ip link add va$$ netns $A type veth peer name vb$$ netns $B || exit 1
ip -n $A addr add 10.202.0.1/24 dev va$$ && ip -n $B addr add 10.202.0.2/24 dev vb$$
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set va$$ up && ip -n $B link set vb$$ up
# The usrc port follows the netdev's carrier: wait until both ends are up.
for i in $(seq 50); do
  ip -n $A link show va$$ | grep -q "state UP" && ip -n $B link show vb$$ | grep -q "state UP" && break
  sleep 0.1
done

# run NS_SRV DEV_SRV NS_CLI DEV_CLI PROGRAM ARGS: prints the client's result line.
run() {
  local sns=$1 sdev=$2 cns=$3 cdev=$4 port=$((10000 + RANDOM % 15000)) i; shift 4
  ip netns exec $sns timeout 120 "$USRC" exec -- "$@" -d $sdev -p $port >"$TMP/srv" 2>&1 &
  for i in $(seq 100); do ip netns exec $sns ss -ltn | grep -q ":$port " && break; sleep 0.1; done
  ip netns exec $cns timeout 120 "$USRC" exec -- "$@" -d $cdev -p $port 10.202.0.2 >"$TMP/cli" 2>&1
  wait $!
  grep -E "^ +[0-9]+ +[0-9]+ " "$TMP/cli" | tail -1
}

printf "%-8s %18s %18s %18s\n" backend "write_bw 64K MB/s" "send_lat 2B t_typ" "send_lat 2B t_avg"
for be in $BACKENDS; do
  ip netns exec $A "$USRC" link add a_$be netdev va$$ backend $be >/dev/null 2>&1 &&
    ip netns exec $B "$USRC" link add b_$be netdev vb$$ backend $be >/dev/null 2>&1 ||
    { printf "%-8s %s\n" $be "link add failed"; continue; }
  bw=$(run $B b_$be $A a_$be ib_write_bw -s 65536 -n 5000 -F | awk '{print $4}')
  lat=$(run $B b_$be $A a_$be ib_send_lat -s 2 -n 10000 -F)
  printf "%-8s %18s %18s %18s\n" $be "${bw:-n/a}" "$(echo "$lat" | awk '{print $5}')" \
    "$(echo "$lat" | awk '{print $6}')"
  [ -n "$bw" ] || sed -n 1,5p "$TMP/cli"
done
