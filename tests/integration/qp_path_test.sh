#!/bin/bash
# The QP's path attributes in the packets' IP and UDP headers, checked on a
# capture of loopback: GRH traffic class -> IP TOS, hop limit -> TTL, flow
# label -> UDP source port 0xC000 | (label & 0x3FFF); without a GRH (IB link
# layer) the SL is the DSCP; packets are segmented to the path MTU.
# Usage: qp_path_test.sh USRC_CLI PROVIDER_SO VERBS_TESTS
USRC=$1 USRC_PROVIDER=$2 PROG=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "needs root (capture, usrc link add)"; exit 77; }
command -v tshark >/dev/null || { echo "tshark not installed"; exit 77; }
new_root
CAP=$(mktemp /tmp/usrc-path.XXXXXX.pcap)
trap 'kill $tpid 2>/dev/null; "$USRC" link del ph_ib >/dev/null 2>&1; "$USRC" link del ph_roce >/dev/null 2>&1; rm -rf "$USRC_ROOT" "$CAP" "$CAP.log"' EXIT
"$USRC" link add ph_ib netdev lo port 37000 || fail "link add"
"$USRC" link add ph_roce netdev lo type roce port 41200 || fail "link add roce"

check() {   # check DEV PORT: run the path traffic on DEV under a capture
  local dev=$1 port=$2
  capture_start "udp and dst portrange $((port + 1))-$((port + 4095))"
  # A capture on lo shows a UDP GSO send as one large packet (a NIC or the
  # receiving socket splits it), so the datagrams are checked without GSO.
  USRC_SHM=0 USRC_GSO=1 USRC_TEST_DEV=$dev timeout 60 "$USRC" exec -- "$PROG" "[.path]" || fail "$dev: path traffic"
  capture_end
  rows=$(tshark -r "$CAP" -T fields -e ip.dsfield -e ip.ttl -e udp.srcport 2>/dev/null | sort | uniq -c)
  echo "$rows"
  # Requests with the GRH: TOS 0x68, TTL 7, source port 0xE345 (58181).
  echo "$rows" | grep -qE '0x68\s+7\s+58181$' || fail "$dev: GRH fields not on the wire"
  # Path MTU 1024: no datagram above 8 (UDP) + 12 (BTH) + 1024 + 4 (ICRC).
  max=$(tshark -r "$CAP" -T fields -e udp.length 2>/dev/null | sort -n | tail -1)
  [ "$max" = 1048 ] || fail "$dev: largest datagram $max, expected 1048 (path MTU 1024)"
}
check ph_ib 37000
# Without a GRH: DSCP 5 (TOS 0x14) from SL 5, default TTL, the QP's own port.
echo "$rows" | grep -qE '0x14\s+64\s+(3[7-9]|4[01])[0-9]{3}$' || fail "ph_ib: SL not on the wire as DSCP"
check ph_roce 41200
echo PASS
