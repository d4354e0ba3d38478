#!/bin/bash
# ofiblast on loopback through libfabric's udp provider, 1 s each: the
# receiver must have seen datagrams of the size sent (64 B, and the largest
# the provider takes, a too-large -m being clamped to it), and the
# busy-polled ping-pong must report a median. Skipped (77) without the udp
# provider's FI_EP_DGRAM endpoints.
# Usage: ofiblast_test.sh OFIBLAST
set -u
B=$1
WORK=$(mktemp -d /tmp/ofiblast-test.XXXXXX)
spid=
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

info=$(timeout 20 "$B" -i -f udp 2>&1)
rc=$?
[ $rc = 3 ] && { echo "$info"; echo "libfabric's udp provider is not available: skipped"; exit 77; }
[ $rc = 0 ] || { echo "$info"; echo "FAIL: -i"; exit 1; }
echo "$info"
max=$(echo "$info" | grep -o 'max_msg_size=[0-9]*' | cut -d= -f2)
[ "${max:-0}" -gt 64 ] || { echo "FAIL: max_msg_size ${max:-?}"; exit 1; }
[ "$max" -gt 65536 ] && max=65536   # ofiblast's own limit

# server ARGS...: starts a server on a free port (set in $port), output in
# $WORK/srv; a port taken meanwhile makes it exit at once: another one.
server() {
  for _ in 1 2 3 4 5; do
    port=$(( 10000 + RANDOM % 15000 ))
    timeout 30 "$B" -s -f udp -p $port "$@" >"$WORK/srv" 2>&1 &
    spid=$!
    for _ in $(seq 100); do
      grep -q listening "$WORK/srv" && return 0
      kill -0 $spid 2>/dev/null || break
      sleep 0.1
    done
    wait $spid 2>/dev/null
    spid=
  done
  cat "$WORK/srv"
  echo "FAIL: the server does not start"
  exit 1
}
field() { grep -o "$1=[0-9.]*" | head -1 | cut -d= -f2; }

for m in 64 1000000; do
  server -t 1
  timeout 30 "$B" -c 127.0.0.1 -f udp -p $port -m $m -t 1 >"$WORK/cli" 2>&1 ||
    { cat "$WORK/cli" "$WORK/srv"; echo "FAIL: sender -m $m"; exit 1; }
  wait $spid || { cat "$WORK/cli" "$WORK/srv"; echo "FAIL: receiver -m $m saw nothing"; exit 1; }
  spid=
  cat "$WORK/cli" "$WORK/srv"
  size=$m
  if [ $m -gt "$max" ]; then
    size=$max
    grep -q "is over provider udp's max_msg_size" "$WORK/cli" || { echo "FAIL: -m $m not clamped with a message"; exit 1; }
  fi
  grep -q "size=$size " "$WORK/cli" || { echo "FAIL: sender's size is not $size"; exit 1; }
  msgs=$(field msgs <"$WORK/srv") bytes=$(field bytes <"$WORK/srv")
  [ "${msgs:-0}" -gt 0 ] || { echo "FAIL: no message received (-m $m)"; exit 1; }
  [ "$bytes" = $(( msgs * size )) ] ||
    { echo "FAIL: $bytes bytes in $msgs messages, not $size bytes each"; exit 1; }
  grep -q "^ofiblast rx bytes=[0-9]* msgs=[0-9]* secs=[0-9.]* gbps=[0-9.]* mpps=[0-9.]*$" "$WORK/srv" ||
    { echo "FAIL: receiver's line"; exit 1; }
done

server -P -t 1
out=$(timeout 30 "$B" -c 127.0.0.1 -f udp -P -p $port -m 64 -t 1) || { echo "FAIL: ping-pong client"; exit 1; }
wait $spid || { cat "$WORK/srv"; echo "FAIL: ping-pong server"; exit 1; }
spid=
echo "$out"
echo "$out" | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
                   END { exit !($1 == "ofiblast" && $2 == "pingpong" && v["size"] == 64 && v["n"] >= 1 &&
                                v["median_us"] > 0 && v["min_us"] > 0 && v["min_us"] <= v["median_us"]) }' ||
  { echo "FAIL: ping-pong report"; exit 1; }

# Bad input: a clean error, no crash.
"$B" -c 127.0.0.1 -m 0 2>/dev/null; [ $? = 1 ] || { echo "FAIL: -m 0 accepted"; exit 1; }
"$B" -s -p 70000 2>/dev/null; [ $? = 1 ] || { echo "FAIL: -p 70000 accepted"; exit 1; }
"$B" -i -f no-such-provider 2>/dev/null; [ $? = 3 ] || { echo "FAIL: unknown provider not reported"; exit 1; }
echo PASS
