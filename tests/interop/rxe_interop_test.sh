#!/bin/bash
# usrc against the Linux kernel's Soft-RoCE (rdma_rxe): a QEMU guest with
# Debian 12's kernel and an rxe device (rxe_vm.sh) behind a bridge in a
# network namespace, a usrc RoCE device on that bridge. For each guest MTU
# (1500: rxe's active MTU 1024; 9000: 4096), and again with 5% of the
# guest's packets dropped on the host's input (nftables), in both directions
# (usrc as client and as server):
#   stock ibv_rc_pingpong -c, perftest ib_{send,write,read}_bw, ib_atomic_bw
#   (FETCH_AND_ADD, CMP_AND_SWAP), ib_{send,write,read}_lat, and rxe_check
#   (every operation, data checked on both sides); without loss also
#   ibv_ud_pingpong and, through rdma_cm (the guest kernel's CM), rping -V
#   and ib_send_bw -R.
# Each set is captured on the tap (kept in CACHE_DIR/run/SET.pcap): tshark must find no malformed packet and
# every packet must carry a valid ICRC (icrc_check.py); rxe's counters must
# show no out-of-sequence request and, without loss, no sequence error NAK.
# A table of the runs' throughput and latency is printed (TCG: a few MB/s).
# Usage: rxe_interop_test.sh USRC_CLI PROVIDER_SO RXE_CHECK CACHE_DIR
# Environment: RXEVM_MTUS (default "1500 9000"), RXEVM_LOSS (5; 0: no loss
# set), RXEVM_LOSS_MTUS (the MTUs with a loss set, default "1500"),
# RXEVM_ONLY (a regex on "TEST SET DIRECTION").
USRC=$1 USRC_PROVIDER=$2 CHECK=$3 CACHE=$4
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../integration/lib.sh"
. "$HERE/rxe_vm.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (netns, tap, qemu)"; exit 77; }
need_tools qemu-system-x86_64 busybox cpio depmod apt-get dpkg tcpdump tshark nft python3 \
  ibv_rc_pingpong ibv_ud_pingpong rping ib_send_bw ib_atomic_bw rdma
[ -c /dev/net/tun ] || { echo "no /dev/net/tun"; exit 77; }
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || { echo "no rxe provider (ibverbs-providers)"; exit 77; }
MTUS=${RXEVM_MTUS:-1500 9000} LOSS=${RXEVM_LOSS:-5} LOSS_MTUS=${RXEVM_LOSS_MTUS-1500}
ONLY=${RXEVM_ONLY:-.}
TMO=90      # a bound on each run (against hangs: rxe retries forever)
BUDGET=1200 # no run starts after this many seconds (ctest's timeout is 1500)
T0=$(date +%s)

new_root
hpids=()
cleanup() {
  local p
  for p in "${hpids[@]}"; do kill "$p" 2>/dev/null; done
  vm_stop
  rm -rf "$USRC_ROOT"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

bins=()
for b in ip rdma ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rping ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw \
         ib_send_lat ib_write_lat ib_read_lat; do
  bins+=("$(readlink -f "$(command -v "$b")")")
done
vm_prepare "$CACHE" "${bins[@]}" "$CHECK"
case $? in
  0) ;;
  2) echo "the kernel package cannot be downloaded"; exit 77 ;;
  *) fail "preparing the guest" ;;
esac
vm_boot "$CACHE" 1500 || fail "the guest did not boot"
note "guest up after $(($(date +%s) - T0)) s"
RUN=$VM_RUN
hexec() { ip netns exec "$VM_NS" "$@"; }

# The usrc device on the bridge, for the bridge's current MTU.
HGID=
usrc_device() {
  hexec "$USRC" link del rv0 >/dev/null 2>&1
  hexec "$USRC" link add rv0 netdev "$VM_BR" type roce >/dev/null || fail "usrc link add"
  # The last index of the address: 1 where index 0 repeats it, as on rxe.
  HGID=$(hexec "$USRC" exec -- ibv_devinfo -v -d rv0 |
         sed -n "s/.*GID\[ *\([0-9]*\)\]:.*::ffff:$VM_HOST\b.*/\1/p" | tail -1)
  [ -n "$HGID" ] || fail "no GID of $VM_HOST on rv0"
}

