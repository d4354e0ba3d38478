#!/bin/bash
# The device as tools expect it: a vendor and the other attributes stock test
# suites check (our verbs test program's [device] tests), the netdev under
# device/net in the tree, and a device offered only in the network namespace
# of its netdev: listed and opened there, neither listed nor opened in another
# namespace or the root one, and nothing said on stderr about the ones left
# out; the same devices in /sys/class/infiniband under usrc exec. A device
# whose namespace was not recorded (made by an older usrc) is offered
# everywhere, as before.
# Usage: device_test.sh USRC_CLI PROVIDER_SO VERBS_TESTS
USRC=$1 USRC_PROVIDER=$2 PROG=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, network namespaces)"; exit 77; }
need_tools ibv_devices ibv_devinfo
unset IBV_SHOW_WARNINGS

A=usrcdA$$ B=usrcdB$$ VA=da$$ VB=db$$
new_root
OUT=$(mktemp /tmp/usrc-out.XXXXXX)
cleanup() {
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
  rm -rf "$USRC_ROOT" "$OUT" "$OUT.err"
}
trap cleanup EXIT
S=$USRC_ROOT/sys/class/infiniband

veth_pair $A $B $VA $VB 10.204.0
ip netns exec $A "$USRC" link add d_a netdev $VA || fail "link add in $A"
ip netns exec $B "$USRC" link add d_b netdev $VB type roce || fail "link add in $B"
"$USRC" link add d_root netdev lo port 38000 || fail "link add in the root namespace"

# The namespace each was made in, recorded.
grep -qx "netns=$(stat -L -c %i /run/netns/$A)" $S/d_a/usrc.conf || fail "d_a: netns of $A not recorded"
grep -qx "netns=$(stat -L -c %i /proc/self/ns/net)" $S/d_root/usrc.conf || fail "d_root: root netns not recorded"

# device/net/IF names the netdev, and is the netdev's own directory in its
# namespace's /sys.
[ "$(ls $S/d_a/device/net)" = $VA ] || fail "d_a: device/net lists '$(ls $S/d_a/device/net)', not $VA"
[ "$(ls $S/d_b/device/net)" = $VB ] || fail "d_b: device/net lists '$(ls $S/d_b/device/net)'"
[ "$(ls $S/d_root/device/net)" = lo ] || fail "d_root: device/net lists '$(ls $S/d_root/device/net)'"
ifindex=$(ip -n $A -o link show dev $VA | cut -d: -f1)
[ "$(ip netns exec $A cat $S/d_a/device/net/$VA/ifindex)" = "$ifindex" ] ||
  fail "d_a: device/net/$VA is not $VA of $A (ifindex $ifindex)"

# devices NS: the names ibv_devices lists in network namespace NS ("": the
# root one), on one line; its stderr must be empty.
devices() {
  ${1:+ip netns exec $1} timeout 30 "$USRC" exec -- ibv_devices >"$OUT" 2>"$OUT.err" ||
    fail "ibv_devices in ${1:-the root namespace}: $(cat "$OUT.err")"
  [ ! -s "$OUT.err" ] || fail "ibv_devices in ${1:-the root namespace} wrote to stderr: $(cat "$OUT.err")"
  awk 'NR > 2 { print $1 }' "$OUT" | sort | xargs
}
[ "$(devices $A)" = d_a ] || fail "in $A: '$(devices $A)' listed, expected d_a alone"
[ "$(devices $B)" = d_b ] || fail "in $B: '$(devices $B)' listed, expected d_b alone"
[ "$(devices)" = d_root ] || fail "in the root namespace: '$(devices)' listed, expected d_root alone"
note "each namespace lists its own device only, nothing on stderr"

# Not opened elsewhere either; opened, queried and checked at home.
ip netns exec $B timeout 30 "$USRC" exec -- ibv_devinfo -d d_a >"$OUT" 2>&1 && fail "d_a opened in $B: $(cat "$OUT")"
timeout 30 "$USRC" exec -- ibv_devinfo -d d_a >"$OUT" 2>&1 && fail "d_a opened in the root namespace: $(cat "$OUT")"
ip netns exec $A env USRC_TEST_DEV=d_a timeout 60 "$USRC" exec -- "$PROG" "[device]" || fail "[device] tests on d_a in $A"
ip netns exec $B env USRC_TEST_DEV=d_b timeout 60 "$USRC" exec -- "$PROG" "[device]" || fail "[device] tests on d_b (roce) in $B"
vendor=$(timeout 30 "$USRC" exec -- ibv_devinfo -d d_root | awk '$1 == "vendor_id:" { print $2 }')
[ -n "$vendor" ] && [ $((vendor)) -ne 0 ] || fail "ibv_devinfo: vendor_id '$vendor'"
note "ibv_devinfo: vendor_id $vendor"

# Where tools look without SYSFS_PATH (pyverbs' tests, UCX): under usrc exec,
# as root, /sys/class/infiniband lists the namespace's devices, each with its
# netdev under device/net, and the rest of /sys/class is the real one; the
# host's own /sys is untouched.
sysview() {
  ${1:+ip netns exec $1} timeout 30 "$USRC" exec -- sh -c "$2" 2>&1
}
had_ib=$([ -e /sys/class/infiniband ] && echo yes)
[ "$(sysview $A 'ls /sys/class/infiniband')" = d_a ] || fail "in $A: /sys/class/infiniband: '$(sysview $A 'ls /sys/class/infiniband')'"
[ "$(sysview $A "ls /sys/class/infiniband/d_a/device/net")" = $VA ] || fail "in $A: /sys/class/infiniband/d_a/device/net"
[ "$(sysview $A "cat /sys/class/infiniband/d_a/device/net/$VA/ifindex")" = "$ifindex" ] ||
  fail "in $A: device/net/$VA is not $VA"
[ "$(sysview $A 'cat /sys/class/infiniband_verbs/*/ibdev')" = d_a ] || fail "in $A: infiniband_verbs lists others"
[ "$(sysview $B 'cat /sys/class/infiniband/d_b/ports/1/link_layer')" = Ethernet ] || fail "in $B: d_b's link layer"
[ "$(sysview "" 'ls /sys/class/infiniband')" = d_root ] || fail "root namespace: '$(sysview "" 'ls /sys/class/infiniband')'"
sysview $A "cat /sys/class/net/$VA/ifindex" | grep -qx "$ifindex" || fail "in $A: /sys/class/net hidden"
[ "$([ -e /sys/class/infiniband ] && echo yes)" = "$had_ib" ] || fail "the host's /sys/class changed"
note "usrc exec: /sys/class/infiniband shows the namespace's devices and their netdevs"

# A device made before namespaces were recorded: offered everywhere.
sed -i '/^netns=/d' $S/d_a/usrc.conf
[ "$(devices $A)" = d_a ] || fail "unrecorded: in $A: '$(devices $A)'"
[ "$(devices $B)" = "d_a d_b" ] || fail "unrecorded: in $B: '$(devices $B)'"
[ "$(devices)" = "d_a d_root" ] || fail "unrecorded: in the root namespace: '$(devices)'"
ip netns exec $A timeout 30 "$USRC" exec -- ibv_devinfo -d d_a | grep -q PORT_ACTIVE || fail "unrecorded: d_a in $A"
echo PASS
