#!/bin/bash
# Forged packets from another local user. Root runs a data-checked stream
# (conn_peer: 40000 SENDs of 64 bytes, fixed start PSNs) between two
# processes on lo; meanwhile an unprivileged user, created here, sends from
# its own UDP port (0xC000 and up, as a RoCE v2 flow-label port would be)
# at 127.0.0.1 forged SENDs to the receiver's QPN and forged NAKs (Remote
# Access Error) to the sender's, over the PSNs of the stream, with the
# ICRC left out as a same-host sender may. Every forged packet must be
# dropped and counted (wrong_source_drops): the receiver gets exactly the
# 40000 messages in order and the sender a success for each. Once with the
# connection on the shared-memory ring (the default on lo; the forgeries
# come through the socket), once on the socket (USRC_SHM=0).
# Usage: forged_packets_test.sh USRC_CLI PROVIDER_SO CONN_PEER
USRC=$1 USRC_PROVIDER=$2 PROG=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, useradd)"; exit 77; }
need_tools useradd userdel setpriv
PY=/usr/bin/python3   # (not a shim in root's home, which the other user cannot read)
[ -x $PY ] || { echo "$PY not installed"; exit 77; }
new_root
OUT=$(mktemp -d /tmp/usrc-forge.XXXXXX)
chmod 755 "$OUT"
ATK=usrcatk$$
spid= apid=
trap 'kill $spid $apid 2>/dev/null; wait 2>/dev/null; userdel "$ATK" >/dev/null 2>&1; "$USRC" link del fg0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$OUT"' EXIT
useradd -M -r -s /usr/sbin/nologin "$ATK" || fail "useradd"
BASE=45000
"$USRC" link add fg0 netdev lo port $BASE || fail "link add"
N=40000 PSN=$((0x3c3c00))

cat >"$OUT/forge.py" <<'PY'
import random, socket, struct, sys, time
base, cli_qpn, srv_qpn, psn, n = (int(a, 0) for a in sys.argv[1:6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for port in range(0xC000 + random.randrange(0x3000), 0x10000):
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        pass
print("forging from port", s.getsockname()[1], flush=True)
cli = ("127.0.0.1", base + (cli_qpn >> 12))
srv = ("127.0.0.1", base + (srv_qpn >> 12))
def bth(opcode, qpn, p, ack=0):
    return struct.pack(">BBHII", opcode, 0, 0xFFFF, qpn & 0xFFFFFF, (ack << 31) | (p & 0xFFFFFF))
icrc = b"\0\0\0\0"
sent = 0
end = time.monotonic() + 60
while time.monotonic() < end:
    for _ in range(1000):
        p = psn + random.randrange(n + 64)
        try:
            # SEND ONLY (opcode 4), ACK requested, 64 bytes.
            s.sendto(bth(4, cli_qpn, p, 1) + b"\xee" * 64 + icrc, cli)
            # ACKNOWLEDGE (17) with AETH: NAK Remote Access Error (0x62).
            s.sendto(bth(17, srv_qpn, p) + struct.pack(">I", 0x62 << 24) + icrc, srv)
            sent += 2
        except OSError:
            pass
PY
chmod 644 "$OUT/forge.py"

run() {   # run LABEL [env...]
  local label=$1; shift
  local port; port=$(pick_port)
  local before; before=$("$USRC" stats fg0 | grep -o "wrong_source_drops [0-9]*" | awk '{print $2}')
  env "$@" timeout 120 "$USRC" exec -- "$PROG" server fg0 $port 1 $N $PSN >"$OUT/srv" 2>&1 &
  spid=$!
  wait_listen "" $port || { cat "$OUT/srv"; fail "$label: server did not listen"; }
  env "$@" timeout 120 "$USRC" exec -- "$PROG" client fg0 127.0.0.1 $port $N $PSN >"$OUT/cli" 2>&1 &
  local cpid=$!
  # The QPNs, as the processes print them (the attacker is told: it could
  # have swept them).
  local i
  for i in $(seq 100); do grep -q "remote QPN" "$OUT/cli" && break; sleep 0.05; done
  local cq sq
  cq=$(awk '/^local QPN/ {print $3}' "$OUT/cli")
  sq=$(awk '/^remote QPN/ {print $3}' "$OUT/cli")
  [ -n "$cq" ] && [ -n "$sq" ] || { cat "$OUT/cli"; fail "$label: no QPNs"; }
  setpriv --reuid="$ATK" --regid="$(id -g "$ATK")" --clear-groups \
    $PY "$OUT/forge.py" $BASE "$cq" "$sq" $PSN $N >"$OUT/atk" 2>&1 &
  apid=$!
  wait $cpid; local crc=$?
  wait $spid; local src=$?
  spid=
  kill $apid 2>/dev/null; wait $apid 2>/dev/null; apid=
  local after; after=$("$USRC" stats fg0 | grep -o "wrong_source_drops [0-9]*" | awk '{print $2}')
  echo "== $label: attacker"; cat "$OUT/atk"
  echo "== $label: server ($src)"; cat "$OUT/srv"
  echo "== $label: client ($crc)"; cat "$OUT/cli"
  echo "== $label: wrong_source_drops $before -> $after"
  grep -q "forging from port" "$OUT/atk" || fail "$label: the attacker did not run"
  [ $crc = 0 ] && grep -q "received $N messages, 0 wrong" "$OUT/cli" || fail "$label: forged messages delivered, or messages lost"
  [ $src = 0 ] || fail "$label: the sender's SENDs did not all complete successfully"
  [ "$after" -gt "$before" ] || fail "$label: no forged packet counted as dropped"
}
run "shared memory"
run "socket" USRC_SHM=0
echo PASS
