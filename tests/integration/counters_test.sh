#!/bin/bash
# Counters files that another user cannot break, and counts that survive a
# kill. An unprivileged user (created here) can neither write, truncate nor
# remove the counters file of a running process, which carries on; files it
# plants in the device's counters directory (short, garbage, a valid header
# of its own, links, a FIFO, a directory) are taken over by no process of
# another user, break neither the provider nor `usrc stats`, and `link del`
# removes them without following the links. The counts of processes killed
# with SIGKILL show in `usrc stats`, and the next processes take their
# files over (the directory does not grow). `usrc stats reset` is root's.
# Usage: counters_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, useradd)"; exit 77; }
need_tools ibv_rc_pingpong useradd userdel setpriv
new_root
U=usrcct$$
OUT=$(mktemp /tmp/usrc-ct.XXXXXX)
VICTIM=$(mktemp -d /tmp/usrc-ct-victim.XXXXXX)
spid= cpid=
cleanup() {
  for p in $spid $cpid; do kill -9 $p 2>/dev/null; done
  wait 2>/dev/null
  "$USRC" link del ct >/dev/null 2>&1
  pkill -9 -u "$U" 2>/dev/null; userdel "$U" 2>/dev/null
  rm -rf "$USRC_ROOT" "$VICTIM" "$OUT" "$OUT".*
}
trap cleanup EXIT
useradd --system --no-create-home --shell /usr/sbin/nologin "$U" || fail "useradd"
AS="setpriv --reuid=$U --regid=$U --clear-groups"   # runs a command as $U

"$USRC" link add ct netdev lo port 33000 || fail "link add"
D=$USRC_ROOT/counters
CD=$D/ct.d
[ "$(stat -c %a "$CD" 2>/dev/null)" = 1777 ] || fail "counters directory $CD: $(ls -la "$D")"
counter() { "$USRC" stats ct | grep -o " $1 [0-9]*" | awk '{print $2}'; }

# pp_start NAME ARGS...: a pingpong server waiting for its client ($spid).
# pp_client ARGS...: the client; both must succeed.
pp_start() {
  PORT=$(pick_port)
  timeout 60 "$@" -d ct -p $PORT >"$OUT.srv" 2>&1 &
  spid=$!
  wait_listen "" $PORT || { cat "$OUT.srv"; fail "server did not listen"; }
}
pp_finish() {
  timeout 60 "$@" -d ct -p $PORT 127.0.0.1 >"$OUT.cli" 2>&1; local crc=$?
  wait $spid; local src=$?
  spid=
  [ $crc = 0 ] && [ $src = 0 ] || { echo "== server ($src):"; cat "$OUT.srv"; echo "== client ($crc):"; cat "$OUT.cli"; return 1; }
}
PP="$USRC exec -- ibv_rc_pingpong -n 2000 -s 64"

note "another user against the counters files of a running process"
pp_start $PP
# (Whatever the layout: every file under counters/.)
files=$(find "$D" -type f)
[ -n "$files" ] || fail "no counters file while a context is open: $(ls -laR "$D")"
broke=
for f in $files; do
  $AS sh -c ': >"$1"' sh "$f" 2>/dev/null && broke="$broke wrote:$f"
  $AS truncate -s 0 "$f" 2>/dev/null && broke="$broke truncated:$f"
  $AS rm -f "$f" 2>/dev/null; [ -e "$f" ] || broke="$broke removed:$f"
done
pp_finish $PP || fail "the pingpong did not survive the attempts ($broke)"
[ -z "$broke" ] || fail "user $U could change a mapped counters file:$broke"
tx=$(counter tx_packets)
[ "${tx:-0}" -gt 2000 ] || fail "tx_packets $tx after 2000 round trips"
SIZE=$(stat -c %s $files | head -1)
note "mapped files survived; tx_packets $tx; a file is $SIZE bytes"

note "files another user plants"
$AS sh -c '
  cd "$1" || exit 1
  printf abc >short
  head -c "$2" /dev/urandom >garbage
  # A well-formed file of its own, zero counts, not locked by anyone.
  { head -c 16 "$3"; head -c $(($2 - 16)) /dev/zero; } >valid
  head -c $(($2 * 100)) /dev/zero >huge
  ln -s /etc/passwd passwd
  ln -s "$3" rootfile
  ln -s "$4" dirlink
  mkfifo fifo
  mkdir sub && printf x >sub/f
