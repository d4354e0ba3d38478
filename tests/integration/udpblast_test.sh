#!/bin/bash
# udpblast on loopback for 1 s, with and without GSO/GRO: the receiver must
# have seen data; then its busy-polled ping-pong must report round trips,
# and -L a cache line's round trip between two CPUs (NaN on one CPU only).
# Usage: udpblast_test.sh UDPBLAST
set -u
B=$1
for g in "" -g; do
  port=$(( 10000 + RANDOM % 15000 ))
  out=$(mktemp)
  timeout 20 "$B" -s -p $port $g -t 1 >"$out" &
  spid=$!
  for i in $(seq 50); do grep -q listening "$out" && break; sleep 0.1; done
  timeout 20 "$B" -c 127.0.0.1 -p $port -m 4096 $g -t 1 || { echo "FAIL: sender $g"; exit 1; }
  wait $spid || { cat "$out"; echo "FAIL: receiver $g saw nothing"; exit 1; }
  cat "$out"
  bytes=$(grep -o 'rx bytes=[0-9]*' "$out" | cut -d= -f2)
  rm -f "$out"
  [ "${bytes:-0}" -gt 1000000 ] || { echo "FAIL: only ${bytes:-0} bytes received $g"; exit 1; }
done
port=$(( 10000 + RANDOM % 15000 ))
timeout 20 "$B" -s -P -p $port -t 1 >/dev/null &
spid=$!
sleep 0.2
out=$(timeout 20 "$B" -c 127.0.0.1 -P -p $port -m 64 -t 1) || { echo "FAIL: ping-pong client"; exit 1; }
wait $spid || { echo "FAIL: ping-pong server"; exit 1; }
echo "$out"
# Round trips measured, and a median that is a real figure (how many and how
# fast depends on the machine's load: no bound on either).
echo "$out" | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
                   END { exit !(v["size"] == 64 && v["n"] >= 1 && v["median_us"] > 0 && v["min_us"] <= v["median_us"]) }' ||
  { echo "FAIL: ping-pong report"; exit 1; }
out=$(timeout 20 "$B" -L -t 0.2) || { echo "FAIL: -L"; exit 1; }
echo "$out"
if [ "$(nproc)" -ge 2 ]; then
  echo "$out" | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
                     END { exit !(v["round_trip_ns"] > 1 && v["round_trip_ns"] < 100000) }' ||
    { echo "FAIL: -L report"; exit 1; }
fi
out=$(timeout 20 taskset -c 0 "$B" -L -t 0.2) || { echo "FAIL: -L on one CPU"; exit 1; }
echo "$out" | grep -q "round_trip_ns=NaN" || { echo "FAIL: -L on one CPU: $out"; exit 1; }
echo PASS
