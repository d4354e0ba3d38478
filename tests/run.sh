#!/bin/bash
# Installs the dependencies, builds, and runs the whole test suite (as root:
# the integration tests create devices, namespaces and veth pairs).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
ctest --test-dir build --output-on-failure -j1 --timeout 600
# CI only (it installs and purges the usrc package, machine-wide): build the
# .deb and the .rpm, lintian, pingpong against the installed package.
if [ "${CI:-}" = true ]; then
  tests/packaging/package_test.sh
  # The unit, wire and verbs suites and a stock pingpong under ASan+UBSan
  # and under TSan (their own build directories).
  tests/sanitize.sh
fi
