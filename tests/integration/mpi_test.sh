#!/bin/bash
# MPI over usrc between two network namespaces: Open MPI (pml ucx) and
# MPICH (ch4:ucx), each running mpi_check.c (a data-checked ping-pong of
# 1 B to 1 MiB and an allreduce) with one rank per namespace, UCX held to
# usrc's transports; the counters show the traffic went through usrc. The
# launchers reach the second namespace through an rsh agent (this script,
# as "agent"). Skips an MPI that is not installed.
# Usage: mpi_test.sh USRC_CLI PROVIDER_SO
if [ "${1:-}" = agent ]; then
  # agent [-opts] HOST CMD...: CMD in the namespace that has HOST's address.
  shift
  while [ "${1#-}" != "$1" ]; do shift; done
  host=$1; shift
  for ns in $(ip netns list | awk '{print $1}'); do
    ip -n "$ns" -4 addr show | grep -q "inet $host/" && exec ip netns exec "$ns" sh -c "$*"
  done
  echo "agent: no namespace has $host" >&2; exit 1
fi
USRC=$1 USRC_PROVIDER=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (usrc link add, namespaces)"; exit 77; }
command -v mpicc.openmpi >/dev/null || command -v mpicc.mpich >/dev/null || { echo "no MPI installed"; exit 77; }
A=mpA$$ B=mpB$$
new_root
WORK=$(mktemp -d /tmp/usrc-mpi.XXXXXX)
chmod 755 "$WORK"
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$USRC_ROOT" "$WORK"; }
trap cleanup EXIT
AGENT="$WORK/agent"
printf '#!/bin/sh\nexec bash %q agent "$@"\n' "$(readlink -f "$0")" >"$AGENT"
chmod +x "$AGENT"
veth_pair $A $B mpa$$ mpb$$ 10.206.0
ip netns exec $A "$USRC" link add mpa netdev mpa$$ port 52000 || fail "link add A"
ip netns exec $B "$USRC" link add mpb netdev mpb$$ port 52000 || fail "link add B"
tx_of() { "$USRC" stats "$1" | awk '{for (i = 1; i < NF; i++) if ($i == "tx_packets") print $(i + 1)}'; }
# run NAME LAUNCHER...: the launcher in A starts one rank here, one in B.
run() {
  local name=$1; shift
  local before; before=$(tx_of mpb)
  ip netns exec $A timeout 300 "$USRC" exec -- env UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=mpa:1,mpb:1 \
    "$@" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name"; }
  grep -q "mpi_check: data ok" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name: no data check"; }
  local after; after=$(tx_of mpb)
  [ "$after" -gt $((before + 1000)) ] || fail "$name: the rank in B sent $((after - before)) packets through usrc"
  note "$name: $(grep -h 'mpi_check:' "$WORK/$name.log") (usrc packets sent from B: $((after - before)))"
}
SRC="$(dirname "$0")/mpi_check.c"
if command -v mpicc.openmpi >/dev/null; then
  mpicc.openmpi -O2 -o "$WORK/check_ompi" "$SRC" || fail "mpicc.openmpi"
  run "Open MPI pml ucx" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun.openmpi -np 2 \
    --host 10.206.0.1,10.206.0.2 --mca plm_rsh_agent "$AGENT" --mca pml ucx --mca btl self \
    -x UCX_TLS -x UCX_NET_DEVICES "$WORK/check_ompi"
fi
if command -v mpicc.mpich >/dev/null; then
  mpicc.mpich -O2 -o "$WORK/check_mpich" "$SRC" || fail "mpicc.mpich"
  run "MPICH ch4:ucx" mpiexec.mpich -launcher ssh -launcher-exec "$AGENT" -hosts 10.206.0.1,10.206.0.2 -n 2 \
    "$WORK/check_mpich"
fi
echo PASS
