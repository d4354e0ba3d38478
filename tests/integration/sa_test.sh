#!/bin/bash
# The subnet administrator (docs/sa.md) across three network namespaces on
# one bridge: `usrc sa` in the first, a device in each registering with it
# (LIDs and the SM LID in the port), path queries between every pair, and a
# GetTable answer of more than 50 MADs carried by RMPP under 10% nftables
# loss with every record intact; a capture that tshark dissects as RMPP
# segments (skipped without tshark).
# Usage: sa_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
need_tools nft jq
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 77; }

A=saA$$ B=saB$$ C=saC$$ NET=10.203.0 SAPORT=29700 BR=sabr$$
SA=$NET.1:$SAPORT
new_root
OUT=$(mktemp -d /tmp/usrc-sa.XXXXXX)
sapid=
cleanup() {
  [ -n "$sapid" ] && kill $sapid 2>/dev/null
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; ip netns del $C 2>/dev/null
  rm -rf "$USRC_ROOT" "$OUT"
}
trap cleanup EXIT

# A holds the bridge; B and C hang on it by veths.
ip netns add $A && ip netns add $B && ip netns add $C || fail "netns"
ip -n $A link add $BR type bridge || fail "bridge"
ip -n $A link set lo up
i=1
for ns in $A $B $C; do
  ip netns exec $ns ip link set lo up
  [ $ns = $A ] && continue
  i=$((i + 1))
  ip link add sav$i$$ netns $A type veth peer name sap$i$$ netns $ns || fail "veth"
  ip -n $A link set sav$i$$ master $BR up
  ip -n $ns addr add $NET.$i/24 dev sap$i$$
  ip -n $ns link set sap$i$$ up
done
ip -n $A addr add $NET.1/24 dev $BR
ip -n $A link set $BR up
for _ in $(seq 50); do
  ip -n $A link show $BR | grep -q "state UP" && ip -n $B link show sap2$$ | grep -q "state UP" &&
    ip -n $C link show sap3$$ | grep -q "state UP" && break
  sleep 0.1
done
ip -n $B link show sap2$$ | grep -q "state UP" || fail "links did not come up"

ip netns exec $A timeout 300 "$USRC" sa --listen $SA --state "$OUT/state" >"$OUT/sa.json" 2>"$OUT/sa.log" &
sapid=$!
for _ in $(seq 50); do grep -qs serving "$OUT/sa.log" && break; sleep 0.1; done
grep -qs serving "$OUT/sa.log" || { cat "$OUT/sa.log"; fail "usrc sa did not start"; }

# Registration: link add ... sa ADDR:PORT.
ip netns exec $A "$USRC" link add saa netdev $BR sa $SA || fail "link add saa"
ip netns exec $B "$USRC" link add sab netdev sap2$$ sa $SA || fail "link add sab"
ip netns exec $C "$USRC" link add sac netdev sap3$$ sa $SA || fail "link add sac"
declare -A LID
for d in saa sab sac; do
  LID[$d]=$(( $(cat "$USRC_ROOT/sys/class/infiniband/$d/ports/1/lid") ))
  sm=$(cat "$USRC_ROOT/sys/class/infiniband/$d/ports/1/sm_lid")
  [ "$sm" = 0x1 ] || fail "$d: sm_lid $sm, expected 0x1"
  grep -q "^sa=$SA$" "$USRC_ROOT/sys/class/infiniband/$d/usrc.conf" || fail "$d: sa not in usrc.conf"
done
[ "${LID[saa]} ${LID[sab]} ${LID[sac]}" = "2 3 4" ] || fail "LIDs ${LID[*]}, expected 2 3 4"
ip netns exec $B "$USRC" link show sab | grep -q " lid 3 .* sa $SA sm_lid 1$" || fail "link show: $(ip netns exec $B "$USRC" link show sab)"
note "LIDs: saa ${LID[saa]} sab ${LID[sab]} sac ${LID[sac]}"
# Registering again keeps the LID.
ip netns exec $B "$USRC" link del sab && ip netns exec $B "$USRC" link add sab netdev sap2$$ sa $SA ||
  fail "link add sab again"
