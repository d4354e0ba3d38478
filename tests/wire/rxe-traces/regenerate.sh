#!/bin/bash
# Writes FILE.expected for every trace: what tshark's InfiniBand dissector
# reads in each RoCE v2 packet, one CSV line per packet. The wire tests
# compare our parser with these (tshark need not be installed to run them).
cd "$(dirname "$0")"
for f in *.pcap; do
  tshark -r "$f" -Y 'udp.dstport == 4791' -T fields -E separator=, -E occurrence=f \
    -e frame.number -e infiniband.bth.opcode -e infiniband.bth.psn -e infiniband.bth.destqp \
    -e infiniband.bth.a -e infiniband.bth.se -e infiniband.bth.padcnt -e infiniband.bth.p_key \
    -e infiniband.aeth.syndrome -e infiniband.aeth.msn \
    -e infiniband.reth.va -e infiniband.reth.r_key -e infiniband.reth.dmalen \
    -e infiniband.atomiceth.swapdt -e infiniband.atomiceth.cmpdt \
    -e infiniband.atomicacketh.origremdt -e infiniband.immdt \
    -e infiniband.deth.q_key -e infiniband.deth.srcqp -e infiniband.invariant.crc \
    > "${f%.pcap}.expected"
done
