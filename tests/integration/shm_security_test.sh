#!/bin/bash
# The shared-memory path grants no more than the kernel would. A target
# that refuses ptrace (PR_SET_DUMPABLE 0, preloaded) waits for a peer; a
# process of the same user without CAP_SYS_PTRACE (so the kernel would not
# let it write the target's memory) tries to get or write the target's
# ring every way it knows (shm_attack.py: ring files under /dev/shm, the
# ring sockets' handshake, /proc/PID/fd) and must be refused each time.
# A legitimate peer (full root, which may ptrace it) then runs
# ib_write_bw against the same target over rings both ways: each of the
# two processes maps the other's ring.
# Usage: shm_security_test.sh USRC_CLI PROVIDER_SO NODUMP_SO SHM_ATTACK_PY
USRC=$1 USRC_PROVIDER=$2 NODUMP=$3 ATTACK=$4
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, a second process without CAP_SYS_PTRACE)"; exit 77; }
need_tools ib_write_bw setpriv python3 ss
new_root
OUT=$(mktemp /tmp/usrc-shmsec.XXXXXX)
BASE=48500
trap 'kill $tpid $cpid 2>/dev/null; "$USRC" link del ss0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$OUT" "$OUT".*' EXIT
tpid= cpid=
"$USRC" link add ss0 netdev lo port $BASE || fail "link add"

port=$(pick_port)
LD_PRELOAD=$NODUMP timeout 60 "$USRC" exec -- ib_write_bw -d ss0 -D 4 -F -p $port >"$OUT.srv" 2>&1 &
tpid=$!
wait_listen "" $port || { cat "$OUT.srv"; fail "target did not listen"; }
target=$(pgrep -P $tpid)
[ -n "$target" ] || fail "no target process under timeout"
rings_of() { grep -c 'memfd:usrc-ring' /proc/$1/maps; }
# What a ring is reached by: a socket the target listens on, or a file it maps.
socks=$(ss -xlpH | grep "pid=$target," | awk '{print $5}' | sed -n 's/^@\(usrc\..*\)/\1/p')
files=$(grep -o '/dev/shm/usrc[^ ]*' /proc/$target/maps | sort -u)
[ -n "$socks$files" ] || fail "the target has no ring to attack"
note "target $target: ring sockets: ${socks:-none}; ring files: ${files:-none}"

setpriv --bounding-set=-all --inh-caps=-all -- python3 "$ATTACK" $target --files $files --sockets $socks \
  >"$OUT.att" 2>&1
arc=$?
sed 's/^/    /' "$OUT.att"
[ $arc = 0 ] || fail "a process that may not ptrace the target got or wrote its ring"
note "a same-user process without ptrace rights was refused the ring"

# A legitimate peer: rings both ways, and the run completes.
timeout 60 "$USRC" exec -- ib_write_bw -d ss0 -D 4 -F -p $port 127.0.0.1 >"$OUT.cli" 2>&1 &
cpid=$!
client=
for _ in $(seq 100); do
  client=$(pgrep -P $cpid)
  [ -n "$client" ] && [ "$(rings_of $client 2>/dev/null)" -ge 2 ] 2>/dev/null && break
  sleep 0.1
done
sleep 1
crings=$(rings_of $client 2>/dev/null) trings=$(rings_of $target 2>/dev/null)
wait $cpid; crc=$?; cpid=
wait $tpid; trc=$?; tpid=
[ $crc = 0 ] && [ $trc = 0 ] || { cat "$OUT.srv" "$OUT.cli"; fail "ib_write_bw between the target and a legitimate peer"; }
note "legitimate peer: $(awk '$1 ~ /^[0-9]+$/ {print $4 " MB/s"}' "$OUT.cli"); rings mapped: client $crings, target $trings"
[ "${crings:-0}" -ge 2 ] || fail "the legitimate peer does not map the target's ring (its own and the target's: $crings)"
[ "${trings:-0}" -ge 2 ] || fail "the target does not map the legitimate peer's ring ($trings)"
echo "PASS"
