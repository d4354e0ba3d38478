#!/bin/bash
# usrc side by side with its references on loopback: stock perftest through
# `usrc exec`, the kernel's UDP floor (for latency the lower of sockperf
# ping-pong and udpblast's busy-polled ping-pong; for bandwidth udpblast
# with sendmmsg/recvmmsg and GSO/GRO), libfabric's
# reliability layer over UDP (ofi_rxd) and its tcp provider, CPU per GB,
# idle CPU of a connected QP pair, per-QP memory and write bandwidth under
# 1% loss. Prints a table of ratios against the targets and writes PNG plots.
#
#   perftest-configs/bench.sh [--quick] [--out DIR]
#   perftest-configs/bench.sh --net [--quick] [--runs N] ...   (bench-net.sh:
#       across two network namespaces joined by a veth pair, every backend)
#
# Needs a built tree (build/) or an installed usrc (usrc, udpblast, qpidle on
# PATH), root (device creation, loss namespace) and the tools of
# tools/deps.sh. Exit status: the number of MISSed targets.
set -u
case " $* " in *" --net "*) exec "$(dirname "$0")/bench-net.sh" "$@" ;; esac
QUICK= OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--quick] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
. "$(dirname "$0")/bench-lib.sh"
USRC=${USRC:-$(tool usrc)} UDPBLAST=$(tool udpblast) QPIDLE=$(tool qpidle)
[ -n "$USRC" ] && [ -n "$UDPBLAST" ] && [ -n "$QPIDLE" ] ||
  { echo "bench: need usrc, udpblast and qpidle: build the tree (cmake --build build) or install usrc" >&2; exit 2; }
need_debs ib_send_bw:perftest sockperf:sockperf fi_pingpong:libfabric-bin gnuplot:gnuplot-nox \
          /usr/bin/time:time nft:nftables ip:iproute2 ss:iproute2

OUT=${OUT:-/tmp/usrc-bench.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG=$OUT/logs; mkdir -p "$LOG"
export USRC_ROOT=$(mktemp -d /tmp/usrc-bench-root.XXXXXX)
chmod 755 "$USRC_ROOT"
NS=usrcbench$$ DEV=bench0
cleanup() { "$USRC" link del $DEV >/dev/null 2>&1; ip netns del $NS 2>/dev/null; rm -rf "$USRC_ROOT"; }
trap cleanup EXIT
"$USRC" link add $DEV netdev lo >/dev/null || { echo "bench: usrc link add failed" >&2; exit 2; }

if [ -n "$QUICK" ]; then
  LAT_SIZES="2 4096 65536" BW_SIZES="64 65536 1048576" SECS=1 IDLE=3
else
  LAT_SIZES="2 8 32 128 512 2048 4096 8192 32768 65536"
  BW_SIZES="2 64 512 4096 16384 65536 262144 1048576 8388608" SECS=3 IDLE=10
fi
echo "bench: output in $OUT; load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

port=$((10000 + RANDOM % 15000))
cpu() { awk '{ printf "%.3f", $1 + $2 }' "$1" 2>/dev/null; }   # user+sys from /usr/bin/time
# The time one cache line takes from one core to another and back (udpblast
# -L): usrc's shared-memory ring moves lines between the cores, so its small
# message rate follows this figure, which drifts with the machine; measured
# just before usrc's 64 B runs and before the blast's, and printed with them.
line_rt() { "$UDPBLAST" -L -t 0.5 2>/dev/null | sed -n 's/.*round_trip_ns=\([0-9.NaN]*\).*/\1/p' | grep . || echo NaN; }
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "NaN" || b + 0 > a + 0) ? b : a }'; }
# pair NAME CMD... : server and client of a TCP-rendezvous program; logs in
# $LOG/NAME.{srv,cli}, CPU seconds in $LOG/NAME.{srv,cli}.cpu. $PEER is the
# client's server-address argument(s), $SRVARGS the server's extra ones.
pair() {
  local name=$1; shift
  timeout 300 /usr/bin/time -f "%U %S" -o "$LOG/$name.srv.cpu" "$@" ${SRVARGS:-} >"$LOG/$name.srv" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do ${NSX:-} ss -ltn | grep -q ":$PORTNOW " && break; sleep 0.1; done
  timeout 300 /usr/bin/time -f "%U %S" -o "$LOG/$name.cli.cpu" "$@" $PEER >"$LOG/$name.cli" 2>&1
  local rc=$?
  wait $spid || rc=1
  return $rc
}
iters() {   # iters SIZE BYTES_BUDGET MIN MAX
  local n=$(( $2 / $1 )); [ $n -lt $3 ] && n=$3; [ $n -gt $4 ] && n=$4; echo $n
}
# perftest TEST SIZE ITERS [extra]: prints "MB/s Mpps" (bw) or "typical_us" (lat).
# The caller bumps $port (this runs in a subshell).
perftest() {
  local t=$1 s=$2 n=$3; shift 3
  local env=
  [ -n "${XENV:-}" ] && env="env $XENV"
  PORTNOW=$port PEER=127.0.0.1 pair "$t-$s${TAG:-}" ${NSX:-} $env "$USRC" exec -- $t -d $DEV -s $s -n $n -p $port -F "$@" ||
    { echo "bench: $t -s $s failed (see $LOG/$t-$s${TAG:-}.*)" >&2; echo "NaN NaN"; return; }
  grep -E '^ *[0-9]+ +[0-9]+ ' "$LOG/$t-$s${TAG:-}.cli" | tail -1 |
    awk '{ if (NF >= 9) print $5; else print $4, $5 }'
}

