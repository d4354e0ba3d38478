#!/bin/bash
# Writes FILE.expected for every trace: what tshark's InfiniBand dissector
# reads in each RoCE v2 packet, one CSV line per packet after a header line
# naming the fields (fields.txt). The wire tests compare our parser with
# these, so tshark need not be installed to run them; when it is, the
# wire_rxe_traces_live test runs the same command and compares live.
set -e
cd "$(dirname "$0")"
args=()
while read -r f; do args+=(-e "$f"); done < fields.txt
for f in *.pcap; do
  tshark -n -r "$f" -Y 'udp.dstport == 4791' -T fields -E header=y -E separator=, \
    -E occurrence=f "${args[@]}" 2>/dev/null > "${f%.pcap}.expected"
done
