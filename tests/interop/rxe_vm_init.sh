#!/bin/sh
# /init of the rxe interop guest (busybox sh, see rxe_vm.sh): mounts, the
# modules, eth0 from the kernel command line (rxevm.ip=A.B.C.D/NN
# rxevm.mtu=N), an rdma_rxe device rxe0 on it, then the command agent:
# every /share/q/ID.cmd (virtio-9p, the host's directory) runs in its own
# process group, killed whole after ID.timeout seconds; its output goes to
# ID.out and its exit status to ID.rc; an ID.kill file kills it at once.
# The host's programs are in /opt/bin (called by path where busybox has an
# applet of the same name: its sh runs applets first).
export PATH=/opt/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /tmp /run /share
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
say() { echo "rxevm: $*" >/dev/ttyS0; }
for m in $(cat /etc/rxevm/modules); do modprobe "$m" || say "modprobe $m failed"; done
IP= MTU=1500
for kv in $(cat /proc/cmdline); do
  case "$kv" in
    rxevm.ip=*) IP=${kv#*=} ;;
    rxevm.mtu=*) MTU=${kv#*=} ;;
  esac
done
IPR=/opt/bin/ip
$IPR link set lo up
$IPR link set eth0 mtu "$MTU" up
$IPR addr add "$IP" dev eth0
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share || { say "FAILED: 9p"; exit 1; }
mkdir -p /share/q
# The IPv4 address first, so that it is GID 1 (GID 0: the link-local one).
/opt/bin/rdma link add rxe0 type rxe netdev eth0 || say "FAILED: rdma link add"
i=0
while [ $i -lt 300 ]; do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
    grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null && break
  usleep 100000; i=$((i + 1))
done
say "READY $(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null) uptime $(cut -d' ' -f1 /proc/uptime)"

run() {
  to=$(($(cat "$1.timeout" 2>/dev/null || echo 120) * 5))
  cd /tmp
  setsid sh "$1.run" >"$1.out" 2>&1 </dev/null &
  pid=$!
  ( i=0
    while [ $i -lt "$to" ] && kill -0 $pid 2>/dev/null && [ ! -e "$1.kill" ]; do usleep 200000; i=$((i + 1)); done
    kill -0 $pid 2>/dev/null && { echo "rxevm: killed after $((i / 5)) s" >>"$1.out"; kill -KILL -$pid; } ) &
  wait $pid
  echo $? >"$1.rc.tmp" && mv "$1.rc.tmp" "$1.rc"
}
while :; do
  for f in /share/q/*.cmd; do
    [ -e "$f" ] || break
    id=${f%.cmd}
    mv "$f" "$id.run" && { run "$id" & }
  done
  usleep 100000
done