# The value a run prints on its client side, for the table.
value_of() {   # value_of TEST FILE
  case $1 in
    *atomic_bw*) awk '$1 ~ /^[0-9]+$/ && NF >= 5 {v = $5 * 1e6 " msg/s"} END {print v}' "$2" ;;
    *_bw*) awk '$1 ~ /^[0-9]+$/ && NF >= 5 {v = $4 " MB/s"} END {print v}' "$2" ;;
    *_lat) awk '$1 ~ /^[0-9]+$/ && NF >= 7 {v = $6 " us avg"} END {print v}' "$2" ;;
    *pingpong) grep -o '[0-9.]* usec/iter' "$2" | head -1 ;;
    rping) echo "$(grep -c 'ping data' "$2") pings checked" ;;
    rxe_check) grep -q PASS "$2" && echo "data checked" ;;
  esac
}

TABLE=$(mktemp /tmp/usrc-out.XXXXXX)
failures=0
# run PROGRAM[:NAME] SET DIR HOSTARGS GUESTARGS: one run. DIR "usrc->rxe":
# usrc (host) is the client, the guest the server; "rxe->usrc": the other way.
run() {
  local test=$1 set=$2 dir=$3 hargs=$4 gargs=$5 prog=${1%%:*} gprog=${1%%:*}
  # Our checker: the build's on the host, in /opt/bin in the guest.
  [ "$prog" = rxe_check ] && prog=$CHECK gprog=${CHECK##*/}
  local port; port=$(pick_port)
  local out=$RUN/out.$$.$port rc=0 id marker=$RUN/share/q/listen.$port
  echo "$test $set $dir" | grep -qE "$ONLY" || return 0
  # A server that connects through rdma_cm listens on no TCP port: it is up
  # when its CM id listens (the guest's kernel) or its service is
  # registered (usrc's). rping names its role and address itself.
  local cm=
  case "$prog $hargs " in rping*|*" -R "*) cm=1 ;; esac
  local hsrv= hcli=$VM_GUEST gsrv= gcli=$VM_HOST
  [ "$prog" = rping ] && hsrv="-s -a $VM_HOST" hcli="-c -a $VM_GUEST" gsrv="-s -a $VM_GUEST" gcli="-c -a $VM_HOST"
  if [ $(($(date +%s) - T0)) -gt $BUDGET ]; then
    failures=$((failures + 1))
    printf '%-14s %-26s %-10s %-5s %s\n' "$set" "${test#*:}" "$dir" "FAIL" "not run: over ${BUDGET} s" >>"$TABLE"
    return 0
  fi
  if [ "$dir" = "usrc->rxe" ]; then
    local up="grep -qE ':$(printf '%04X' "$port") 0+:0000 0A' /proc/net/tcp /proc/net/tcp6"
    [ -n "$cm" ] && up="/opt/bin/rdma res show cm_id | grep -qE 'LISTEN.*:$port( |\$)'"
    id=$(vm_exec -b $TMO "$gprog $gargs -p $port $gsrv >/tmp/srv.$port 2>&1 & p=\$!
      i=0; while ! { $up; } && kill -0 \$p && [ \$i -lt 600 ]; do usleep 100000; i=\$((i+1)); done
      touch /share/q/listen.$port; wait \$p; rc=\$?; cat /tmp/srv.$port; exit \$rc")
    for _ in $(seq 600); do [ -e "$marker" ] && break; sleep 0.1; done
    hexec timeout $TMO "$USRC" exec -- "$prog" $hargs -p "$port" $hcli >"$out.cli" 2>&1 || { rc=$?; vm_kill "$id"; }
    vm_wait "$id" >"$out.srv" 2>&1 || rc=$((rc ? rc : 1000 + $?))
  else
    # (Not through the function hexec: $! is then the program's pid.)
    ip netns exec "$VM_NS" timeout $TMO "$USRC" exec -- "$prog" $hargs -p "$port" $hsrv >"$out.srv" 2>&1 &
    local hp=$!
    hpids+=("$hp")
    if ! if [ -n "$cm" ]; then wait_service 0x0106 "$port"; else wait_listen "$VM_NS" "$port"; fi; then
      kill $hp 2>/dev/null; wait $hp
      echo "$test $set: the usrc server did not listen" >"$out.cli"
      rc=1
    else
      id=$(vm_exec -b $TMO "$gprog $gargs -p $port $gcli")
      # Whichever side fails first ends the other.
      local hrc=
      while [ ! -e "$id.rc" ]; do
        if ! kill -0 $hp 2>/dev/null; then
          wait $hp; hrc=$?
          [ $hrc = 0 ] || vm_kill "$id"
          break
        fi
        sleep 0.2
      done
      vm_wait "$id" >"$out.cli" 2>&1 || { rc=$((1000 + $?)); [ -n "$hrc" ] || kill $hp 2>/dev/null; }
      [ -n "$hrc" ] || { wait $hp; hrc=$?; }
      [ $hrc = 0 ] || [ $rc != 0 ] || rc=$hrc
    fi
  fi
  rm -f "$marker"
  # (perftest in the guest may time with a TSC TCG makes unreliable: then
  # the other side's figure, where it prints one.)
  local v; v=$(value_of "${test#*:}" "$out.cli")
  case $v in ""|0|0.00*|inf*|nan*|-*) v=$(value_of "${test#*:}" "$out.srv") ;; esac
  if [ $rc -ne 0 ]; then
    failures=$((failures + 1))
    printf '%-14s %-26s %-10s %-5s %s\n' "$set" "${test#*:}" "$dir" "FAIL" >>"$TABLE"
    echo "=== FAIL: $set $test $dir (status $rc)"
    echo "--- server:"; tail -40 "$out.srv"; echo "--- client:"; tail -40 "$out.cli"
  else
    printf '%-14s %-26s %-10s %-5s %s\n' "$set" "${test#*:}" "$dir" "ok" "$v" >>"$TABLE"
    note "$set ${test#*:} $dir: ok $v"
  fi
  rm -f "$out".*
}

