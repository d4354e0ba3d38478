#!/bin/bash
# The main job, on a fresh Debian 12 machine, as root: build and install
# usrc, create a soft device on loopback, and run the stock ibv_rc_pingpong
# server and client across it.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/opt/usrc}
tools/deps.sh
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DUSRC_BUILD_TESTS=OFF >/dev/null
cmake --build build-demo -j2
cmake --install build-demo --prefix "$PREFIX" >/dev/null
"$PREFIX/bin/usrc" link del usrc0 >/dev/null 2>&1 || true
"$PREFIX/bin/usrc" link add usrc0 netdev lo
"$PREFIX/bin/usrc" link show
"$PREFIX/bin/usrc" exec -- ibv_devinfo -d usrc0 -v
"$PREFIX/bin/usrc" exec -- ibv_rc_pingpong -d usrc0 &
sleep 1
"$PREFIX/bin/usrc" exec -- ibv_rc_pingpong -d usrc0 127.0.0.1
wait
"$PREFIX/bin/usrc" stats usrc0
