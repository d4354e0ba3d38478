# Helpers for the integration tests (sourced). Every test uses a private
# USRC_ROOT and cleans up after itself.
set -u
USRC=${USRC:?path to the usrc CLI}
export USRC_PROVIDER=${USRC_PROVIDER:?path to libusrc-rdmav34.so}
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "--- $*"; }

# need_tools CMD...: skips the test (exit 77) unless every CMD is installed.
need_tools() {
  local t
  for t; do command -v "$t" >/dev/null || { echo "$t not installed"; exit 77; }; done
}

new_root() {
  export USRC_ROOT=$(mktemp -d /tmp/usrc-test.XXXXXX)
  chmod 755 "$USRC_ROOT"
}

# A free TCP port for the pingpong's out-of-band exchange, below the
# kernel's ephemeral range (32768 and up), where earlier clients' sockets
# may still hold ports.
pick_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 10000 + RANDOM % 15000 ))
    ss -Htan "sport = :$p" 2>/dev/null | grep -q . || { echo $p; return; }
  done
  echo $p
}

wait_listen() {   # wait_listen [netns] port
  local ns=$1 port=$2 i
  for i in $(seq 1 100); do
    if ${ns:+ip netns exec $ns} ss -ltn 2>/dev/null | grep -q ":$port "; then return 0; fi
    sleep 0.1
  done
  return 1
}

# wait_service PS PORT: an rdma_cm listener of this USRC_ROOT registered
# the port's service ID (PS: RDMA_PS_TCP 0x0106, RDMA_PS_UDP 0x0111).
wait_service() {
  local f i
  f=$(printf 's%016x' $(( ($1 << 16) + $2 )))
  for i in $(seq 100); do
    ls "$USRC_ROOT"/cm/*/"$f" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# run_pair NAME SERVER_NS CLIENT_NS SERVER_ADDR TIMEOUT -- PROGRAM [ARGS...]
# Runs PROGRAM as server and as client (client gets SERVER_ADDR appended),
# both through `usrc exec`; both must exit 0. Server output in $OUT.srv,
# client output in $OUT.cli.
run_pair() {
  local name=$1 sns=$2 cns=$3 addr=$4 tmo=$5; shift 6
  OUT=$(mktemp /tmp/usrc-out.XXXXXX)
  local port; port=$(pick_port)
  ${sns:+ip netns exec $sns} timeout "$tmo" "$USRC" exec -- "$@" -p "$port" >"$OUT.srv" 2>&1 &
  local spid=$!
  wait_listen "$sns" "$port" || { kill $spid 2>/dev/null; cat "$OUT.srv"; fail "$name: server did not listen"; }
  ${cns:+ip netns exec $cns} timeout "$tmo" "$USRC" exec -- "$@" -p "$port" "$addr" >"$OUT.cli" 2>&1
  local crc=$?
  wait $spid; local src=$?
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    echo "== server ($src):"; cat "$OUT.srv"; echo "== client ($crc):"; cat "$OUT.cli"
    fail "$name"
  fi
  note "$name: $(grep -h 'bytes in' "$OUT.cli" | head -1)"
}

# veth_pair NS_A NS_B DEV_A DEV_B NET: two network namespaces joined by a
# veth pair, NET.1 on DEV_A and NET.2 on DEV_B (/24), everything up, and
# both carriers on (a usrc port is DOWN until its netdev's carrier is).
# The caller deletes the namespaces.
veth_pair() {
  local a=$1 b=$2 da=$3 db=$4 net=$5 i
  ip netns add $a && ip netns add $b || fail "netns"
  ip link add $da netns $a type veth peer name $db netns $b || fail "veth"
  ip -n $a addr add $net.1/24 dev $da && ip -n $b addr add $net.2/24 dev $db || fail "veth addresses"
  ip -n $a link set lo up && ip -n $b link set lo up
  ip -n $a link set $da up && ip -n $b link set $db up
  for i in $(seq 50); do
    ip -n $a link show $da | grep -q "state UP" && ip -n $b link show $db | grep -q "state UP" && return 0
    sleep 0.1
  done
  fail "veth carrier did not come up"
}

# capture_start FILTER: tshark captures lo into $CAP (pid in $tpid) from
# when this returns. capture_end: stops it, the capture complete in $CAP.
tpid=
capture_start() {
  # The log of the previous capture goes first: its "Capturing on" line
  # would otherwise pass the wait below before this capture has started.
  rm -f "$CAP" "$CAP.log"
  timeout 60 tshark -q -i lo -f "$1" -w "$CAP" >"$CAP.log" 2>&1 &
  tpid=$!
  for _ in $(seq 100); do grep -qs "Capturing on" "$CAP.log" && break; sleep 0.1; done
  grep -qs "Capturing on" "$CAP.log" || fail "tshark did not start capturing"
  sleep 0.3
}
capture_end() {
  sleep 0.5
  kill -INT $tpid; wait $tpid; tpid=
}
