#!/bin/bash
# Peers on the same host through the shared-memory ring: a stock
# ibv_rc_pingpong between two processes on lo moves its packets through
# shared memory, not the socket (a capture on lo sees none of them,
# doorbells at most), each context has a ring (an abstract socket where
# writers ask for it) while it is open and none after it exits, and no
# ring is a file under /dev/shm; with USRC_SHM=0 the same run is all on
# lo. Small RDMA WRITEs (ib_write_lat) are placed in the peer's memory. A
# context killed with SIGKILL takes its ring with it.
# Usage: shm_test.sh USRC_CLI PROVIDER_SO
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, capture)"; exit 77; }
need_tools tshark ibv_rc_pingpong ibv_devinfo
new_root
CAP=$(mktemp /tmp/usrc-shm.XXXXXX)
BASE=47000
trap 'kill $tpid $spid 2>/dev/null; "$USRC" link del sh0 >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$CAP" "$CAP".*' EXIT
tpid= spid=
"$USRC" link add sh0 netdev lo port $BASE || fail "link add"

# The rings of this device's contexts: their sockets, @usrc.UID.7f000001.PORT
rings() {
  ss -xlH | awk '{print $5}' | awk -F. -v uid="$(id -u)" -v lo=$((BASE + 1)) -v hi=$((BASE + 4095)) \
    '$1 == "@usrc" && $2 == uid && $3 == "7f000001" && $4 >= lo && $4 <= hi' | wc -l
}
[ "$(rings)" = 0 ] || fail "rings before any context: $(ss -xlH)"

FILTER="udp and dst portrange $((BASE + 1))-$((BASE + 4095))"
capture_stop() {   # sets IBA (packets captured, doorbells aside) and DOORBELLS (4 bytes)
  capture_end
  DOORBELLS=$(tshark -r "$CAP" -Y "udp.length == 12" 2>/dev/null | wc -l)
  IBA=$(tshark -r "$CAP" -Y "udp.length > 12" 2>/dev/null | wc -l)
}
counter() { "$USRC" stats sh0 | grep -o "$1 [0-9]*" | awk '{print $2}'; }   # counter NAME: its value
pingpong() {   # pingpong ITERS [env...]: both ends on sh0 (with $PP_ARGS), checks the rings meanwhile
  local n=$1; shift
  local port; port=$(pick_port)
  env "$@" timeout 60 "$USRC" exec -- ibv_rc_pingpong -d sh0 -n $n -s 64 ${PP_ARGS:-} -p $port >"$CAP.srv" 2>&1 &
  spid=$!
  wait_listen "" $port || { cat "$CAP.srv"; fail "server did not listen"; }
  RINGS_DURING=$(rings)
  env "$@" timeout 60 "$USRC" exec -- ibv_rc_pingpong -d sh0 -n $n -s 64 ${PP_ARGS:-} -p $port 127.0.0.1 >"$CAP.cli" 2>&1 ||
    { cat "$CAP.srv" "$CAP.cli"; fail "pingpong ($*)"; }
  wait $spid || { cat "$CAP.srv"; fail "pingpong server ($*)"; }
  spid=
  note "$(grep -h 'bytes in' "$CAP.cli")"
}

N=2000
capture_start "$FILTER"
pingpong $N
capture_stop; on_lo=$IBA
note "shared memory: $on_lo IBA packets on lo for $N round trips ($DOORBELLS doorbells); rings while the server waited: $RINGS_DURING"
[ "$RINGS_DURING" = 1 ] || fail "the waiting server should have one ring, saw $RINGS_DURING"
[ "$(rings)" = 0 ] || fail "rings left after both ends exited: $(ss -xlH)"
[ "$on_lo" = 0 ] || fail "$on_lo IBA packets on lo: the ring was not used for all"

capture_start "$FILTER"
pingpong $N USRC_SHM=0
capture_stop; on_lo=$IBA
note "USRC_SHM=0: $on_lo packets on lo; rings while the server waited: $RINGS_DURING"
[ "$RINGS_DURING" = 0 ] || fail "USRC_SHM=0 should create no ring"
[ "$on_lo" -ge $((2 * N)) ] || fail "USRC_SHM=0: only $on_lo packets on lo for $N round trips"

# Both ends waiting on completion events (-e): each side's progress thread
# sleeps between messages (no busy polling) and the other rings it awake
# (a doorbell per message). Never ringing at all fails the run. How many
# messages were resent is only noted: a doorbell missed would leave the
# message in the ring until the sender's retransmission timer (2 ms at
# least) resent it, but so does a wake-up that a loaded machine delays
# past that timer. That no doorbell is missed is shown without timing in
# tests/unit/test_transport_nics.cpp ("shm: ... doorbell").
resent=$(counter retransmits)
capture_start "$FILTER"
PP_ARGS=-e pingpong 500 USRC_BUSY_POLL_US=0
capture_stop
resent=$(( $(counter retransmits) - resent ))
note "events (-e): $DOORBELLS doorbells, $IBA IBA packets on lo, $resent resent for 500 round trips"
[ "$DOORBELLS" -gt 0 ] || fail "-e: no doorbell rung: the sleeping path was not taken"
[ "$IBA" = 0 ] || fail "-e: $IBA IBA packets on lo: the ring was not used for all"

