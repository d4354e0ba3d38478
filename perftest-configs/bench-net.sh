#!/bin/bash
# bench.sh --net: usrc across "hosts", side by side with the kernel on the
# same path. Two network namespaces joined by a veth pair (made here and
# deleted on exit), at each MTU; usrc devices on both ends for every
# backend; stock perftest through `usrc exec`. References from the same run,
# interleaved with usrc's figures: the kernel's UDP floor on that veth
# (udpblast's busy-polled ping-pong; its GSO+GRO blast at usrc's packet size;
# its 64 B blast), kernel TCP (qperf tcp_lat, tcp_bw), libfabric's ofi_rxd
# over UDP (fi_pingpong), and, for the ofi backend, its own libfabric
# provider's datagram floor (ofiblast). Every figure RUNS times (median and
# min-max), quiet and with one CPU-bound process beside it (stress-ng), the
# packets resent in every usrc run, ib_write_bw under 1% and 10% loss, and
# the passive-target latencies over the socket on lo (USRC_SHM=0).
#
#   perftest-configs/bench.sh --net [--quick] [--runs N] [--mtus "9000 1500"]
#                                   [--backends "udp xdp ofi"] [--out DIR]
#
# Prints a table of ratios against the targets (docs/benchmarks.md) and writes
# PNG plots; exit status: the number of MISSed targets.
set -u
QUICK= OUT= RUNS= MTUS="9000 1500" BACKENDS="udp xdp ofi"
while [ $# -gt 0 ]; do
  case $1 in
    --net) ;;
    --quick) QUICK=1 ;;
    --runs) RUNS=$2; shift ;;
    --mtus) MTUS=$2; shift ;;
    --backends) BACKENDS=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 --net [--quick] [--runs N] [--mtus LIST] [--backends LIST] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
. "$(dirname "$0")/bench-lib.sh"
USRC=${USRC:-$(tool usrc)} UDPBLAST=$(tool udpblast) OFIBLAST=$(tool ofiblast)
[ -n "$USRC" ] && [ -n "$UDPBLAST" ] ||
  { echo "bench: need usrc and udpblast: build the tree (cmake --build build) or install usrc" >&2; exit 2; }
need_debs ib_send_bw:perftest qperf:qperf fi_pingpong:libfabric-bin gnuplot:gnuplot-nox \
          stress-ng:stress-ng nft:nftables ip:iproute2 ss:iproute2
if [ -n "$QUICK" ]; then RUNS=${RUNS:-2} SECS=1 LATN=2000; else RUNS=${RUNS:-5} SECS=2 LATN=10000; fi