# rxe's port counters, as NAME VALUE lines.
rxe_stats() { vm_exec 30 "/opt/bin/rdma statistic show link rxe0/1" | awk '{for (i = 3; i < NF; i += 2) print $i, $(i + 1)}'; }
stat_of() { awk -v n="$2" '$1 == n {print $2}' "$1"; }

# one_set NAME MTU: every test both ways, captured, counters compared.
one_set() {
  local set=$1 mtu=$2 m=$((mtu >= 9000 ? 4096 : 1024))
  local cap=$RUN/$set.pcap
  rxe_stats >"$RUN/$set.before" || fail "rdma statistic"
  ip netns exec "$VM_NS" tcpdump -i "$VM_TAP" -B 16384 -U --immediate-mode -w "$cap" udp >"$RUN/$set.tcpdump" 2>&1 &
  local tp=$!
  hpids+=("$tp")
  for _ in $(seq 100); do grep -q "listening on" "$RUN/$set.tcpdump" && break; sleep 0.1; done
  # (The guest runs emulated and stalls for a while when the host is busy:
  # both sides wait about a second for an ACK, -u 18, before a retry.)
  local H="-d rv0" G="-d rxe0"
  local pf="-F -m $m" n=40 o
  # perftest gives its QP the peer's outstanding READs and atomics (the
  # peer device's max_qp_rd_atom), which fails ibv_modify_qp where that is
  # more than this device's own: both sides say 16, whatever the devices'.
  local outs="-o 16"
  for dir in "usrc->rxe" "rxe->usrc"; do
    # (Not under loss: ibv_rc_pingpong ends without a last handshake, so
    # the ACK of its last message can be lost after the peer has destroyed
    # its QP, and the sender's retries end in RETRY_EXC_ERR, on any device.
    # rxe_check and perftest end with a handshake on their TCP channel.)
    case $set in
      *loss*) ;;
      *) run ibv_rc_pingpong:rc_pingpong "$set" "$dir" "$H -g $HGID -m $m -c -n 20" "$G -g 1 -m $m -c -n 20"
         # (UD and the CM: not under loss either. UD is unreliable, and
         # ibv_ud_pingpong stops at the first lost message.)
         run ibv_ud_pingpong:ud_pingpong "$set" "$dir" "$H -g $HGID -s 512 -n 20" "$G -g 1 -s 512 -n 20"
         run rping "$set" "$dir" "-v -V -C 5" "-v -V -C 5"
         run ib_send_bw:ib_send_bw_rdma_cm "$set" "$dir" "$H -x $HGID -R $pf -u 18 -s 8192 -n $n" \
             "$G -x 1 -R $pf -u 18 -s 8192 -n $n" ;;
    esac
    run rxe_check "$set" "$dir" "$H -g $HGID -u 18" "$G -g 1 -u 18"
    local t
    for t in send write read; do
      o=; [ $t = read ] && o=$outs
      run "ib_${t}_bw" "$set" "$dir" "$H -x $HGID $pf $o -u 18 -s 8192 -n $n" "$G -x 1 $pf $o -u 18 -s 8192 -n $n"
    done
    for t in FETCH_AND_ADD CMP_AND_SWAP; do
      run "ib_atomic_bw:ib_atomic_bw_$t" "$set" "$dir" "$H -x $HGID $pf $outs -u 18 -A $t -n $n" \
          "$G -x 1 $pf $outs -u 18 -A $t -n $n"
    done
    for t in send write read; do
      o=; [ $t = read ] && o=$outs
      run "ib_${t}_lat" "$set" "$dir" "$H -x $HGID $pf $o -u 18 -s 2048 -n $n" "$G -x 1 $pf $o -u 18 -s 2048 -n $n"
    done
  done
  # tcpdump sees its signal when a packet comes: one to the discard port.
  sleep 0.5
  kill -TERM $tp
  hexec bash -c "echo > /dev/udp/$VM_GUEST/9"
  for _ in $(seq 50); do kill -0 $tp 2>/dev/null || break; sleep 0.1; done
  kill -KILL $tp 2>/dev/null; wait $tp 2>/dev/null
  local lost; lost=$(awk '/dropped by kernel/ {print $1}' "$RUN/$set.tcpdump")
  note "$set: tcpdump: $(grep -E 'captured|dropped by kernel' "$RUN/$set.tcpdump" | tr '\n' ' ')"
  rxe_stats >"$RUN/$set.after" || fail "rdma statistic"
  # The wire: dissected whole, every ICRC right, every packet the host sent
  # counted by rxe (it drops a packet with a bad ICRC uncounted).
  local malformed roce sent rcvd
  # (Not RPC over RDMA: its heuristic takes a SEND of 1 to 4 bytes for a
  # malformed one of its own.)
  local ts="tshark -n -r $cap --disable-protocol rpcordma"
  malformed=$($ts -Y '_ws.malformed' 2>/dev/null | wc -l)
  roce=$($ts -Y infiniband 2>/dev/null | wc -l)
  sent=$($ts -Y "infiniband && ip.src == $VM_HOST" 2>/dev/null | wc -l)
  note "$set: $roce RoCE packets captured, $malformed malformed"
  [ "$roce" -gt 0 ] || { failures=$((failures + 1)); echo "FAIL: $set: no RoCE packet on the wire"; }
  [ "$malformed" = 0 ] || { failures=$((failures + 1)); echo "FAIL: $set: $malformed malformed packets"; }
  python3 "$HERE/icrc_check.py" "$cap" || { failures=$((failures + 1)); echo "FAIL: $set: bad ICRCs"; }
  local c d
  for c in rcvd_pkts out_of_seq_request rcvd_seq_err duplicate_request completer_retry_err retry_exceeded_err send_err; do
    d=$(( $(stat_of "$RUN/$set.after" $c) - $(stat_of "$RUN/$set.before" $c) ))
    eval "d_$c=$d"
  done
  note "$set: rxe counted $d_rcvd_pkts packets, the capture has $sent the host sent (and lost $lost); out_of_seq_request +$d_out_of_seq_request rcvd_seq_err +$d_rcvd_seq_err duplicate_request +$d_duplicate_request completer_retry_err +$d_completer_retry_err retry_exceeded_err +$d_retry_exceeded_err send_err +$d_send_err"
  # rxe drops a packet with a bad ICRC (or any it cannot take) uncounted:
  # it must have counted every packet the host sent, as far as the capture
  # (which loses packets when the machine is busy) can tell.
  if [ "$d_rcvd_pkts" -lt "$sent" ] || [ "$d_rcvd_pkts" -gt $((sent + ${lost:-0})) ]; then
    failures=$((failures + 1)); echo "FAIL: $set: rxe counted $d_rcvd_pkts packets, the host sent $sent (+ up to $lost)"
  fi
  if [ "$d_out_of_seq_request" != 0 ] || [ "$d_retry_exceeded_err" != 0 ] || [ "$d_send_err" != 0 ] ||
     { [ "${set#*loss}" = "$set" ] && [ "$d_rcvd_seq_err" != 0 ]; }; then
    failures=$((failures + 1)); echo "FAIL: $set: rxe's counters show errors"
  fi
}

