#!/bin/bash
# The unit, wire and verbs suites and a stock ibv_rc_pingpong under
# AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer: any
# report fails the run. Each sanitizer has its own build directory
# (build-asan, build-tsan; -DUSRC_SANITIZE) and builds only what runs here.
# The verbs suite and the pingpong need root (usrc link add); without it
# they are skipped.
# Usage: tests/sanitize.sh [asan] [tsan]   (default: both)
# Environment: JOBS (build jobs, 2), CMAKE_CXX_COMPILER_LAUNCHER (ccache),
# UNIT_ARGS (a Catch2 test spec for unit_tests).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
kinds=${*:-asan tsan}
root=false
[ "$(id -u)" = 0 ] && root=true
fail() { echo "sanitize: FAIL: $*" >&2; exit 1; }
note() { echo "--- sanitize: $*"; }

# A run fails on its exit status, and on any report in its output should a
# sanitizer have let it exit 0 anyway.
LOG=$(mktemp /tmp/usrc-san.XXXXXX)
ROOTDIR=
cleanup() {
  if [ -n "$ROOTDIR" ]; then
    USRC_ROOT=$ROOTDIR "$CLI" link del san0 >/dev/null 2>&1 || true
    rm -rf "$ROOTDIR"
  fi
  rm -f "$LOG" "$LOG".*
}
trap cleanup EXIT
check() {   # check NAME LOGFILE STATUS
  if [ "$3" != 0 ] || grep -Eq 'ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: ' "$2"; then
    cat "$2"
    fail "$1 (exit $3)"
  fi
}
run() {   # run NAME CMD...: runs, keeping its output for check
  local name=$1 rc=0 t0=$SECONDS; shift
  "$@" >"$LOG" 2>&1 || rc=$?
  check "$name" "$LOG" $rc
  note "$name: clean ($((SECONDS - t0)) s)"
}

for kind in $kinds; do
  t_kind=$SECONDS
  case $kind in
    asan)
      flags=address,undefined
      PORT=36000
      UNIT_DEFAULT= VERBS_DEFAULT=
      RUNTIME=$(gcc -print-file-name=libasan.so)
      # The provider is preloaded ahead of the runtime into programs that
      # are not instrumented (usrc exec puts it first): the runtime still
      # interposes malloc and the rest, it just is not first in the list.
      export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:verify_asan_link_order=0:detect_stack_use_after_return=1
      export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
      ;;
    tsan)
      flags=thread
      PORT=38000
      # The guarded copies (common/guard.h) leave a SIGSEGV raised inside
      # a copy by a jump out of the handler: under TSan the process dies of
      # that SIGSEGV instead. Their unit tests run under ASan and in the
      # normal suite; the verbs suite's tests on unmapped memory ([unmapped])
      # likewise.
      UNIT_DEFAULT='~[guard]'
      VERBS_DEFAULT='~[unmapped]~[.]'   # (~[.]: hidden tests stay out, as without a spec)
      RUNTIME=$(gcc -print-file-name=libtsan.so)
      export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SRC/tests/tsan.supp"
      ;;
    *) fail "unknown sanitizer '$kind' (asan, tsan)" ;;
  esac
  [ -e "$RUNTIME" ] || fail "no $RUNTIME (the compiler's sanitizer runtime)"
  B=build-$kind
  note "$kind: building in $B"
  # -O1 -g1: less to compile than -O2 -g; line numbers kept for the reports.
  cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DUSRC_SANITIZE=$flags \
    ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} >/dev/null
  cmake --build $B -j"${JOBS:-2}" --target usrc usrc-rdmav34 unit_tests wire_tests verbs_tests >"$LOG.build" 2>&1 ||
    { tail -50 "$LOG.build"; fail "$kind build"; }
  note "$kind: built ($((SECONDS - t_kind)) s)"
  CLI=$SRC/$B/tools/usrc/usrc
  export USRC_PROVIDER=$SRC/$B/providers/usrc/libusrc-rdmav34.so

  # (UNIT_ARGS: Catch2 arguments, a test spec to narrow the unit tests.)
  unit_args=${UNIT_ARGS:-$UNIT_DEFAULT}
  run "$kind unit_tests" $B/tests/unit/unit_tests ${unit_args:+"$unit_args"}
  # (The live-tshark conformance test is the normal suite's.)
  run "$kind wire_tests" $B/tests/wire/wire_tests '~[rxe-live]'

  if ! $root; then
    note "$kind: not root: the verbs suite and the pingpong skipped"
    continue
  fi
  ROOTDIR=$(mktemp -d /tmp/usrc-san-root.XXXXXX)
  chmod 755 "$ROOTDIR"
  export USRC_ROOT=$ROOTDIR
  "$CLI" link add san0 netdev lo port $PORT >/dev/null || fail "link add"
  # Instrumented itself: the runtime comes with the program.
  run "$kind verbs suite" env USRC_TEST_DEV=san0 USRC_TEST_PORT=$PORT USRC_TEST_PLACED=1 \
    timeout 600 "$CLI" exec -- $B/tests/verbs/verbs_tests ${VERBS_DEFAULT:+"$VERBS_DEFAULT"}
  # The stock program: the runtime preloaded along with the provider.
  port=$((20000 + RANDOM % 5000))
  LD_PRELOAD=$RUNTIME timeout 120 "$CLI" exec -- ibv_rc_pingpong -d san0 -p $port -n 1000 -c >"$LOG.srv" 2>&1 &
  spid=$!
  for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
  crc=0
  LD_PRELOAD=$RUNTIME timeout 120 "$CLI" exec -- ibv_rc_pingpong -d san0 -p $port -n 1000 -c 127.0.0.1 >"$LOG" 2>&1 || crc=$?
  src=0
  wait $spid || src=$?
  check "$kind ibv_rc_pingpong server" "$LOG.srv" $src
  check "$kind ibv_rc_pingpong client" "$LOG" $crc
  grep -q "bytes in" "$LOG" || { cat "$LOG"; fail "$kind pingpong: no result"; }
  note "$kind ibv_rc_pingpong: clean"
  "$CLI" link del san0 >/dev/null
  rm -rf "$ROOTDIR"
  ROOTDIR=
  unset USRC_ROOT
  note "$kind: done in $((SECONDS - t_kind)) s"
done
echo PASS
