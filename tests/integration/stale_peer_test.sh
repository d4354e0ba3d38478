#!/bin/bash
# Stale packets and a restarted peer. A client in a fresh pid namespace
# takes 7 of the server's 64 SENDs and is killed; the server's QP of that
# connection keeps resending the rest. A new client, also in a fresh pid
# namespace (so with the same pid as the first), connects to the same
# server with the same fixed start PSNs, which the application chose and
# the provider cannot change: it must receive exactly the 64 messages of
# its own connection, in order, and each of the server's SENDs to it must
# have reached it (the server exits 0 only if all 64 completed
# successfully). The server waits half a second before its new stream,
# while its old QP resends. Both ends run on lo, through the shared-memory ring (the
# default) and again through the socket (USRC_SHM=0).
# Usage: stale_peer_test.sh USRC_CLI PROVIDER_SO CONN_PEER
USRC=$1 USRC_PROVIDER=$2 PROG=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, unshare -p)"; exit 77; }
unshare -p -f --mount-proc true 2>/dev/null || { echo "unshare -p not available"; exit 77; }
new_root
OUT=$(mktemp -d /tmp/usrc-stale.XXXXXX)
spid=
trap 'kill $spid 2>/dev/null; "$USRC" link del st0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$OUT"' EXIT
"$USRC" link add st0 netdev lo port 43000 || fail "link add"
N=64 PSN=$((0x5a5a5a))

run() {   # run LABEL [env...]
  local label=$1; shift
  local port; port=$(pick_port)
  env "$@" timeout 60 "$USRC" exec -- "$PROG" server st0 $port 2 $N $PSN 500 >"$OUT/srv" 2>&1 &
  spid=$!
  wait_listen "" $port || { cat "$OUT/srv"; fail "$label: server did not listen"; }
  env "$@" timeout 30 unshare -p -f --mount-proc "$USRC" exec -- "$PROG" client st0 127.0.0.1 $port $N $PSN 7 \
    >"$OUT/cli1" 2>&1
  grep -q "received 7, dying" "$OUT/cli1" || { cat "$OUT/cli1"; fail "$label: first client"; }
  env "$@" timeout 60 unshare -p -f --mount-proc "$USRC" exec -- "$PROG" client st0 127.0.0.1 $port $N $PSN \
    >"$OUT/cli2" 2>&1
  local crc=$?
  wait $spid; local src=$?
  spid=
  echo "== $label: server ($src)"; cat "$OUT/srv"
  echo "== $label: first client"; cat "$OUT/cli1"
  echo "== $label: second client ($crc)"; cat "$OUT/cli2"
  [ $crc = 0 ] || fail "$label: the new connection received what it should not, or not all of it"
  [ $src = 0 ] || fail "$label: the server's SENDs to the new connection did not all complete"
  grep -q "received $N messages, 0 wrong" "$OUT/cli2" || fail "$label: second client"
}
run "shared memory"
run "socket" USRC_SHM=0
"$USRC" stats st0 | grep -E "unknown_qp|wrong_source|ghost|held"
echo PASS