# ---- usrc: perftest
declare -A R   # R[key] = value
# Byte budgets: latency runs move B/4; bandwidth runs move BW_B (at most
# BW_MAX messages), enough for about a second at the rates seen on 2 cores.
B=256000000 BW_B=2000000000 BW_MAX=2000000
[ -n "$QUICK" ] && B=64000000 BW_B=500000000 BW_MAX=500000
for t in ib_send_lat ib_write_lat ib_read_lat; do
  for s in $LAT_SIZES; do
    port=$((port + 1)); set -- $(perftest $t $s $(iters $s $((B / 4)) 200 20000)); R[$t/$s]=$1
  done
done
# The sizes with targets (64 B and 64 KB) are the best of three runs, as
# their references are (below); every run is in $LOG/bw-runs.
for t in ib_send_bw ib_write_bw ib_read_bw; do
  for s in $BW_SIZES; do
    reps=1; case $s in 64|65536) [ -z "$QUICK" ] && reps=3 ;; esac
    [ "$t/$s" = ib_send_bw/64 ] && R[line/usrc]=$(line_rt)
    R[$t/$s]=NaN R[$t/$s/mpps]=NaN runs=
    for r in $(seq $reps); do
      tag=; [ $r -gt 1 ] && tag=-r$r
      port=$((port + 1)); set -- $(TAG=$tag perftest $t $s $(iters $s $BW_B 20 $BW_MAX)); runs="$runs $1/$2"
      if [ "$(best "${R[$t/$s]}" "${1:-NaN}")" != "${R[$t/$s]}" ]; then
        R[$t/$s]=$1 R[$t/$s/mpps]=$2 R[$t/$s/tag]=$tag
      fi
    done
    echo "bench: $t $s B, MB/s/Mpps:$runs" >>"$LOG/bw-runs"
  done
done
port=$((port + 1)); set -- $(perftest ib_atomic_bw 8 20000); R[ib_atomic_bw/mpps]=$2
# The socket path (USRC_SHM=0: what peers on other hosts get), at two
# points, for reference.
port=$((port + 1)); set -- $(TAG=-sock XENV=USRC_SHM=0 perftest ib_send_lat 2 20000); R[sock/lat/2]=$1
port=$((port + 1)); set -- $(TAG=-sock XENV=USRC_SHM=0 perftest ib_write_bw 65536 $(iters 65536 $BW_B 20 $BW_MAX)); R[sock/write_bw]=$1
n=$(iters 65536 $BW_B 20 $BW_MAX)
tag=${R[ib_send_bw/65536/tag]:-}
R[cpu/usrc/srv]=$(cpu "$LOG/ib_send_bw-65536$tag.srv.cpu") R[cpu/usrc/cli]=$(cpu "$LOG/ib_send_bw-65536$tag.cli.cpu")
R[gb/usrc]=$(awk -v n=$n 'BEGIN { print n * 65536 / 1e9 }')

