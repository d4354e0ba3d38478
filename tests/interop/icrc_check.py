#!/usr/bin/env python3
"""Checks the ICRC of every RoCE v2 packet (IPv4, UDP to port 4791) of a
pcap file (Ethernet link type), as IBA Annex A17 (RoCE v2) defines it: a
CRC-32 over 8 bytes of ones, the IPv4 header with TOS, TTL and the header
checksum as ones, the UDP header with its checksum as ones, the BTH with its
reserved byte after the P_Key (the FECN/BECN byte) as ones, and the rest of
the packet up to the ICRC, which follows little-endian.

  icrc_check.py FILE.pcap [PORT]   prints, per source address, the packets
                                   checked and the bad ones; exit 1 if any is bad
"""
import struct
import sys
import zlib


def packets(path):
    with open(path, 'rb') as f:
        data = f.read()
    magic = struct.unpack('<I', data[:4])[0]
    if magic in (0xa1b2c3d4, 0xa1b23c4d):
        end = '<'
    elif magic in (0xd4c3b2a1, 0x4d3cb2a1):
        end = '>'
    else:
        sys.exit(f'{path}: not a pcap file (tcpdump -w writes one)')
    if struct.unpack(end + 'I', data[20:24])[0] != 1:
        sys.exit(f'{path}: not an Ethernet capture')
    off, n = 24, 0
    while off + 16 <= len(data):
        incl = struct.unpack(end + 'I', data[off + 8:off + 12])[0]
        n += 1
        yield n, data[off + 16:off + 16 + incl]
        off += 16 + incl


def main():
    path = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 4791
    good, bad = {}, {}
    for n, frame in packets(path):
        if len(frame) < 14 + 20 + 8 or frame[12:14] != b'\x08\x00':
            continue
        ip = frame[14:]
        ihl = (ip[0] & 15) * 4
        total = struct.unpack('>H', ip[2:4])[0]
        if ip[9] != 17 or total > len(ip) or total < ihl + 8 + 12 + 4:
            continue
        udp = ip[ihl:total]
        if struct.unpack('>H', udp[2:4])[0] != port:
            continue
        src = '.'.join(str(b) for b in ip[12:16])
        hdr = bytearray(ip[:ihl])
        hdr[1] = 0xff                 # TOS
        hdr[8] = 0xff                 # TTL
        hdr[10:12] = b'\xff\xff'      # header checksum
        u = bytearray(udp[:8])
        u[6:8] = b'\xff\xff'          # UDP checksum
        bth = bytearray(udp[8:20])
        bth[4] = 0xff                 # FECN, BECN, reserved
        body = bytes(hdr) + bytes(u) + bytes(bth) + udp[20:-4]
        want = zlib.crc32(body, zlib.crc32(b'\xff' * 8)) & 0xffffffff
        got = struct.unpack('<I', udp[-4:])[0]
        if got == want:
            good[src] = good.get(src, 0) + 1
        else:
            bad.setdefault(src, []).append(n)
    for src in sorted(set(good) | set(bad)):
        b = bad.get(src, [])
        print(f'icrc: from {src}: {good.get(src, 0) + len(b)} packets, {len(b)} bad'
              + (f' (frames {b[:10]})' if b else ''))
    if not good and not bad:
        print(f'icrc: no RoCE v2 packet (UDP port {port}) in {path}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