OUT=${OUT:-/tmp/usrc-bench-net.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG=$OUT/logs D=$OUT/data; mkdir -p "$LOG" "$D"
export USRC_ROOT=$(mktemp -d /tmp/usrc-bench-root.XXXXXX)
chmod 755 "$USRC_ROOT"
A=usrcnetA$$ B=usrcnetB$$ VA=vna$$ VB=vnb$$ NET=10.213.0
HOG=
cleanup() {
  [ -n "$HOG" ] && kill $HOG 2>/dev/null
  ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$USRC_ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add $A && ip netns add $B || exit 2
ip link add $VA netns $A type veth peer name $VB netns $B || exit 2
ip -n $A addr add $NET.1/24 dev $VA && ip -n $B addr add $NET.2/24 dev $VB || exit 2
for ns in $A $B; do ip -n $ns link set lo up; done
echo "bench: network mode, output in $OUT; $RUNS runs per figure; load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

port=$((10000 + RANDOM % 15000))
nxt() { port=$((port + 1)); }
# put KEY VALUE: one run's figure (NaN when the run failed).
put() { mkdir -p "$(dirname "$D/$1")"; echo "${2:-NaN}" >>"$D/$1"; }
waitport() {   # waitport NS PORT [udp]
  local i
  for i in $(seq 100); do
    ip netns exec $1 ss -Hln${3:+u}${3:-t} "sport = :$2" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
}
# pt NAME DEVA DEVB TEST ARGS...: perftest through usrc, server in B, client
# in A; prints the client's result line's "MB/s Mpps" (bw) or typical us (lat).
pt() {
  local name=$1 da=$2 db=$3 t=$4; shift 4
  nxt
  ip netns exec $B timeout 120 env ${XENV:-} "$USRC" exec -- $t -d $db -p $port -F "$@" >"$LOG/$name.srv" 2>&1 &
  local spid=$!
  waitport $B $port
  ip netns exec $A timeout 120 env ${XENV:-} "$USRC" exec -- $t -d $da -p $port -F "$@" $NET.2 >"$LOG/$name.cli" 2>&1
  local rc=$?
  wait $spid || rc=1
  [ $rc = 0 ] || { echo "NaN NaN"; return; }
  grep -E '^ *[0-9]+ +[0-9]+ ' "$LOG/$name.cli" | tail -1 | awk '{ if (NF >= 9) print $5; else print $4, $5 }'
}
# Packets sent and resent by both ends of a backend's devices (their
# counters are reset before every usrc run).
counters() {   # counters DEV...: "tx_packets retransmits"
  local d
  for d; do ip netns exec ${d%%:*} "$USRC" stats ${d#*:}; done |
    awk '{ for (i = 1; i < NF; i++) { if ($i == "tx_packets") t += $(i+1); if ($i == "retransmits") r += $(i+1) } }
         END { print t + 0, r + 0 }'
}
resetc() { local d; for d; do ip netns exec ${d%%:*} "$USRC" stats reset ${d#*:} >/dev/null 2>&1; done; }

# usrc_runs KEYPREFIX DEVA DEVB: every perftest figure once, counting resends.
usrc_runs() {
  local k=$1 da=$2 db=$3 v n=${1//\//-}
  resetc $A:$da $B:$db
  put $k/send_lat "$(pt $n-send_lat-$r $da $db ib_send_lat -s 2 -n $LATN)"
  put $k/write_lat "$(pt $n-write_lat-$r $da $db ib_write_lat -s 2 -n $LATN)"
  put $k/read_lat "$(pt $n-read_lat-$r $da $db ib_read_lat -s 2 -n $LATN)"
  for t in write send read; do
    set -- $(pt $n-${t}_bw-$r $da $db ib_${t}_bw -s 65536 -D $SECS); put $k/${t}_bw "${1:-NaN}"
  done
  set -- $(pt $n-send_bw64-$r $da $db ib_send_bw -s 64 -D $SECS); put $k/send_mpps "${2:-NaN}"
  set -- $(pt $n-atomic-$r $da $db ib_atomic_bw -D $SECS); put $k/atomic_mpps "${2:-NaN}"
  set -- $(counters $A:$da $B:$db); put $k/tx "$1"; put $k/resent "$2"
  echo "run $r $k: sent $1 resent $2" >>"$LOG/resends"
}

# The kernel on the same veth.
ref_runs() {
  local k=$1 seg=$2 v n=${1//\//-}
  nxt   # busy-polled UDP ping-pong, 2 B
  ip netns exec $B "$UDPBLAST" -s -P -p $port -t $SECS >"$LOG/$n-udppp-$r.srv" 2>&1 &
  local upid=$!
  waitport $B $port u
  put $k/udppp "$(ip netns exec $A "$UDPBLAST" -c $NET.2 -P -p $port -m 2 -t $SECS 2>&1 |
                 tee "$LOG/$n-udppp-$r.cli" | sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')"
  wait $upid
  blast() {   # blast SIZE [-g]: "gbps mpps" as the receiver saw them
    nxt
    ip netns exec $B "$UDPBLAST" -s -p $port ${2:-} -t $SECS >"$LOG/$n-blast$1${2:-}-$r.srv" 2>&1 &
    local spid=$!
    waitport $B $port u
    ip netns exec $A "$UDPBLAST" -c $NET.2 -p $port -m $1 ${2:-} -t $SECS >/dev/null 2>&1
    wait $spid
    sed -n 's/.*gbps=\([0-9.]*\) mpps=\([0-9.]*\)/\1 \2/p' "$LOG/$n-blast$1${2:-}-$r.srv"
  }
  set -- $(blast $seg -g); put $k/gso "$(awk -v g=${1:-NaN} 'BEGIN { if (g == "NaN") print g; else printf "%.1f", g * 1e9 / 8 / 1048576 }')"
  local m1 m2
  set -- $(blast 64); m1=${2:-NaN}
  set -- $(blast 64 -g); m2=${2:-NaN}
  put $k/blast64 "$(awk -v a=$m1 -v b=$m2 'BEGIN { print (a == "NaN" || (b != "NaN" && b + 0 > a + 0)) ? b : a }')"
  nxt   # kernel TCP
  ip netns exec $B timeout 60 qperf -lp $port >"$LOG/$n-qperf-$r.srv" 2>&1 &
  local qpid=$!
  waitport $B $port
  put $k/tcp_lat "$(ip netns exec $A timeout 60 qperf -lp $port -t $SECS -m 2 $NET.2 tcp_lat 2>&1 |
                   tee "$LOG/$n-tcp_lat-$r" | awk '$1 == "latency" { v = $3; if ($4 == "ms") v *= 1000; if ($4 == "ns") v /= 1000; print v }')"
  put $k/tcp_bw "$(ip netns exec $A timeout 60 qperf -lp $port -t $SECS -m 64K $NET.2 tcp_bw 2>&1 |
                  tee "$LOG/$n-tcp_bw-$r" | awk '$1 == "bw" { v = $3; if ($4 == "GB/sec") v *= 1000; if ($4 == "KB/sec") v /= 1000; printf "%.1f", v * 1e6 / 1048576 }')"
  kill $qpid 2>/dev/null; wait $qpid 2>/dev/null
  nxt   # libfabric's reliability layer over UDP
  ip netns exec $B timeout 60 fi_pingpong -p "udp;ofi_rxd" -e rdm -S 2 -I 2000 -B $port >"$LOG/$n-rxd-$r.srv" 2>&1 &
  local fpid=$!
  waitport $B $port
  put $k/rxd_lat "$(ip netns exec $A timeout 60 fi_pingpong -p "udp;ofi_rxd" -e rdm -S 2 -I 2000 -P $port $NET.2 2>&1 |
                   tee "$LOG/$n-rxd-$r.cli" | awk '$1 ~ /^[0-9]/ { print $7 }')"
  wait $fpid 2>/dev/null
  if [ -n "$OFIBLAST" ]; then   # the ofi backend's own provider: its datagram floor
    local mx
    for mx in 64 $seg; do
      nxt
      ip netns exec $B timeout 60 "$OFIBLAST" -s -p $port -t $SECS >"$LOG/$n-ofiblast$mx-$r.srv" 2>&1 &
      local opid=$!
      sleep 0.3
      ip netns exec $A timeout 60 "$OFIBLAST" -c $NET.2 -p $port -m $mx -t $SECS >/dev/null 2>&1
      wait $opid
      set -- $(sed -n 's/.*gbps=\([0-9.]*\) mpps=\([0-9.]*\)/\1 \2/p' "$LOG/$n-ofiblast$mx-$r.srv")
      if [ $mx = 64 ]; then put $k/ofi_mpps "${2:-NaN}"
      else put $k/ofi_bw "$(awk -v g=${1:-NaN} 'BEGIN { if (g == "NaN") print g; else printf "%.1f", g * 1e9 / 8 / 1048576 }')"; fi
    done
  fi
}

FIGS="send_lat write_lat read_lat write_bw send_bw read_bw send_mpps atomic_mpps"
for mtu in $MTUS; do
  ip -n $A link set $VA down; ip -n $B link set $VB down
  ip -n $A link set $VA mtu $mtu && ip -n $B link set $VB mtu $mtu || { echo "bench: MTU $mtu refused" >&2; continue; }
  ip -n $A link set $VA up; ip -n $B link set $VB up
  for i in $(seq 50); do
    ip -n $A link show $VA | grep -q "state UP" && ip -n $B link show $VB | grep -q "state UP" && break
    sleep 0.1
  done
  # usrc's packet on this MTU: the IBA MTU's payload (the largest power of
  # two from 256 to 4096 that fits with the IP, UDP and IBA headers) plus
  # the BTH and the ICRC: the blast sends datagrams of that size.
  pmtu=4096; while [ $((pmtu + 20 + 8 + 12 + 16 + 4)) -gt $mtu ] && [ $pmtu -gt 256 ]; do pmtu=$((pmtu / 2)); done
  seg=$((pmtu + 16))
  bes=
  for be in $BACKENDS; do
    ip netns exec $A "$USRC" link del a_$be >/dev/null 2>&1; ip netns exec $B "$USRC" link del b_$be >/dev/null 2>&1
    if ip netns exec $A "$USRC" link add a_$be netdev $VA backend $be >"$LOG/linkadd-$mtu-$be" 2>&1 &&
       ip netns exec $B "$USRC" link add b_$be netdev $VB backend $be >>"$LOG/linkadd-$mtu-$be" 2>&1; then
      bes="$bes $be"
    else
      echo "bench: MTU $mtu: backend $be: link add failed: $(tail -1 "$LOG/linkadd-$mtu-$be")" | tee -a "$LOG/skipped" >&2
    fi
  done
  for var in quiet busy; do
    for r in $(seq $RUNS); do
      [ $var = busy ] && { stress-ng --cpu 1 --timeout 3600 >/dev/null 2>&1 & HOG=$!; sleep 0.5; }
      echo "bench: MTU $mtu, $var, run $r of $RUNS: references, then usrc over:$bes"
      ref_runs $mtu/$var/ref $seg
      for be in $bes; do usrc_runs $mtu/$var/$be a_$be b_$be; done
      [ -n "$HOG" ] && { kill $HOG; wait $HOG 2>/dev/null; HOG=; }
    done
  done
  # Loss (udp backend, quiet): nftables in B drops 1% or 10% of the UDP
  # datagrams arriving there, at random.
  case " $bes " in *" udp "*)
    for pct in 0 1 10; do
      ip netns exec $B nft delete table inet usrcbench 2>/dev/null
      [ $pct = 0 ] || ip netns exec $B nft -f - <<NFT
table inet usrcbench {
  chain in {
    type filter hook input priority 0;
    meta l4proto udp numgen random mod 100 < $pct counter drop
  }
}
NFT
      for r in $(seq $RUNS); do
        set -- $(pt $mtu-loss$pct-$r a_udp b_udp ib_write_bw -s 65536 -D $SECS); put $mtu/loss/$pct "${1:-NaN}"
      done
    done
    ip netns exec $B nft delete table inet usrcbench 2>/dev/null ;;
  esac
  for be in $bes; do ip netns exec $A "$USRC" link del a_$be >/dev/null; ip netns exec $B "$USRC" link del b_$be >/dev/null; done
done

# The passive target over the socket on one host: lo in A, USRC_SHM=0.
if ip netns exec $A "$USRC" link add l_udp netdev lo >"$LOG/linkadd-lo" 2>&1; then
  for r in $(seq $RUNS); do
    for t in send write read; do
      nxt
      ip netns exec $A timeout 120 env USRC_SHM=0 "$USRC" exec -- ib_${t}_lat -d l_udp -p $port -F -s 2 -n $LATN >"$LOG/lo-$t-$r.srv" 2>&1 &
      waitport $A $port
      ip netns exec $A timeout 120 env USRC_SHM=0 "$USRC" exec -- ib_${t}_lat -d l_udp -p $port -F -s 2 -n $LATN 127.0.0.1 >"$LOG/lo-$t-$r.cli" 2>&1
      wait $!
      put lo/${t}_lat "$(grep -E '^ *[0-9]+ +[0-9]+ ' "$LOG/lo-$t-$r.cli" | tail -1 | awk '{ print $5 }')"
    done
  done
fi

# ---- statistics: st KEY -> "median min max" over the runs
st() {
  [ -s "$D/$1" ] || { echo "NaN NaN NaN"; return; }
  sort -g "$D/$1" | awk '$1 != "NaN" { v[n++] = $1 } END {
    if (!n) { print "NaN NaN NaN"; exit }
    m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; print m, v[0], v[n - 1] }'
}
med() { set -- $(st "$1"); echo $1; }
# Same-run ratios: ratios KEY_A KEY_B -> "median min" of A_i / B_i
ratios() {
  paste "$D/$1" "$D/$2" 2>/dev/null | awk '$1 != "NaN" && $2 != "NaN" && $2 + 0 != 0 { print $1 / $2 }' | sort -g |
    awk '{ v[n++] = $1 } END { if (!n) { print "NaN NaN NaN"; exit }
      m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; printf "%.3f %.3f %.3f\n", m, v[0], v[n - 1] }'
}
# Resent share of a configuration's runs: total resent / total sent.
resent() { paste "$D/$1/resent" "$D/$1/tx" 2>/dev/null | awk '{ r += $1; t += $2 } END { if (t) printf "%.5f", r / t; else print "NaN" }'; }

set +u
misses=0
row() {   # row WHAT RATIO OP TARGET [DETAIL]
  local res
  if [ "$3" = info ]; then res=INFO
  elif [ "$2" = NaN ] || [ -z "$2" ]; then res=MISS; misses=$((misses + 1))
  elif awk -v r=$2 -v t=$4 -v op=$3 'BEGIN { exit !(op == "<=" ? r <= t : r >= t) }'; then res=PASS
  else res=MISS; misses=$((misses + 1)); fi
  printf '%-62s %8s %6s  %-4s  %s\n' "$1" "$2" "$3${4:-}" "$res" "${5:-}"
}
fig() { set -- $(st "$1"); echo "$1 [$2-$3]"; }   # "median [min-max]"
# ib_read_lat reports a READ's whole round trip, ib_send_lat half of one (as
# ib_write_lat does): the READ's round trip against the SEND's, for scale.
rtt_row() {   # rtt_row PREFIX DIR
  set -- "$1" $(ratios "$2/read_lat" "$2/send_lat" | awk '{ for (i = 1; i <= 3; i++) $i = $i == "NaN" ? "NaN" : sprintf("%.3f", $i / 2); print }')
  row "$1ib_read_lat 2 B vs 2x ib_send_lat (round trips)" "$2" info "" "[$3-$4]"
}
{
echo "usrc network mode: $(date -u +%Y-%m-%dT%H:%MZ), $RUNS runs per figure, $(nproc) cores"
echo
echo "## Figures: median [min-max] of $RUNS runs (us; MB/s; Mpps)"
printf '%-6s %-6s %-5s' MTU load who; for f in $FIGS; do printf ' %20s' $f; done; echo
for mtu in $MTUS; do for var in quiet busy; do
  for be in $BACKENDS; do
    [ -s "$D/$mtu/$var/$be/send_lat" ] || continue
    printf '%-6s %-6s %-5s' $mtu $var $be; for f in $FIGS; do printf ' %20s' "$(fig $mtu/$var/$be/$f)"; done
    echo "   resent $(resent $mtu/$var/$be)"
  done
  printf '%-6s %-6s %-5s' $mtu $var kern
  printf ' %20s' "udp $(fig $mtu/$var/ref/udppp)" "tcp $(fig $mtu/$var/ref/tcp_lat)" "rxd $(fig $mtu/$var/ref/rxd_lat)" \
    "gso $(fig $mtu/$var/ref/gso)" "tcp $(fig $mtu/$var/ref/tcp_bw)" "ofi $(fig $mtu/$var/ref/ofi_bw)" \
    "blast $(fig $mtu/$var/ref/blast64)" "ofi $(fig $mtu/$var/ref/ofi_mpps)"
  echo
done; done
[ -s "$D/lo/send_lat" ] && echo "lo, socket (USRC_SHM=0): send_lat $(fig lo/send_lat), write_lat $(fig lo/write_lat), read_lat $(fig lo/read_lat)"
echo
echo "## Targets (medians of same-run ratios; [min-max] of the ratios)"
for mtu in $MTUS; do
  q=$mtu/quiet u=$mtu/quiet/udp
  [ -s "$D/$u/send_lat" ] || { row "MTU $mtu: udp backend" NaN ">=" 1 "(no runs)"; continue; }
  rr() { set -- $(ratios "$1" "$2"); echo "$1"; }
  rng() { set -- $(ratios "$1" "$2"); echo "[$2-$3]"; }
  row "MTU $mtu: ib_send_lat 2 B vs UDP ping-pong" $(rr $u/send_lat $q/ref/udppp) "<=" 1.2 "$(rng $u/send_lat $q/ref/udppp)"
  row "MTU $mtu: ib_write_lat 2 B vs usrc's ib_send_lat" $(rr $u/write_lat $u/send_lat) "<=" 1.5 "$(rng $u/write_lat $u/send_lat)"
  row "MTU $mtu: ib_read_lat 2 B vs usrc's ib_send_lat" $(rr $u/read_lat $u/send_lat) "<=" 1.5 "$(rng $u/read_lat $u/send_lat)"
  rtt_row "MTU $mtu: " $u
  for t in write send read; do
    tg=0.7; [ $t = read ] && tg=0.6
    set -- $(ratios $u/${t}_bw $q/ref/gso)
    row "MTU $mtu: ib_${t}_bw 64 KB vs GSO+GRO blast, every run" "$2" ">=" $tg "median $1"
    row "MTU $mtu: ib_${t}_bw 64 KB vs kernel TCP" $(rr $u/${t}_bw $q/ref/tcp_bw) ">=" 1 "$(rng $u/${t}_bw $q/ref/tcp_bw)"
  done
  row "MTU $mtu: ib_send_bw 64 B vs 64 B UDP blast (Mpps)" $(rr $u/send_mpps $q/ref/blast64) ">=" 1.0 "$(rng $u/send_mpps $q/ref/blast64)"
  row "MTU $mtu: ib_atomic_bw vs 64 B UDP blast (Mpps)" $(rr $u/atomic_mpps $q/ref/blast64) ">=" 0.5 "$(rng $u/atomic_mpps $q/ref/blast64)"
  for var in quiet busy; do
    [ -s "$D/$mtu/$var/udp/tx" ] && row "MTU $mtu, $var: packets resent / sent (udp)" "$(resent $mtu/$var/udp)" "<=" 0.001
  done
  for f in $FIGS; do
    b=$(med $mtu/busy/udp/$f) qv=$(med $u/$f)
    case $f in *lat) kr=$(awk -v a=$qv -v b=$b 'BEGIN { if (a == "NaN" || b == "NaN" || b == 0) print "NaN"; else printf "%.3f", a / b }') ;;
               *) kr=$(awk -v a=$b -v b=$qv 'BEGIN { if (a == "NaN" || b == "NaN" || b == 0) print "NaN"; else printf "%.3f", a / b }') ;; esac
    row "MTU $mtu: $f with a CPU-bound process, kept of quiet" "$kr" ">=" 0.5
    for var in quiet busy; do
      set -- $(st $mtu/$var/udp/$f)
      row "MTU $mtu, $var: $f spread of the runs (max/min)" \
        "$(awk -v a=$3 -v b=$2 'BEGIN { if (a == "NaN" || b == "NaN" || b == 0) print "NaN"; else printf "%.3f", a / b }')" "<=" 1.5
    done
  done
  l0=$(med $mtu/loss/0)
  for pct in 1 10; do
    tg=0.5; [ $pct = 10 ] && tg=0.15
    row "MTU $mtu: ib_write_bw 64 KB at $pct% loss vs none" \
      "$(awk -v a=$(med $mtu/loss/$pct) -v b=$l0 'BEGIN { if (a == "NaN" || b == "NaN" || b == 0) print "NaN"; else printf "%.3f", a / b }')" ">=" $tg
  done
  if [ -s "$D/$mtu/quiet/xdp/send_lat" ]; then
    for f in $FIGS; do
      case $f in *lat) row "MTU $mtu: xdp $f vs udp backend" $(rr $mtu/quiet/xdp/$f $u/$f) "<=" 1 ;;
                 *) row "MTU $mtu: xdp $f vs udp backend" $(rr $mtu/quiet/xdp/$f $u/$f) ">=" 1 ;; esac
    done
  else case " $BACKENDS " in *" xdp "*) row "MTU $mtu: xdp backend" NaN ">=" 1 "(no runs: $LOG/skipped)" ;; esac; fi
  if [ -s "$D/$mtu/quiet/ofi/send_lat" ]; then
    row "MTU $mtu: ofi ib_write_bw 64 KB vs its provider's datagram floor" $(rr $mtu/quiet/ofi/write_bw $q/ref/ofi_bw) ">=" 0.5
    row "MTU $mtu: ofi ib_send_bw 64 B vs its provider's 64 B rate" $(rr $mtu/quiet/ofi/send_mpps $q/ref/ofi_mpps) ">=" 0.5
  fi