# ---- floor: sockperf ping-pong (half round trip, median), udpblast's
# busy-polled ping-pong, and udpblast's blast
lowest() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "NaN" || a == "" || (b != "NaN" && b + 0 < a + 0)) ? b : a }'; }
for s in $LAT_SIZES; do
  m=$s; [ $m -lt 14 ] && m=14; [ $m -gt 65507 ] && m=65507   # sockperf's limits
  port=$((port + 1))
  sockperf server -i 127.0.0.1 -p $port >"$LOG/sockperf-$s.srv" 2>&1 &
  spid=$!; sleep 0.3
  R[sockperf/$s]=$(sockperf ping-pong -i 127.0.0.1 -p $port -m $m -t $SECS 2>&1 | tee "$LOG/sockperf-$s.cli" |
                   awk '/percentile 50.000/ { print $NF }')
  kill $spid; wait $spid 2>/dev/null
  # The same with both ends polling their socket (udpblast -P), as perftest
  # polls its CQs: no wake-up in the round trip. The lower of the two is
  # the floor the latency targets are read against.
  port=$((port + 1))
  "$UDPBLAST" -s -P -p $port -t $SECS >"$LOG/udppp-$s.srv" 2>&1 &
  spid=$!; sleep 0.3
  R[udppp/$s]=$("$UDPBLAST" -c 127.0.0.1 -P -p $port -m $s -t $SECS 2>&1 | tee "$LOG/udppp-$s.cli" |
                sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')
  wait $spid
  R[udppp/$s]=${R[udppp/$s]:-NaN}
  R[floor/$s]=$(lowest "${R[sockperf/$s]:-NaN}" "${R[udppp/$s]}")
done
blast() {   # blast SIZE [-g [RUN]]: prints "Gbit/s Mpps bytes" as the receiver saw them
  port=$((port + 1))
  local tag=udpblast-$1${2:-}${3:+-$3}
  /usr/bin/time -f "%U %S" -o "$LOG/$tag.srv.cpu" "$UDPBLAST" -s -p $port ${2:-} -t $SECS >"$LOG/$tag.srv" 2>&1 &
  local spid=$!
  sleep 0.3
  /usr/bin/time -f "%U %S" -o "$LOG/$tag.cli.cpu" "$UDPBLAST" -c 127.0.0.1 -p $port -m $1 ${2:-} -t $SECS >"$LOG/$tag.cli" 2>&1
  wait $spid
  sed -n 's/.*bytes=\([0-9]*\).*gbps=\([0-9.]*\) mpps=\([0-9.]*\)/\2 \3 \1/p' "$LOG/$tag.srv"
}
# The references of the targets (GSO/GRO at 64 B and 64 KB) are the best of
# three runs: the blast varies from run to run as much as usrc does (42 to
# 64 Gbit/s at 64 KB on 2 cores), and a low one would flatter usrc. Every
# run is in $LOG/blast-runs.
for s in $BW_SIZES; do
  [ $s = 64 ] && R[line/blast]=$(line_rt)
  set -- $(blast $s) ; R[udp/$s]=${1:-NaN} R[udp/$s/mpps]=${2:-NaN}
  reps=1; case $s in 64|65536) [ -z "$QUICK" ] && reps=3 ;; esac
  R[gso/$s]=NaN R[gso/$s/mpps]=NaN R[gso/$s/bytes]=0 runs=
  for r in $(seq $reps); do
    set -- $(blast $s -g $r); runs="$runs ${1:-NaN}/${2:-NaN}"
    if [ "$(best "${R[gso/$s]}" "${1:-NaN}")" != "${R[gso/$s]}" ]; then
      R[gso/$s]=$1 R[gso/$s/mpps]=${2:-NaN} R[gso/$s/bytes]=${3:-0} R[gso/$s/run]=$r
    fi
  done
  echo "bench: udpblast -g $s B, Gbit/s/Mpps:$runs" >>"$LOG/blast-runs"
done
r=${R[gso/65536/run]:-1}
R[cpu/gso/srv]=$(cpu "$LOG/udpblast-65536-g-$r.srv.cpu") R[cpu/gso/cli]=$(cpu "$LOG/udpblast-65536-g-$r.cli.cpu")
R[gb/gso]=$(awk -v b=${R[gso/65536/bytes]} 'BEGIN { print b / 1e9 }')

