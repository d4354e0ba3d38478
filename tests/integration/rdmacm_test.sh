#!/bin/bash
# Stock librdmacm programs (Debian's rdmacm-utils) over usrc's emulated
# rdma_cm (docs/cm.md): rping with data verification, ucmatose with
# several connections, rdma_server/rdma_client; on lo with both link
# layers, then across two network namespaces joined by a veth pair. Also a
# REQ nobody listens for (REJECTED) and one nobody answers (UNREACHABLE).
# Usage: rdmacm_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
need_tools rping ucmatose rdma_server rdma_client
A=usrccma$$ B=usrccmb$$
ROOTS=()
cleanup() {
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
  rm -rf "${ROOTS[@]}" /tmp/usrc-out.cm.*
}
trap cleanup EXIT

# pair NAME SERVER_NS CLIENT_NS -- SERVER_CMD... -- CLIENT_CMD...: the
# server and the client through `usrc exec`, both must exit 0. PORT is set.
pair() {
  local name=$1 sns=$2 cns=$3; shift 4
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift
  cli=("$@")
  local out=/tmp/usrc-out.cm.$$
  ${sns:+ip netns exec $sns} timeout 60 "$USRC" exec -- "${srv[@]}" >$out.srv 2>&1 &
  local spid=$!
  wait_service 0x0106 $PORT || { kill $spid; cat $out.srv; fail "$name: server did not listen"; }
  ${cns:+ip netns exec $cns} timeout 60 "$USRC" exec -- "${cli[@]}" >$out.cli 2>&1
  local crc=$?
  wait $spid; local src=$?
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    echo "== server ($src):"; cat $out.srv; echo "== client ($crc):"; cat $out.cli
    fail "$name"
  fi
  note "$name: ok"
}

suite() {   # suite LABEL SERVER_NS CLIENT_NS ADDR
  local l=$1 sns=$2 cns=$3 ip=$4
  PORT=$(( 7000 + RANDOM % 2000 ))
  pair "$l rping -V" "$sns" "$cns" -- rping -s -a $ip -p $PORT -C 10 -V -- rping -c -a $ip -p $PORT -C 10 -V

  PORT=$(( 9000 + RANDOM % 2000 ))
  pair "$l ucmatose -c 4" "$sns" "$cns" -- ucmatose -p $PORT -c 4 -C 20 -- ucmatose -s $ip -p $PORT -c 4 -C 20
  PORT=$(( 11000 + RANDOM % 2000 ))
  pair "$l rdma_server/rdma_client" "$sns" "$cns" -- rdma_server -p $PORT -- rdma_client -s $ip -p $PORT
}

# On lo, one root per link layer (both devices would have 127.0.0.1).
for ll in ib roce; do
  new_root; ROOTS+=("$USRC_ROOT")
  if [ $ll = roce ]; then "$USRC" link add cml_$ll netdev lo type roce port 28600 || fail "link add"
  else "$USRC" link add cml_$ll netdev lo port 28600 || fail "link add"; fi
  suite "lo $ll" "" "" 127.0.0.1
  "$USRC" link del cml_$ll
done

# Refusals: nobody listens (REJ, invalid service ID) and nobody answers.
new_root; ROOTS+=("$USRC_ROOT")
"$USRC" link add cml_rej netdev lo port 28640 || fail "link add"
timeout 30 "$USRC" exec -- rping -c -a 127.0.0.1 -p 7999 -C 1 -v >/tmp/usrc-out.cm.rej 2>&1 && fail "rping to no listener must fail"
grep -q "RDMA_CM_EVENT_REJECTED, error 8" /tmp/usrc-out.cm.rej || { cat /tmp/usrc-out.cm.rej; fail "expected REJECTED (8)"; }
note "no listener: REJECTED, invalid service ID"
timeout 60 "$USRC" exec -- rping -c -a 127.0.0.2 -p 7999 -C 1 -v >/tmp/usrc-out.cm.unr 2>&1 && fail "rping to nobody must fail"
grep -q "RDMA_CM_EVENT_UNREACHABLE" /tmp/usrc-out.cm.unr || { cat /tmp/usrc-out.cm.unr; fail "expected UNREACHABLE"; }
note "no answer: UNREACHABLE"
c=$("$USRC" stats cml_rej | tr ' ' '\n' | grep -A1 '^cm_sent$' | tail -1)
[ "${c:-0}" -ge 5 ] || fail "cm_sent counts the REQ and its resends (got $c)"
"$USRC" link del cml_rej

# Across network namespaces.
if [ "$(id -u)" = 0 ]; then
  new_root; ROOTS+=("$USRC_ROOT")
  NET=10.$(( 100 + RANDOM % 100 )).$(( RANDOM % 250 ))
  veth_pair $A $B cmva$$ cmvb$$ $NET
  ip netns exec $A "$USRC" link add cmn_a$$ netdev cmva$$ port 28660 || fail "link add A"
  ip netns exec $B "$USRC" link add cmn_b$$ netdev cmvb$$ port 28660 || fail "link add B"
  suite "netns ib" $A $B $NET.1
  ip netns exec $A "$USRC" link del cmn_a$$; ip netns exec $B "$USRC" link del cmn_b$$
  ip netns exec $A "$USRC" link add cmn_a$$ netdev cmva$$ type roce port 28660 || fail "link add A"
  ip netns exec $B "$USRC" link add cmn_b$$ netdev cmvb$$ type roce port 28660 || fail "link add B"
  suite "netns roce" $A $B $NET.1
  ip netns exec $A "$USRC" link del cmn_a$$; ip netns exec $B "$USRC" link del cmn_b$$
else
  note "not root: no netns part"
fi
echo PASS
