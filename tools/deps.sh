#!/bin/bash
# Installs what usrc needs to build and test, from Debian 12 packages.
set -euo pipefail
PKGS="cmake g++ make pkg-config libibverbs-dev ibverbs-utils perftest qperf catch2 libspdlog-dev
      libcli11-dev nlohmann-json3-dev zlib1g-dev libisal-dev libmnl-dev tshark nftables iproute2 python3
      libpcap-dev"
# NIC backends: libfabric (ofi), AF_XDP (xdp: libxdp and libbpf, clang for
# its XDP program).
PKGS="$PKGS libfabric-dev libfabric-bin libxdp-dev libbpf-dev clang"
# Benchmark comparison tools (perftest-configs/bench.sh): raw UDP ping-pong,
# libfabric's rxd/tcp pingpong, plots, per-process CPU time, a CPU hog (the
# contended runs; the suite once under load).
PKGS="$PKGS sockperf gnuplot-nox time stress-ng"
# Middleware over usrc (tests/integration/ucx_test.sh, mpi_test.sh): UCX's
# tools, Open MPI and MPICH (both on UCX).
PKGS="$PKGS ucx-utils openmpi-bin libopenmpi-dev mpich libmpich-dev"
# librdmacm's programs (tests/integration/rdmacm_test.sh).
PKGS="$PKGS rdmacm-utils"
# The rxe interop test (tests/interop/): QEMU, an initramfs of busybox and
# the host's programs, the rxe provider, captures on the guest's tap. Its
# kernel is Debian's own, fetched with `apt-get download`.
PKGS="$PKGS qemu-system-x86 busybox-static cpio kmod ibverbs-providers tcpdump"
# Packaging (tests/packaging/package_test.sh): the .deb and the .rpm.
PKGS="$PKGS debhelper dpkg-dev fakeroot lintian rpm"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || { echo "usrc: need root to install: $missing" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing
fi
