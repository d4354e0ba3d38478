#!/bin/bash
# Real packet loss: two network namespaces joined by a veth pair, nftables
# dropping a share of usrc's UDP packets on input in both, stock
# ibv_rc_pingpong with -c (data checked) must complete.
# With VERBS_TESTS, our verbs test program (every operation, data checked)
# also runs inside one namespace under the same loss.
# Usage: loss_test.sh USRC_CLI PROVIDER_SO PERCENT [ITERS [VERBS_TESTS]]
USRC=$1 USRC_PROVIDER=$2 PCT=$3 ITERS=${4:-300} VERBS=${5:-}
. "$(dirname "$0")/lib.sh"
command -v ibv_rc_pingpong >/dev/null || { echo "ibv_rc_pingpong not installed"; exit 77; }
command -v nft >/dev/null || { echo "nft not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 77; }

A=usrcA$$ B=usrcB$$
new_root
cleanup() {
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
  rm -rf "$USRC_ROOT" /tmp/usrc-out.*
}
trap cleanup EXIT
veth_pair $A $B va$$ vb$$ 10.201.0
for ns in $A $B; do
  ip netns exec $ns nft -f - <<NFT || fail "nft"
table inet usrcloss {
  chain in {
    type filter hook input priority 0;
    udp dport { 4791, 20000-24095 } numgen random mod 100 < $PCT counter drop
  }
}
NFT
done
ip netns exec $A "$USRC" link add la netdev va$$ || fail "link add A"
ip netns exec $B "$USRC" link add lb netdev vb$$ || fail "link add B"


# The server uses device lb in namespace B, the client la in namespace A:
# run them by hand since the device names differ. From 10% on, without
# UDP GSO: nftables then drops single packets of a message (with GSO, a
# message of a few packets is one send, lost whole), and the packets after
# a lost one are kept and it is resent alone (checked below).
GSO=; [ "$PCT" -ge 10 ] && GSO=USRC_GSO=1
port=$(pick_port)
ip netns exec $B timeout 240 env $GSO "$USRC" exec -- ibv_rc_pingpong -d lb -c -n "$ITERS" -p $port >/tmp/usrc-out.srv 2>&1 &
spid=$!
wait_listen $B $port || fail "server did not listen"
ip netns exec $A timeout 240 env $GSO "$USRC" exec -- ibv_rc_pingpong -d la -c -n "$ITERS" -p $port 10.201.0.2 >/tmp/usrc-out.cli 2>&1
crc=$?
wait $spid; src=$?
if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
  echo "== server ($src):"; cat /tmp/usrc-out.srv; echo "== client ($crc):"; cat /tmp/usrc-out.cli
  fail "pingpong under $PCT% loss"
fi
note "loss $PCT%: $(grep 'bytes in' /tmp/usrc-out.cli)"
dropped=$(ip netns exec $A nft list ruleset | grep -o 'packets [0-9]*' | awk '{s+=$2} END {print s}')
dropped_b=$(ip netns exec $B nft list ruleset | grep -o 'packets [0-9]*' | awk '{s+=$2} END {print s}')
note "nftables dropped $dropped (A) + $dropped_b (B) packets"
[ "$PCT" = 0 ] || [ $((dropped + dropped_b)) -gt 0 ] || fail "no packet was dropped: the test did not test loss"
if [ -n "$VERBS" ]; then
  # Traffic to the namespace's own address crosses its input hook too.
  # (The unreliable services' tests, UD and UC, expect every packet to
  # arrive: they lose messages under loss by design.)
  ip netns exec $A env USRC_SHM=0 USRC_TEST_DEV=la USRC_TEST_PORT=20000 USRC_TEST_LOSSY=1 timeout 300 "$USRC" exec -- "$VERBS" '~[unreliable]~[.]' ||
    fail "verbs tests under $PCT% loss"
  note "verbs tests passed under $PCT% loss"
fi
"$USRC" stats la
"$USRC" stats lb
# Messages of four packets (ibv_rc_pingpong's 4 KB at its 1 KB MTU): a lost
# packet followed by others of its message is recovered by keeping those
# and resending it alone.
sum() { { "$USRC" stats la; "$USRC" stats lb; } | grep -o "$1 [0-9]*" | awk '{ s += $2 } END { print s + 0 }'; }
if [ "$PCT" -ge 10 ]; then
  [ "$(sum held)" -gt 0 ] || fail "no packet kept beyond a gap under $PCT% loss"
  [ "$(sum selective_resends)" -gt 0 ] || fail "no lost packet resent alone under $PCT% loss"
fi
echo "PASS"
