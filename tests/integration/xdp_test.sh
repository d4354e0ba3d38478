#!/bin/bash
# The AF_XDP backend between two network namespaces over a veth pair:
# stock ibv_rc_pingpong and ib_write_bw with both sides on xdp, then one side
# on xdp against the other on udp (the same wire). Exit 77 where AF_XDP
# cannot run (no root, built without libbpf).
# Usage: xdp_test.sh USRC_CLI PROVIDER_SO [VERBS_TESTS]
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (namespaces, XDP)"; exit 77; }
A=xdpA$$ B=xdpB$$
new_root
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$USRC_ROOT" "${OUT:-/nonexistent}"*; }
trap cleanup EXIT
veth_pair $A $B xa$$ xb$$ 10.203.0
# One device root serves both namespaces: names differ per side. All use
# base port 20000, so a QPN-derived port means the same on both sides.
ip netns exec $A "$USRC" link add da netdev xa$$ backend xdp || fail "link add A xdp"
ip netns exec $B "$USRC" link add db netdev xb$$ backend xdp || fail "link add B xdp"
# xdp devices receive at base + slot alone (the slot scheme); udp devices
# that talk to them must send there too: roce_port 0. A udp device cannot
# ask for the RoCE port on xdp.
ip netns exec $A "$USRC" link add ua netdev xa$$ roce_port 0 || fail "link add A udp"
ip netns exec $B "$USRC" link add ub netdev xb$$ roce_port 0 || fail "link add B udp"
ip netns exec $A "$USRC" link add dx netdev xa$$ backend xdp roce_port 4791 2>/dev/null &&
  fail "link add: roce_port accepted on the xdp backend"
probe=$(ip netns exec $A timeout 20 "$USRC" exec -- ibv_devinfo -d da 2>&1)
if echo "$probe" | grep -q "built without"; then echo "$probe"; exit 77; fi
OUT=$(mktemp /tmp/usrc-out.XXXXXX)
# pair NAME SERVER_DEV(B) CLIENT_DEV(A) PROGRAM ARGS...
pair() {
  local name=$1 sdev=$2 cdev=$3 port; port=$(pick_port); shift 3
  ip netns exec $B timeout 60 "$USRC" exec -- "$@" -d $sdev -p $port >"$OUT.srv" 2>&1 &
  wait_listen $B $port || fail "$name: server did not listen"
  mode=$(ip -n $B -d link show xb$$ | grep -o 'prog/xdp[a-z]*' | head -1)   # (while it runs)
  note "$name: $mode on xb$$"
  ip netns exec $A timeout 60 "$USRC" exec -- "$@" -d $cdev -p $port 10.203.0.2 >"$OUT.cli" 2>&1
  local crc=$?; wait $!; local src=$?
  [ $crc = 0 ] && [ $src = 0 ] || { cat "$OUT.srv" "$OUT.cli"; fail "$name"; }
  note "$name: $(grep -h 'bytes in' "$OUT.cli")"
}
pair "xdp-xdp pingpong -c" db da ibv_rc_pingpong -c -n 2000
pair "xdp-xdp pingpong -e" db da ibv_rc_pingpong -e -s 16384
pair "xdp-xdp ib_write_bw" db da ib_write_bw -s 65536 -n 1000 -F
grep -h "^ 65536" "$OUT.cli"
pair "xdp (B) - udp (A) pingpong -c" db ua ibv_rc_pingpong -c -n 1000
pair "udp (B) - xdp (A) pingpong -c" ub da ibv_rc_pingpong -c -n 1000
pair "xdp (B) - udp (A) ib_write_bw" db ua ib_write_bw -s 65536 -n 1000 -F
grep -h "^ 65536" "$OUT.cli"

# A process killed while it holds the netdev (no clean-up of its own) takes
# its XDP program with it: the netdev is free for the next one.
port=$(pick_port)
ip netns exec $B timeout 60 "$USRC" exec -- ib_write_bw -d db -s 65536 -D 30 -F -p $port >"$OUT.srv" 2>&1 &
wait_listen $B $port || fail "killed process: server did not listen"
ip -n $B link show xb$$ | grep -q 'prog/xdp' || fail "no XDP program on xb$$ while a server runs"
pkill -KILL -f "ib_write_bw -d db -s 65536 -D 30" ; wait $! 2>/dev/null
for _ in $(seq 100); do ip -n $B link show xb$$ | grep -q 'prog/xdp' || break; sleep 0.1; done
ip -n $B link show xb$$ | grep -q 'prog/xdp' && fail "a killed process left its XDP program on xb$$"
pair "xdp-xdp pingpong after a killed process" db da ibv_rc_pingpong -c -n 1000

# The peer's MAC changes under a running transfer (A on xdp, B on udp, whose
# kernel drops frames sent to its old MAC) and A's kernel forgets the old
# entry: the backend's neighbour cache follows the kernel's table (entry
# gone, resolved anew), so the transfer goes on to its end.
tx_of() { "$USRC" stats "$1" | awk '{for (i = 1; i < NF; i++) if ($i == "tx_packets") print $(i + 1)}'; }
port=$(pick_port)
ip netns exec $B timeout 60 "$USRC" exec -- ib_write_bw -d ub -s 4096 -D 4 -F -p $port >"$OUT.srv" 2>&1 &
spid=$!
wait_listen $B $port || fail "neighbour change: server did not listen"
tx0=$(tx_of da)
ip netns exec $A timeout 60 "$USRC" exec -- ib_write_bw -d da -s 4096 -D 4 -F -p $port 10.203.0.2 >"$OUT.cli" 2>&1 &
cpid=$!
for _ in $(seq 200); do [ "$(tx_of da)" -gt $((tx0 + 1000)) ] && break; sleep 0.05; done
ip -n $B link set xb$$ address 02:00:00:5e:00:0b || fail "new MAC on xb$$"
ip -n $A neigh flush dev xa$$
kill -0 $cpid 2>/dev/null || note "neighbour change: the transfer ended before the change"
wait $cpid; crc=$?; wait $spid; src=$?
[ $crc = 0 ] && [ $src = 0 ] || { cat "$OUT.srv" "$OUT.cli"; fail "transfer across a neighbour change"; }
ip -n $A neigh show dev xa$$ | grep -q 02:00:00:5e:00:0b || fail "A never learnt B's new MAC"
note "neighbour change: $(grep -h '^ 4096' "$OUT.cli")"

# A jumbo MTU (issue 24: every context open failed): link add gives an IBA
# MTU an XSK frame carries (2048), and the program attaches in native mode
# (it is multi-buffer aware, which veth requires above a page).
ip -n $A link set xa$$ mtu 9000 && ip -n $B link set xb$$ mtu 9000 || fail "MTU 9000"
ip netns exec $A "$USRC" link add ja netdev xa$$ backend xdp || fail "link add A xdp, MTU 9000"
ip netns exec $B "$USRC" link add jb netdev xb$$ backend xdp || fail "link add B xdp, MTU 9000"
"$USRC" link show ja | grep -q ' mtu 2048 ' || fail "xdp at MTU 9000: $("$USRC" link show ja)"
pair "xdp-xdp pingpong, MTU 9000" jb ja ibv_rc_pingpong -m 2048 -s 8192 -n 1000
[ "$mode" = prog/xdp ] || fail "not native XDP at MTU 9000: $mode"
pair "xdp-xdp ib_write_bw, MTU 9000" jb ja ib_write_bw -s 65536 -n 1000 -F
grep -h "^ 65536" "$OUT.cli"
echo PASS