# Small RDMA WRITEs go straight into the peer's memory (direct placement):
# stock ib_write_lat's WRITEs are counted as direct_writes, all of both
# sides', and none with USRC_DIRECT_WRITE=0.
direct_writes() { counter direct_writes; }
write_lat() {   # write_lat ITERS [env...]
  local n=$1; shift
  local port; port=$(pick_port)
  env "$@" timeout 60 "$USRC" exec -- ib_write_lat -d sh0 -s 2 -n $n -p $port -F >"$CAP.srv" 2>&1 &
  spid=$!
  wait_listen "" $port || { cat "$CAP.srv"; fail "ib_write_lat server did not listen"; }
  env "$@" timeout 60 "$USRC" exec -- ib_write_lat -d sh0 -s 2 -n $n -p $port -F 127.0.0.1 >"$CAP.cli" 2>&1 ||
    { cat "$CAP.srv" "$CAP.cli"; fail "ib_write_lat ($*)"; }
  wait $spid || { cat "$CAP.srv"; fail "ib_write_lat server ($*)"; }
  spid=
  note "ib_write_lat ${*:-(defaults)}: $(grep -E '^ *2 ' "$CAP.cli" | awk '{print "typical " $5 " us, average " $6 " us"}')"
}
if command -v ib_write_lat >/dev/null; then
  N=2000
  before=$(direct_writes)
  write_lat $N
  placed=$(( $(direct_writes) - before ))
  note "direct placement: $placed WRITEs placed for $N each way"
  [ "$placed" -ge $((2 * N)) ] || fail "only $placed of $((2 * N)) ib_write_lat WRITEs were placed"
  before=$(direct_writes)
  write_lat 200 USRC_DIRECT_WRITE=0
  [ "$(direct_writes)" = "$before" ] || fail "USRC_DIRECT_WRITE=0 still placed WRITEs"
else
  note "ib_write_lat not installed: direct placement not checked here"
fi

# Many QPs to one receiver (ib_write_bw -q 128): more than its ring holds
# is in flight at once. A full ring is back-pressure, not loss: no packet
# dropped (tx_errors), no transport error, every run completes.
if command -v ib_write_bw >/dev/null; then
  exact() { "$USRC" stats sh0 | grep -o " $1 [0-9]*" | awk '{print $2}'; }
  for run in 1 2 3; do
    e0=$(exact tx_errors) x0=$(exact retry_exceeded) t0=$(exact timeouts)
    port=$(pick_port)
    timeout 120 "$USRC" exec -- ib_write_bw -d sh0 -q 128 -N -n 100 -F -p $port >"$CAP.srv" 2>&1 &
    spid=$!
    wait_listen "" $port || { cat "$CAP.srv"; fail "ib_write_bw -q 128 server did not listen"; }
    timeout 120 "$USRC" exec -- ib_write_bw -d sh0 -q 128 -N -n 100 -F -p $port 127.0.0.1 >"$CAP.cli" 2>&1 ||
      { cat "$CAP.srv" "$CAP.cli"; fail "ib_write_bw -q 128, run $run"; }
    wait $spid || { cat "$CAP.srv"; fail "ib_write_bw -q 128 server, run $run"; }
    spid=
    drops=$(( $(exact tx_errors) - e0 )) exceeded=$(( $(exact retry_exceeded) - x0 ))
    note "ib_write_bw -q 128, run $run: $(awk '$1 ~ /^[0-9]+$/ {print $4 " MB/s"}' "$CAP.cli"), $drops dropped, $(( $(exact timeouts) - t0 )) ACK timeouts"
    [ "$drops" = 0 ] || fail "ib_write_bw -q 128: $drops packets dropped on a full ring"
    [ "$exceeded" = 0 ] || fail "ib_write_bw -q 128: retry exceeded"
  done
fi

# A context killed outright takes its ring with it (no file to remove).
port=$(pick_port)
timeout 60 "$USRC" exec -- ibv_rc_pingpong -d sh0 -p $port >/dev/null 2>&1 &
spid=$!
wait_listen "" $port || fail "server did not listen"
[ "$(rings)" = 1 ] || fail "no ring for the waiting server"
victim=$(pgrep -P $spid)   # timeout's child: `usrc exec` became ibv_rc_pingpong
[ -n "$victim" ] || fail "no server process under timeout"
# Its ring is a memfd, not a file anyone could open by name.
grep -q 'memfd:usrc-ring' /proc/$victim/maps || fail "the server maps no memfd ring"
! grep -q '/dev/shm/' /proc/$victim/maps || fail "the server maps files in /dev/shm: $(grep /dev/shm/ /proc/$victim/maps)"
kill -KILL $victim
wait $spid 2>/dev/null; spid=
[ "$(rings)" = 0 ] || fail "a killed context's ring is still there: $(ss -xlH)"
note "a killed context's ring went with it"
echo "PASS"