done
if [ -s "$D/lo/send_lat" ]; then
  row "lo, socket: ib_write_lat 2 B vs ib_send_lat" $(ratios lo/write_lat lo/send_lat | cut -d' ' -f1) "<=" 1.5
  row "lo, socket: ib_read_lat 2 B vs ib_send_lat" $(ratios lo/read_lat lo/send_lat | cut -d' ' -f1) "<=" 1.5
  rtt_row "lo, socket: " lo
fi
echo
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg); plots: $OUT/net-*.png; per-run data: $D; logs: $LOG"
} >"$OUT/table.txt"

# ---- plots: per MTU and load, the medians of each backend and the kernel
for mtu in $MTUS; do for var in quiet busy; do
  {
    echo "who send_lat write_lat read_lat"
    for be in $BACKENDS; do
      [ -s "$D/$mtu/$var/$be/send_lat" ] && echo "$be $(med $mtu/$var/$be/send_lat) $(med $mtu/$var/$be/write_lat) $(med $mtu/$var/$be/read_lat)"
    done
    echo "kernel-udp $(med $mtu/$var/ref/udppp) NaN NaN"
    echo "kernel-tcp $(med $mtu/$var/ref/tcp_lat) NaN NaN"
    echo "ofi_rxd $(med $mtu/$var/ref/rxd_lat) NaN NaN"
  } >"$OUT/lat-$mtu-$var.dat"
  {
    echo "who write_bw send_bw read_bw"
    for be in $BACKENDS; do
      [ -s "$D/$mtu/$var/$be/send_lat" ] && echo "$be $(med $mtu/$var/$be/write_bw) $(med $mtu/$var/$be/send_bw) $(med $mtu/$var/$be/read_bw)"
    done
    echo "udp-gso-gro $(med $mtu/$var/ref/gso) NaN NaN"
    echo "kernel-tcp $(med $mtu/$var/ref/tcp_bw) NaN NaN"
    echo "ofi-floor $(med $mtu/$var/ref/ofi_bw) NaN NaN"
  } >"$OUT/bw-$mtu-$var.dat"
  gnuplot <<GP 2>>"$LOG/gnuplot" || echo "bench: gnuplot failed (see $LOG/gnuplot)" >&2
set terminal pngcairo size 900,500
set style data histograms
set style histogram cluster gap 1
set style fill solid border -1
set key left top noenhanced
set grid ytics
set datafile missing "NaN"
set xtics noenhanced
set output "$OUT/net-lat-$mtu-$var.png"
set title "usrc across a veth, MTU $mtu, $var: 2 B latency (median of $RUNS)"
set ylabel "one-way latency (us)"
set logscale y
plot for [c=2:4] "$OUT/lat-$mtu-$var.dat" using c:xtic(1) title columnhead(c)
unset logscale y
set output "$OUT/net-bw-$mtu-$var.png"
set title "usrc across a veth, MTU $mtu, $var: 64 KB bandwidth (median of $RUNS)"
set ylabel "MB/s"
plot for [c=2:4] "$OUT/bw-$mtu-$var.dat" using c:xtic(1) title columnhead(c)
GP
done; done
cat "$OUT/table.txt"
exit $misses