[ "$(cat "$USRC_ROOT/sys/class/infiniband/sab/ports/1/lid")" = 0x3 ] || fail "sab changed its LID"
if command -v ibv_devinfo >/dev/null; then
  ip netns exec $B "$USRC" exec -- ibv_devinfo -d sab -v >"$OUT/devinfo" 2>&1
  grep -q "sm_lid:[[:space:]]*1$" "$OUT/devinfo" || { cat "$OUT/devinfo"; fail "ibv_devinfo: sm_lid"; }
  grep -q "port_lid:[[:space:]]*3$" "$OUT/devinfo" || { cat "$OUT/devinfo"; fail "ibv_devinfo: port_lid"; }
fi

# A path from every namespace to every port, by SubnAdmGet.
declare -A DEV=([$A]=saa [$B]=sab [$C]=sac)
for ns in $A $B $C; do
  for d in saa sab sac; do
    s=${LID[${DEV[$ns]}]} t=${LID[$d]}
    line=$(ip netns exec $ns timeout 30 "$USRC" sa query path --get -d ${DEV[$ns]} --slid $s --dlid $t) ||
      fail "path $s -> $t from $ns"
    echo "$line" | grep -q "^path slid $s dlid $t sgid fe80::" || fail "path $s -> $t: $line"
  done
done
n=$(ip netns exec $C timeout 30 "$USRC" sa query path -d sac --json | jq length)
[ "$n" = 9 ] || fail "path table: $n records, expected 9"
ip netns exec $B timeout 30 "$USRC" sa query port -d sab --lid 4 --get | grep -q "^port lid 4 port 1 sm_lid 1 state ACTIVE" ||
  fail "port query"
note "paths between every pair of the three ports"

CTX=0   # contexts opened: each asks the SA for its table of ports
# The provider resolves DLIDs through the SA: sab (LID 3) is 10.203.0.2,
# which the low-bits scheme would take for 10.203.0.3 (sac).
if command -v ibv_rc_pingpong >/dev/null; then
  port=$(pick_port)
  ip netns exec $B timeout 60 "$USRC" exec -- ibv_rc_pingpong -d sab -c -n 100 -p $port >"$OUT/pp.srv" 2>&1 &
  ppid=$!
  wait_listen $B $port || fail "pingpong server did not listen"
  ip netns exec $C timeout 60 "$USRC" exec -- ibv_rc_pingpong -d sac -c -n 100 -p $port $NET.2 >"$OUT/pp.cli" 2>&1 ||
    { cat "$OUT/pp.srv" "$OUT/pp.cli"; fail "rc_pingpong between SA LIDs"; }
  wait $ppid || { cat "$OUT/pp.srv"; fail "rc_pingpong server"; }
  grep -q "remote address: *LID 0x0003" "$OUT/pp.cli" || { cat "$OUT/pp.cli"; fail "pingpong: not LID 3"; }
  CTX=$((CTX + 2))
  note "ibv_rc_pingpong from LID 4 to LID 3 (resolved by the SA): $(grep -h 'bytes in' "$OUT/pp.cli" | head -1)"
