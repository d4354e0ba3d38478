#!/bin/bash
# Builds the Debian and RPM packages from this tree, checks the .deb with
# lintian, installs it, runs the stock ibv_rc_pingpong over a usrc0 device
# made by the installed CLI (the system-wide way: driver file + SYSFS_PATH,
# and `usrc exec`), then purges the package. Needs root; installing touches
# the whole machine, so tests/run.sh runs it only when CI=true.
#
# The RPM is built with `rpmbuild --nodeps`: on Debian its BuildRequires
# (libibverbs-devel, ...) name RPM packages that dpkg provides under other
# names, so rpm cannot check them.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
[ "$(id -u)" = 0 ] || { echo "package_test: needs root"; exit 77; }
if dpkg -s usrc >/dev/null 2>&1; then echo "package_test: usrc is already installed; not touching it"; exit 1; fi
VERSION=$(dpkg-parsechangelog -l debian/changelog -S Version)
WORK=$(mktemp -d /tmp/usrc-pkg.XXXXXX)
ROOT=$(mktemp -d /tmp/usrc-pkgroot.XXXXXX); chmod 755 "$ROOT"
installed=0
cleanup() {
  local rc=$?
  if [ $installed = 1 ]; then
    USRC_ROOT=$ROOT usrc link del usrc0 >/dev/null 2>&1
    apt-get purge -y -qq usrc >/dev/null 2>&1
  fi
  [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null
  rm -rf "$WORK" "$ROOT"
  exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "--- $*"; }

# A clean copy of the tracked files (with uncommitted edits), no build dirs.
mkdir "$WORK/usrc-$VERSION"
git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$WORK/usrc-$VERSION"

note "dpkg-buildpackage"
(cd "$WORK/usrc-$VERSION" && nice -n 10 dpkg-buildpackage -us -uc -b -j2 >"$WORK/deb.log" 2>&1) ||
  { tail -40 "$WORK/deb.log"; fail "dpkg-buildpackage"; }
DEB=$(ls "$WORK"/usrc_"$VERSION"_*.deb)
dpkg-deb -c "$DEB"
note "lintian"
lintian --fail-on error "$DEB" || fail "lintian errors"

note "rpmbuild"
mkdir -p "$WORK/rpm/SOURCES"
tar -czf "$WORK/rpm/SOURCES/usrc-$VERSION.tar.gz" -C "$WORK" --exclude=obj-\* --exclude=debian/.debhelper \
  "usrc-$VERSION"
nice -n 10 rpmbuild -bb --nodeps --define "_topdir $WORK/rpm" --define 'debug_package %{nil}' \
  redhat/usrc.spec >"$WORK/rpm.log" 2>&1 || { tail -40 "$WORK/rpm.log"; fail "rpmbuild"; }
RPM=$(ls "$WORK"/rpm/RPMS/*/usrc-"$VERSION"-*.rpm)
rpm -qlp "$RPM"
rpm -qlp "$RPM" | grep -q '/libibverbs/libusrc-rdmav34.so$' || fail "rpm: provider"

note "install"
installed=1
apt-get install -y -qq "$DEB" >/dev/null || fail "install"
LIBDIR=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)
[ -f "$LIBDIR/libibverbs/libusrc-rdmav34.so" ] || fail "provider not in libibverbs' directory"
[ -f /etc/libibverbs.d/usrc.driver ] || fail "driver file"
[ -f /etc/usrc/links.conf ] || fail "links.conf"
systemctl cat usrc.service >/dev/null 2>&1 || [ -f /lib/systemd/system/usrc.service ] || fail "usrc.service"
systemctl cat usrc-sa.service >/dev/null 2>&1 || [ -f /lib/systemd/system/usrc-sa.service ] || fail "usrc-sa.service"
[ -f /etc/usrc/sa.conf ] || fail "sa.conf"
man -w usrc.7 >/dev/null 2>&1 || [ -f /usr/share/man/man7/usrc.7.gz ] || fail "usrc(7)"

export USRC_ROOT=$ROOT
usrc link add usrc0 netdev lo port 36000 || fail "link add"
SYSFS_PATH=$ROOT/sys ibv_devices | grep -q usrc0 || fail "ibv_devices (driver file, no preload)"

pingpong() {   # pingpong PORT 'PINGPONG OPTIONS' -- COMMAND PREFIX...
  local port=$1 opts=$2; shift 3
  # shellcheck disable=SC2086
  timeout 60 "$@" ibv_rc_pingpong -d usrc0 $opts -p "$port" >"$WORK/srv" 2>&1 & spid=$!
  for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
  # shellcheck disable=SC2086
  timeout 60 "$@" ibv_rc_pingpong -d usrc0 $opts -p "$port" 127.0.0.1 >"$WORK/cli" 2>&1 ||
    { cat "$WORK/srv" "$WORK/cli"; fail "pingpong client: $*"; }
  wait $spid || { cat "$WORK/srv"; fail "pingpong server: $*"; }
  spid=
  grep -q 'iters in' "$WORK/cli" || fail "pingpong output"
}
note "ibv_rc_pingpong, SYSFS_PATH only"
pingpong 37001 "" -- env SYSFS_PATH="$ROOT/sys"
note "ibv_rc_pingpong through the installed usrc exec"
pingpong 37002 "" -- usrc exec --
note "ibv_rc_pingpong -e through the installed usrc exec"
pingpong 37003 -e -- usrc exec --
usrc link del usrc0 || fail "link del"

note "purge"
apt-get purge -y -qq usrc >/dev/null || fail "purge"
installed=0
[ ! -e "$LIBDIR/libibverbs/libusrc-rdmav34.so" ] && [ ! -e /etc/libibverbs.d/usrc.driver ] &&
  [ ! -e /usr/bin/usrc ] && [ ! -e /etc/usrc ] || fail "files left after purge"
echo "package_test: ok"