' sh "$CD" "$SIZE" "$(echo $files | cut -d" " -f1)" "$VICTIM" || fail "planting files"
touch "$VICTIM/keep"
cp "$CD/valid" "$OUT.valid"
pp_start $PP
pp_finish $PP || fail "pingpong with planted files"
cmp -s "$CD/valid" "$OUT.valid" || fail "a process of root took over $U's file"
tx2=$(counter tx_packets) || fail "usrc stats with planted files"
[ "$tx2" -gt "$tx" ] || fail "tx_packets $tx -> $tx2"
# The planted file turns short under a reader and under new processes.
$AS truncate -s 8 "$CD/valid" || fail "truncating its own file"
pp_start $PP
$AS truncate -s 0 "$CD/valid"
pp_finish $PP || fail "pingpong after the planted file was truncated"
"$USRC" stats ct >/dev/null || fail "usrc stats after the planted file was truncated"
"$USRC" stats --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["ifname"]=="ct" and d[0]["tx_packets"]>0, d' ||
  fail "stats --json"

note "a process of the other user"
pp_start $AS $PP
$AS timeout 60 $PP -d ct -p $PORT 127.0.0.1 >/dev/null 2>&1 || fail "$U's pingpong client"
wait $spid || fail "$U's pingpong server"
spid=
[ "$(find "$CD" -maxdepth 1 -type f -user "$U" -size "${SIZE}c" | wc -l)" -ge 2 ] ||
  fail "$U's processes have no counters files: $(ls -la "$CD")"

note "counts of killed processes"
# Mid-run: both ends killed while they run.
PORT=$(pick_port)
# (usrc exec becomes the program: these are the pingpongs' pids.)
"$USRC" exec -- ibv_rc_pingpong -d ct -p $PORT -n 100000000 >"$OUT.srv" 2>&1 &
spid=$!
wait_listen "" $PORT || fail "server did not listen"
"$USRC" exec -- ibv_rc_pingpong -d ct -p $PORT -n 100000000 127.0.0.1 >"$OUT.cli" 2>&1 &
cpid=$!
sleep 1
kill -9 $spid $cpid
{ wait $spid; } 2>/dev/null; src=$?
{ wait $cpid; } 2>/dev/null; crc=$?
spid= cpid=
[ $crc = 137 ] && [ $src = 137 ] || { cat "$OUT.srv" "$OUT.cli"; fail "expected both killed while running (137): $src $crc"; }
# A known amount: the client makes N round trips of S bytes and exits; the
# server, told to make more, has sent its N and waits, polling, until it
# is killed. Each end sent N*S bytes of payload at least. (The server's
# progress thread keeps out while it polls, as long as it does: nothing
# but the polling thread touches its engine.)
N=300 S=65536
before=$(counter tx_bytes)
PORT=$(pick_port)
USRC_APP_QUIET_US=60000000 "$USRC" exec -- ibv_rc_pingpong -d ct -p $PORT -s $S -n $((N * 1000)) >"$OUT.srv" 2>&1 &
spid=$!
wait_listen "" $PORT || fail "server did not listen"
timeout 60 "$USRC" exec -- ibv_rc_pingpong -d ct -p $PORT -s $S -n $N 127.0.0.1 >"$OUT.cli" 2>&1 ||
  { cat "$OUT.srv" "$OUT.cli"; fail "client of $N round trips"; }
sleep 0.2
kill -0 $spid 2>/dev/null || { cat "$OUT.srv"; fail "the server ended: it should wait for more"; }
kill -9 $spid
{ wait $spid; } 2>/dev/null
spid=
after=$(counter tx_bytes)
note "tx_bytes $before -> $after: $N round trips of $S bytes, the server killed"
[ $((after - before)) -ge $((2 * N * S)) ] ||
  fail "the killed server's counts are lost: tx_bytes grew by $((after - before)), less than $((2 * N * S))"
after=$(counter tx_packets)
roots=$(find "$CD" -maxdepth 1 -type f -user root | wc -l)
pp_start $PP
pp_finish $PP || fail "pingpong after the kills"
[ "$(find "$CD" -maxdepth 1 -type f -user root | wc -l)" = "$roots" ] ||
  fail "files of dead processes were not taken over: $roots root files before, now $(ls -la "$CD")"
[ "$roots" -le 2 ] || fail "$roots files of root for at most 2 processes at once: $(ls -la "$CD")"

note "reset"
$AS "$USRC" stats reset ct 2>/dev/null && fail "$U reset the counters"
"$USRC" stats reset ct || fail "stats reset"
[ "$(counter tx_packets)" = 0 ] || fail "tx_packets after reset: $(counter tx_packets)"
pp_start $PP
pp_finish $PP || fail "pingpong after reset"
tx=$(counter tx_packets)
[ "$tx" -gt 2000 ] && [ "$tx" -lt "$after" ] || fail "tx_packets after reset and a run: $tx"

"$USRC" link del ct || fail "link del"
[ -z "$(ls -A "$D")" ] || fail "link del left: $(ls -laR "$D")"
[ -e "$VICTIM/keep" ] && [ -e /etc/passwd ] || fail "link del followed a planted link"
echo PASS