fi
# rdma_cm: rdma_resolve_route asks the SA for the path, so the REQ names
# the SA's LIDs (4 to 3; the low-bits scheme would say 3 to 2).
if command -v rping >/dev/null; then
  port=$(( 7000 + RANDOM % 2000 ))
  sid=$(printf 's%016x' $(( 0x01060000 + port )))
  ip netns exec $B timeout 60 "$USRC" exec -- rping -s -a $NET.2 -p $port -C 10 -V >"$OUT/rp.srv" 2>&1 &
  ppid=$!
  for i in $(seq 100); do ls "$USRC_ROOT"/cm/*/$sid >/dev/null 2>&1 && break; sleep 0.1; done
  ip netns exec $C timeout 60 "$USRC" exec --trace "$OUT/rp.pcap" -- rping -c -a $NET.2 -p $port -C 10 -V \
    >"$OUT/rp.cli" 2>&1 || { cat "$OUT/rp.srv" "$OUT/rp.cli"; fail "rping between SA LIDs"; }
  wait $ppid || { cat "$OUT/rp.srv"; fail "rping server"; }
  CTX=$((CTX + 2))
  if command -v tshark >/dev/null; then
    base=$(sed -n 's/^base_port=//p' "$USRC_ROOT/sys/class/infiniband/sab/usrc.conf")
    lids=$(tshark -r "$OUT/rp.pcap" -d udp.port==$base,infiniband -Y infiniband.cm.req.prim_locallid \
      -T fields -e infiniband.cm.req.prim_locallid -e infiniband.cm.req.prim_remotelid 2>/dev/null | head -1)
    [ "$(echo $lids)" = "4 3" ] || fail "rping's REQ: LIDs '$lids', expected the SA's 4 3"
  fi
  note "rping -V from LID 4 to LID 3 over rdma_cm, the route from the SA"
fi

# And UD: the address handles resolve the DLID through the SA.
if command -v ibv_ud_pingpong >/dev/null; then
  port=$(pick_port)
  ip netns exec $B timeout 60 "$USRC" exec -- ibv_ud_pingpong -d sab -c -n 100 -s 512 -p $port >"$OUT/ud.srv" 2>&1 &
  ppid=$!
  wait_listen $B $port || fail "ud_pingpong server did not listen"
  ip netns exec $C timeout 60 "$USRC" exec -- ibv_ud_pingpong -d sac -c -n 100 -s 512 -p $port $NET.2 >"$OUT/ud.cli" 2>&1 ||
    { cat "$OUT/ud.srv" "$OUT/ud.cli"; fail "ud_pingpong between SA LIDs"; }
  wait $ppid || { cat "$OUT/ud.srv"; fail "ud_pingpong server"; }
  CTX=$((CTX + 2))
  note "ibv_ud_pingpong from LID 4 to LID 3: $(grep -h 'bytes in' "$OUT/ud.cli" | head -1)"
fi

# 150 more ports: the NodeRecord table is then 153 records of 112 bytes,
# 86 MADs of RMPP.
for i in $(seq 1 150); do
  ip netns exec $A "$USRC" sa register --sa $SA --guid $((0x5a0000 + i)) --addr 10.204.$((i / 200)).$((i % 200 + 1)) \
    --desc "extra$i" >/dev/null || fail "register $i"
done

capture() {   # capture NS FILE: tshark on the namespace's SA traffic, pid in $tpid
  rm -f "$2" "$2.log"
  ip netns exec $1 timeout 60 tshark -q -i any -f "udp port $SAPORT" -w "$2" >"$2.log" 2>&1 &
  tpid=$!
  for _ in $(seq 100); do grep -qs "Capturing on" "$2.log" && break; sleep 0.1; done
  sleep 0.3
}
command -v tshark >/dev/null && capture $B "$OUT/cap.pcap"

# 10% loss both ways: the SA's segments into B, B's ACKs into A.
for ns in $A $B; do
  ip netns exec $ns nft -f - <<NFT || fail "nft"
table inet usrcsaloss {
  chain in {
    type filter hook input priority 0;
    udp sport $SAPORT numgen random mod 100 < 10 counter drop
    udp dport $SAPORT numgen random mod 100 < 10 counter drop
  }
}
NFT
done
for round in 1 2 3; do
  ip netns exec $B timeout 120 "$USRC" sa query node -d sab --json >"$OUT/nodes.json" || fail "node table under loss ($round)"
  [ "$(jq length "$OUT/nodes.json")" = 153 ] || fail "node table: $(jq length "$OUT/nodes.json") records"
  for i in $(seq 1 150); do
    echo "extra$i $((0x5a0000 + i))"
  done >"$OUT/want"
  jq -r '.[] | select(.description | startswith("extra")) | "\(.description) \(.port_guid)"' "$OUT/nodes.json" |
    while read -r d g; do echo "$d $((g))"; done | sort >"$OUT/got"
  sort "$OUT/want" | cmp -s - "$OUT/got" || { diff <(sort "$OUT/want") "$OUT/got" | head; fail "records differ"; }
  jq -e '[.[] | select(.lid < 2 or .lid > 154)] | length == 0' "$OUT/nodes.json" >/dev/null || fail "bad LIDs"
done
dropped=$( (ip netns exec $A nft list ruleset; ip netns exec $B nft list ruleset) | grep -o 'packets [0-9]*' |
  awk '{s+=$2} END {print s}')
note "3 node tables of 153 records under 10% loss; nftables dropped $dropped packets"
ip netns exec $A nft delete table inet usrcsaloss
ip netns exec $B nft delete table inet usrcsaloss

if [ -n "${tpid:-}" ]; then
  sleep 0.5
  kill -INT $tpid; wait $tpid
  tshark -r "$OUT/cap.pcap" -d udp.port==$SAPORT,infiniband -Y 'infiniband.rmpp.rmpptype == 1' \
    -T fields -e infiniband.mad.method -e infiniband.rmpp.segmentnumber -e infiniband.rmpp.rmppflags \
    -e infiniband.rmpp.payloadlength -e infiniband.sa.attributeoffset >"$OUT/segs" 2>/dev/null
  # RMPPFlags: First (2) on segment 1, Last (4) on segment 86.
  seg() {
    tshark -r "$OUT/cap.pcap" -d udp.port==$SAPORT,infiniband -T fields -e infiniband.rmpp.payloadlength \
      -Y "infiniband.mad.method == 0x92 && infiniband.rmpp.segmentnumber == $1 && infiniband.rmpp.rmppflags & $2" \
      2>/dev/null | head -1
  }
  first=$(seg 1 2) last=$(seg 86 4)
  # 153 records x 112 bytes = 17136 in 86 segments of 200: the first
  # counts 86 x 220 - 64 bytes of padding, the last 220 - 64.
  [ "$((first))" = $((86 * 220 - 64)) ] || { head "$OUT/segs"; fail "tshark: first segment's payload length $first"; }
  [ "$((last))" = $((220 - 64)) ] || fail "tshark: last segment's payload length $last"
  acks=$(tshark -r "$OUT/cap.pcap" -d udp.port==$SAPORT,infiniband -Y 'infiniband.rmpp.rmpptype == 2' 2>/dev/null | wc -l)
  [ "$acks" -gt 0 ] || fail "tshark: no RMPP ACKs"
  note "tshark: $(wc -l <"$OUT/segs") RMPP DATA segments, $acks ACKs"
else
  note "tshark not installed: capture not checked"
fi

# Tables: the path table, one for the SLIDs of each context of the
# pingpongs (lossless: done), the three node tables (a transfer
# whose last ACK was lost is still retrying, or aborted, when the SA stops).
kill -TERM $sapid; wait $sapid; sapid=
cat "$OUT/sa.json"
jq -e '.transfers >= 4 + '$CTX' and .transfers_done >= 1 + '$CTX' and .transfers_done + .transfers_aborted <= .transfers and .segments_sent >= 258' "$OUT/sa.json" >/dev/null || fail "SA counters"
resent=$(jq '.segments_resent + .timeouts' "$OUT/sa.json")
[ "$dropped" -eq 0 ] || [ "$resent" -gt 0 ] || fail "packets were dropped but nothing was resent"
# With no SA, a query ends (7 resends of the request) with an error.
if ip netns exec $B timeout 30 "$USRC" sa query node -d sab >"$OUT/gone" 2>&1; then fail "query without an SA succeeded"; fi
grep -q "did not answer" "$OUT/gone" || { cat "$OUT/gone"; fail "query without an SA: $(cat "$OUT/gone")"; }
# The registrations are kept: a restarted SA knows the LIDs.
grep -q "^3 " "$OUT/state" || fail "state file"
ip netns exec $A timeout 60 "$USRC" sa --listen $SA --state "$OUT/state" >/dev/null 2>"$OUT/sa2.log" &
sapid=$!
for _ in $(seq 50); do grep -qs serving "$OUT/sa2.log" && break; sleep 0.1; done
grep -q "153 ports registered" "$OUT/sa2.log" || { cat "$OUT/sa2.log"; fail "restart: registrations lost"; }
ip netns exec $C timeout 30 "$USRC" sa query node -d sac --get --lid 3 | grep -q 'desc "sab ' || fail "restart: LID 3"
echo PASS
