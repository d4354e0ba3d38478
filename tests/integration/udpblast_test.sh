#!/bin/bash
# udpblast on loopback for 1 s, with and without GSO/GRO: the receiver must
# have seen data. Usage: udpblast_test.sh UDPBLAST
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
echo PASS
