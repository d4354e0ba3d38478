# Sourced by bench.sh and bench-net.sh: where the tools are, and what must
# be installed.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool() {   # the build tree's binary, else PATH
  local b=$HERE/build/tools/$1/$1
  if [ -x "$b" ]; then echo "$b"; else command -v "$1"; fi
}
# need_debs CMD:PACKAGE...: exits 2 naming the packages of the missing commands;
# then root.
need_debs() {
  local t missing=
  for t; do command -v "${t%%:*}" >/dev/null || missing="$missing ${t#*:}"; done
  [ -z "$missing" ] || { echo "bench: missing Debian packages:$missing (tools/deps.sh installs them)" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "bench: needs root (usrc devices, network namespaces)" >&2; exit 2; }
}
