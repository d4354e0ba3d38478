#!/bin/bash
# Runs the stock perftest RC tests over usrc on loopback and prints a table:
# each test with its default options, -a (all sizes), -q 4, -b
# (bidirectional) and -e (events) where the test has them, and with each
# post-send path: --use_old_post_send, and "wr:" runs on perftest's ibv_wr_*
# path. perftest takes that path only for device ids in its own table, so
# "wr:" runs report a ConnectX-5 part id (USRC_VENDOR_PART_ID=4119); that
# changes what perftest does, nothing in usrc.
#
#   perftest-configs/matrix.sh [DEVICE] [subset]
#
# DEVICE is an existing usrc device (default usrc0); "subset" runs the few
# that the test suite runs. Needs `usrc` on PATH or $USRC, perftest
# installed. Exit status: the number of failed runs.
set -u
DEV=${1:-usrc0}
SUBSET=${2:-}
USRC=${USRC:-usrc}
TMO=${TMO:-300}
LOG=$(mktemp -d /tmp/usrc-perftest.XXXXXX)
trap 'rm -rf "$LOG"' EXIT

bw="ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw"
lat="ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat"
runs=()
for t in $bw $lat; do
  for opt in "" "-a" "-q 4" "-b" "-e"; do
    case "$t/$opt" in
      *_lat/-q\ 4|*_lat/-b) continue ;;        # latency tests have neither
      ib_write_bw/-e|ib_write_lat/-e|ib_read_lat/-e|ib_atomic_lat/-e) continue ;;   # perftest: "Events feature not available on WRITE verb"
      ib_atomic_bw/-a|ib_atomic_lat/-a) continue ;;  # atomics are 8 bytes only
    esac
    runs+=("$t $opt")
    [[ $t == ib_atomic_* ]] && runs+=("$t -A CMP_AND_SWAP $opt")
  done
  runs+=("$t --use_old_post_send" "wr: $t")
  if [[ $t == ib_atomic_* ]]; then runs+=("wr: $t -A CMP_AND_SWAP"); else runs+=("wr: $t -a"); fi
done
# Receives from a shared receive queue.
runs+=("ib_send_bw --use-srq" "ib_send_bw --use-srq -q 4" "ib_send_bw --use-srq -a" "ib_send_lat --use-srq")
# UD QPs (datagrams of one MTU at most).
runs+=("ib_send_bw -c UD" "ib_send_bw -c UD -q 4" "ib_send_bw -c UD --use-srq" "ib_send_lat -c UD" "ib_send_lat -c UD -e")
# UC QPs (SENDs and WRITEs, unacknowledged).
runs+=("ib_send_bw -c UC" "ib_write_bw -c UC" "ib_send_lat -c UC" "ib_write_lat -c UC")
if [ -n "$SUBSET" ]; then
  runs=("ib_send_bw" "ib_send_bw -e" "ib_write_bw -q 4" "ib_read_bw -b" "ib_write_lat" "ib_send_lat -e"
        "ib_atomic_bw" "ib_atomic_lat -A CMP_AND_SWAP" "ib_read_lat" "ib_send_bw -a -n 100"
        "ib_write_bw --use_old_post_send" "wr: ib_write_bw -q 4" "wr: ib_read_bw"
        "wr: ib_atomic_bw -A CMP_AND_SWAP" "wr: ib_send_lat" "ib_send_bw --use-srq -q 4" "ib_send_lat --use-srq")
fi

port=$((20000 + RANDOM % 10000))
fails=0
printf '%-40s %-6s %s\n' "test" "result" "last line (size, BW MB/s or typical latency us)"
for r in "${runs[@]}"; do
  port=$((port + 1))
  set -- $r
  env=()
  if [ "$1" = "wr:" ]; then shift; env=(USRC_VENDOR_PART_ID=4119); fi
  timeout "$TMO" env "${env[@]}" "$USRC" exec -- "$@" -d "$DEV" -p $port >"$LOG/srv" 2>&1 &
  spid=$!
  for i in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
  timeout "$TMO" env "${env[@]}" "$USRC" exec -- "$@" -d "$DEV" -p $port 127.0.0.1 >"$LOG/cli" 2>&1
  crc=$?
  # A "wr:" run must really have used the ibv_wr_* path.
  if [ ${#env[@]} != 0 ] && ! grep -q 'ibv_wr\* API *: ON' "$LOG/cli"; then crc=99; fi
  wait $spid; src=$?
  res=PASS
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then res=FAIL; fails=$((fails + 1)); fi
  line=$(grep -E '^ *[0-9]+ +[0-9]+ ' "$LOG/cli" | tail -1 | awk '{ if (NF >= 9) print $1" B  typical "$5" us"; else print $1" B  "$4" MB/s  "$5" Mpps" }')
  printf '%-40s %-6s %s\n' "$r" "$res" "$line"
  if [ $res = FAIL ]; then
    echo "---- server"; tail -5 "$LOG/srv"; echo "---- client"; tail -5 "$LOG/cli"
  fi
done
exit $fails