# The checker and the guest first: rxe against itself (loopback in the guest).
if vm_exec $TMO "${CHECK##*/} -d rxe0 -g 1 -p 7000 & sleep 1; ${CHECK##*/} -d rxe0 -g 1 -p 7000 $VM_GUEST && wait \$!" \
     >"$RUN/loopback.out" 2>&1; then
  note "rxe_check rxe against itself: $(grep -c PASS "$RUN/loopback.out") sides passed"
  printf '%-14s %-26s %-10s %-5s %s\n' mtu1500 rxe_check "rxe->rxe" ok "data checked (guest loopback)" >>"$TABLE"
else
  cat "$RUN/loopback.out"
  fail "rxe_check fails rxe against itself: the checker or the guest is broken"
fi

for mtu in $MTUS; do
  vm_set_mtu "$mtu" || fail "MTU $mtu"
  usrc_device
  note "MTU $mtu: usrc GID index $HGID, $(hexec "$USRC" exec -- ibv_devinfo -d rv0 | grep -o 'active_mtu.*')"
  one_set "mtu$mtu" "$mtu"
  if [ "$LOSS" != 0 ] && echo " $LOSS_MTUS " | grep -q " $mtu "; then
    hexec nft -f - <<NFT || fail "nft"
table inet rxvtloss {
  chain in {
    type filter hook input priority 0;
    ip saddr $VM_GUEST meta l4proto udp numgen random mod 100 < $LOSS counter drop
  }
}
NFT
    one_set "mtu$mtu-loss$LOSS" "$mtu"
    dropped=$(hexec nft list table inet rxvtloss | grep -o 'packets [0-9]*' | awk '{print $2}')
    hexec nft delete table inet rxvtloss
    note "nftables dropped $dropped of the guest's packets"
    [ "${dropped:-0}" -gt 0 ] || { failures=$((failures + 1)); echo "FAIL: no packet was dropped"; }
  fi
done

echo
printf '%-14s %-26s %-10s %-5s %s\n' set test 'client->' result value
cat "$TABLE"
rm -f "$TABLE"
echo "($(($(date +%s) - T0)) s; guest kernel $(cat "$CACHE/kver"), TCG unless KVM was usable)"
[ $failures = 0 ] || fail "$failures failures"
echo PASS
