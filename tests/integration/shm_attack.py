#!/usr/bin/env python3
"""A process of the target's user that may not ptrace it tries to get or
write its shared-memory ring, every way it knows:
  ring files   /dev/shm files the target maps (the old scheme): open, map,
               publish a slot;
  sockets      the target's ring sockets: connect, answer the challenge
               (the nonce cannot be read, so a guess), hope for the ring;
  fds          /proc/PID/fd/N of the target: open them.
Usage: shm_attack.py PID [--files F...] [--sockets S...]
Exit 0: everything refused; 1: the ring was obtained or written (printed)."""
import ctypes
import mmap
import os
import socket
import struct
import sys

pid = int(sys.argv[1])
files, socks, mode = [], [], None
for a in sys.argv[2:]:
    if a in ("--files", "--sockets"):
        mode = a
    elif mode == "--files":
        files.append(a)
    elif mode == "--sockets":
        socks.append(a)

won = []
libc = ctypes.CDLL(None, use_errno=True)


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


# 1. The ring files (the old scheme): map one and publish a slot into it.
SLOTS, SLOT_SIZE, SLOTS_AT, TAIL_AT = 2048, 4416, 192, 64
for f in files:
    try:
        fd = os.open(f, os.O_RDWR)
    except OSError as e:
        print(f"ring file {f}: refused ({e.strerror})")
        continue
    try:
        m = mmap.mmap(fd, 0)
        tail = struct.unpack_from("<Q", m, TAIL_AT)[0]
        idx = tail % SLOTS
        slot = SLOTS_AT + idx * SLOT_SIZE
        payload = b"forged by another process"
        struct.pack_into("<Q", m, TAIL_AT, tail + 1)
        struct.pack_into("<iIIHH", m, slot + 8, os.getpid(), len(payload), 0x7F000001, 4791, 0)
        m[slot + 24:slot + 24 + len(payload)] = payload
        struct.pack_into("<Q", m, slot, (tail + 1 - idx) % (1 << 64))
        won.append(f"published a slot in ring file {f}")
    except Exception as e:  # noqa: BLE001 (any failure is a refusal)
        print(f"ring file {f}: opened, not written ({e})")
        won.append(f"opened ring file {f}")
    os.close(fd)

# 2. The ring sockets: the handshake, with a guess for the nonce.
for name in socks:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(3)
    try:
        s.connect("\0" + name)
        # The bell a writer rings on the owner's UDP socket (it may sleep).
        _, _, iphex, uport = name.split(".")
        ip = socket.inet_ntoa(struct.pack(">I", int(iphex, 16)))
        bell = lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"ushs", (ip, int(uport)))
        bell()
        ch = s.recv(64)
        magic, addr = struct.unpack("<QQ", ch[:16])
        buf = ctypes.create_string_buffer(16)
        local, remote = Iovec(ctypes.addressof(buf), 16), Iovec(addr, 16)
        n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n == 16:
            won.append(f"{name}: read the owner's nonce")
        else:
            print(f"{name}: process_vm_readv refused ({os.strerror(ctypes.get_errno())})")
        s.send(struct.pack("<Q", magic) + buf.raw)
        bell()
        msg, anc, _, _ = s.recvmsg(64, socket.CMSG_SPACE(8 * 4))
        got = [a for a in anc if a[0] == socket.SOL_SOCKET and a[1] == socket.SCM_RIGHTS]
        if got:
            won.append(f"{name}: was given file descriptors")
        else:
            print(f"{name}: refused (no ring given)")
    except (OSError, struct.error) as e:
        print(f"{name}: refused ({e})")
    s.close()

# 3. The target's open files.
try:
    fds = os.listdir(f"/proc/{pid}/fd")
except OSError as e:
    fds = []
    print(f"/proc/{pid}/fd: refused ({e.strerror})")
for n in fds:
    p = f"/proc/{pid}/fd/{n}"
    try:
        fd = os.open(p, os.O_RDWR)
        os.close(fd)
        won.append(f"opened {p}")
    except OSError:
        pass

for w in won:
    print("ATTACK:", w)
sys.exit(1 if won else 0)