# ---- peer: libfabric fi_pingpong, ofi_rxd over UDP and tcp (MB/s counts both ways)
OFI_SIZES="2 4096 65536"
for p in "udp;ofi_rxd" tcp; do
  k=${p#*;}
  for s in $OFI_SIZES; do
    n=1000; [ $s -gt 4096 ] && n=100; [ -n "$QUICK" ] && n=$((n / 4))
    port=$((port + 1))
    if PORTNOW=$port PEER="-P $port 127.0.0.1" SRVARGS="-B $port" pair "ofi-$k-$s" \
         fi_pingpong -p "$p" -e rdm -S $s -I $n; then
      set -- $(awk '$1 ~ /^[0-9]/ { print $6, $7 }' "$LOG/ofi-$k-$s.cli")
      R[$k/$s]=${2:-NaN} R[$k/$s/MBs]=${1:-NaN}
    else
      R[$k/$s]=NaN R[$k/$s/MBs]=NaN; echo "bench: fi_pingpong -p $p -S $s failed (see $LOG)" >&2
    fi
  done
done

# ---- idle CPU of a connected, silent QP pair; RSS per QP at depth 128
"$USRC" exec -- "$QPIDLE" -d $DEV -n 2 -q 128 -t $IDLE >"$LOG/qpidle-2" 2>&1
"$USRC" exec -- "$QPIDLE" -d $DEV -n 1 -q 128 -t 0 >"$LOG/qpidle-1" 2>&1
"$USRC" exec -- "$QPIDLE" -d $DEV -n 1024 -q 128 -t 0 >"$LOG/qpidle-1024" 2>&1
field() { sed -n "s/.* $2=\([0-9.-]*\).*/\1/p" "$1" | head -1; }
R[idle]=$(field "$LOG/qpidle-2" cpu_pct) R[mem/1]=$(field "$LOG/qpidle-1" bytes_per_qp)
R[mem/1024]=$(field "$LOG/qpidle-1024" bytes_per_qp) R[mem/1024/kb]=$(field "$LOG/qpidle-1024" rss_kb)

# ---- ib_write_bw 64 KB under 1% random loss: a namespace of its own, its
# loopback, nftables dropping 1% of usrc's UDP packets on input. Through
# the socket (USRC_SHM=0): between two contexts on one host the packets
# would otherwise take the shared-memory ring, where nftables drops none. nftables
# sees a UDP GSO send as one packet: the runs with GSO off lose 1% of the
# datagrams independently (the target's row); with GSO on, 1% of the sends.
ip netns add $NS && ip -n $NS link set lo up && ip netns exec $NS "$USRC" link add lossdev netdev lo >/dev/null
NSX="ip netns exec $NS"
lossrun() {   # lossrun KEY TAG [env]: R[KEY] = the median MB/s of three runs (the
  # loss runs vary more than the others from run to run)
  local key=$1 tag=$2 env=${3:-} i v=
  for i in 1 2 3; do
    port=$((port + 1))
    v="$v $(TAG=$tag-$i XENV="USRC_SHM=0 $env" NSX=$NSX DEV=lossdev perftest ib_write_bw 65536 $(iters 65536 $BW_B 20 $BW_MAX) | cut -d' ' -f1)"
  done
  R[$key]=$(echo $v | tr ' ' '\n' | sort -g | sed -n 2p)
  echo "bench: $tag: ib_write_bw 64 KB MB/s:$v" >>"$LOG/loss-runs"
  # The device's counters so far (resends, NAKs, probes, packets kept).
  { echo "after $tag:"; $NSX "$USRC" stats lossdev; } >>"$LOG/loss-runs"
}
drops() { ip netns exec $NS nft list ruleset 2>/dev/null | grep -o 'packets [0-9]*' | awk '{ s += $2 } END { print s + 0 }'; }
lossrun loss/0 -nogso-0 USRC_GSO=1; lossrun loss/gso/0 -gso-0
ip netns exec $NS nft -f - <<NFT
table inet usrcbench {
  chain in {
    type filter hook input priority 0;
    udp dport 20000-24095 numgen random mod 100 < 1 counter drop
  }
}
NFT
lossrun loss/1 -nogso-1 USRC_GSO=1; R[loss/drops]=$(drops)
lossrun loss/gso/1 -gso-1; R[loss/gso/drops]=$(( $(drops) - ${R[loss/drops]} ))
unset NSX

# ---- plots
{
  echo "size ib_send_lat ib_write_lat ib_read_lat sockperf udp_busy_poll ofi_rxd ofi_tcp"   # us, one way
  for s in $LAT_SIZES; do
    echo "$s ${R[ib_send_lat/$s]} ${R[ib_write_lat/$s]} ${R[ib_read_lat/$s]} ${R[sockperf/$s]:-NaN} ${R[udppp/$s]:-NaN} ${R[ofi_rxd/$s]:-NaN} ${R[tcp/$s]:-NaN}"
  done
} >"$OUT/lat.dat"
mibs() { awk -v v="$1" 'BEGIN { if (v == "NaN" || v == "") print "NaN"; else printf "%.3f", v * 1048576 * 8 / 1e9 }'; }
{
  echo "size ib_send_bw ib_write_bw ib_read_bw udp_sendmmsg udp_gso_gro"   # Gbit/s
  for s in $BW_SIZES; do
    echo "$s $(mibs ${R[ib_send_bw/$s]}) $(mibs ${R[ib_write_bw/$s]}) $(mibs ${R[ib_read_bw/$s]}) ${R[udp/$s]} ${R[gso/$s]}"
  done
} >"$OUT/bw.dat"
gnuplot <<GP 2>"$LOG/gnuplot" || echo "bench: gnuplot failed (see $LOG/gnuplot)" >&2
set terminal pngcairo size 900,600
set logscale x 2
set format x "%.0b%B"
set xlabel "message size (bytes)"
set key left top noenhanced
set grid
set datafile missing "NaN"
set output "$OUT/latency.png"
set title "usrc latency vs references (loopback)"
set ylabel "one-way latency (us)"
set logscale y
plot for [c=2:8] "$OUT/lat.dat" using 1:c with linespoints title columnhead(c)
set output "$OUT/bandwidth.png"
set title "usrc bandwidth vs raw UDP (loopback)"
set ylabel "Gbit/s"
set key left top
plot for [c=2:6] "$OUT/bw.dat" using 1:c with linespoints title columnhead(c)
GP

# ---- the table (a figure not measured reads as NaN: MISS where it has a target)
set +u
misses=0
row() {   # row WHAT USRC REF OP TARGET  (ratio = USRC / REF, OP is <= or >=; INFO rows have no target)
  local r res
  r=$(awk -v a="$2" -v b="$3" 'BEGIN { if (a == "NaN" || b == "NaN" || a == "" || b == "" || b + 0 == 0) print "NaN"; else printf "%.3f", a / b }')
  if [ "$4" = info ]; then res=INFO
  elif [ "$r" = NaN ]; then res=MISS; misses=$((misses + 1))
  elif awk -v r=$r -v t=$5 -v op=$4 'BEGIN { exit !(op == "<=" ? r <= t : r >= t) }'; then res=PASS
  else res=MISS; misses=$((misses + 1)); fi
  printf '%-52s %12s %12s %8s %8s  %s\n' "$1" "$2" "$3" "$r" "$4${5:-}" "$res"
}
S=65536
pp() { awk -v s=$1 -v t="$2" 'BEGIN { if (t == "NaN" || t == "") print "NaN"; else printf "%.1f", s / t }'; }
{
printf '%-52s %12s %12s %8s %8s  %s\n' "figure (usrc vs reference)" usrc reference ratio target result
row "ib_send_lat 2 B vs UDP ping-pong floor (us)" "${R[ib_send_lat/2]}" "${R[floor/2]}" "<=" 1.25
row "ib_write_lat 2 B vs UDP ping-pong floor (us)" "${R[ib_write_lat/2]}" "${R[floor/2]}" "<=" 1.25
row "ib_read_lat 2 B vs UDP ping-pong floor (us)" "${R[ib_read_lat/2]}" "${R[floor/2]}" info
row "  floor: busy-polled UDP vs sockperf ping-pong (us)" "${R[udppp/2]}" "${R[sockperf/2]}" info
row "ib_write_bw 64 KB vs UDP blast (Gbit/s)" "$(mibs ${R[ib_write_bw/$S]})" "$(best ${R[udp/$S]} ${R[gso/$S]})" ">=" 0.70
row "ib_send_bw 64 KB vs UDP blast (Gbit/s)" "$(mibs ${R[ib_send_bw/$S]})" "$(best ${R[udp/$S]} ${R[gso/$S]})" ">=" 0.70
row "ib_read_bw 64 KB vs UDP blast (Gbit/s)" "$(mibs ${R[ib_read_bw/$S]})" "$(best ${R[udp/$S]} ${R[gso/$S]})" ">=" 0.60
row "ib_send_bw 64 B vs UDP blast (Mpps)" "${R[ib_send_bw/64/mpps]}" "$(best ${R[udp/64/mpps]} ${R[gso/64/mpps]})" ">=" 0.60
row "  core-to-core cache line round trip (ns), then vs then" "${R[line/usrc]}" "${R[line/blast]}" info
row "ping-pong 64 KB vs ofi_rxd (MB/s both ways)" "$(pp $S ${R[ib_send_lat/$S]})" "${R[ofi_rxd/$S/MBs]}" ">=" 3
row "ib_send_lat 2 B vs ofi_rxd (us)" "${R[ib_send_lat/2]}" "${R[ofi_rxd/2]}" "<=" 0.5
row "ib_send_lat 4 KB vs ofi_rxd (us)" "${R[ib_send_lat/4096]}" "${R[ofi_rxd/4096]}" "<=" 0.5
row "ib_send_lat 2 B vs ofi tcp (us)" "${R[ib_send_lat/2]}" "${R[tcp/2]}" info
row "ping-pong 64 KB vs ofi tcp (MB/s both ways)" "$(pp $S ${R[ib_send_lat/$S]})" "${R[tcp/$S/MBs]}" info
row "ib_write_bw 64 KB, 1% datagram loss vs none (MB/s)" "${R[loss/1]}" "${R[loss/0]}" ">=" 0.50
row "ib_write_bw 64 KB, 1% GSO-send loss vs none (MB/s)" "${R[loss/gso/1]}" "${R[loss/gso/0]}" info
row "idle QP pair, % of a core (vs 1%)" "${R[idle]}" 1 "<=" 1
row "CPU s/GB, 64 KB send: receiver vs UDP GSO receiver" \
    "$(awk -v c=${R[cpu/usrc/srv]:-0} -v g=${R[gb/usrc]} 'BEGIN { printf "%.3f", c / g }')" \
    "$(awk -v c=${R[cpu/gso/srv]:-0} -v g=${R[gb/gso]} 'BEGIN { printf "%.3f", g ? c / g : 0 }')" info
row "CPU s/GB, 64 KB send: sender vs UDP GSO sender" \
    "$(awk -v c=${R[cpu/usrc/cli]:-0} -v g=${R[gb/usrc]} 'BEGIN { printf "%.3f", c / g }')" \
    "$(awk -v c=${R[cpu/gso/cli]:-0} -v g=${R[gb/gso]} 'BEGIN { printf "%.3f", g ? c / g : 0 }')" info
row "ib_atomic_bw message rate (Mpps)" "${R[ib_atomic_bw/mpps]}" NaN info
row "  through the socket: ib_send_lat 2 B vs UDP floor (us)" "${R[sock/lat/2]}" "${R[floor/2]}" info
row "  through the socket: ib_write_bw 64 KB vs blast (Gbit/s)" "$(mibs ${R[sock/write_bw]})" "$(best ${R[udp/$S]} ${R[gso/$S]})" info
row "RSS of 1 QP, depth 128 (bytes)" "${R[mem/1]}" NaN info
row "RSS per QP, depth 128, 1024 QPs (bytes)" "${R[mem/1024]}" NaN info
echo "1% loss (median of 3 runs each, all in $LOG/loss-runs): nftables dropped ${R[loss/drops]} datagrams (GSO off), ${R[loss/gso/drops]} GSO sends (GSO on); 1024 QPs added ${R[mem/1024/kb]} KB RSS"
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "plots: $OUT/latency.png $OUT/bandwidth.png; data: $OUT/lat.dat $OUT/bw.dat; logs: $LOG"
} >"$OUT/table.txt"
cat "$OUT/table.txt"
exit $misses
