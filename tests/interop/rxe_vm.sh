# A QEMU guest running Debian 12's own kernel with rdma_rxe (the kernel's
# Soft-RoCE), reachable from a host network namespace over a bridge, for
# interoperability tests (sourced by rxe_interop_test.sh).
#
#   host netns $VM_NS: bridge $VM_BR $VM_NET.1/24 -- tap $VM_TAP -- guest eth0 $VM_NET.2/24, rxe0
#
# vm_prepare DIR BINARY...  the kernel (apt-get download, cached in DIR) and an
#                           initramfs: busybox-static, BINARY... (to /opt/bin) and
#                           their libraries, the rxe provider, rxe_vm_init.sh as /init
# vm_boot MTU               starts the guest (TCG or KVM, one vCPU), waits until rxe0 is up
# vm_exec [-b] SECS CMD     runs CMD (busybox sh) in the guest, killed after SECS:
#                           prints its output and returns its status; -b: in the
#                           background, prints an id for vm_wait
# vm_wait ID                waits for a background command (output, status)
# vm_kill ID                kills a background command (vm_wait still collects it)
# vm_set_mtu MTU            bridge, tap and guest eth0 (rxe's active MTU follows)
# vm_stop                   stops the guest, removes the netns (taps, bridge with it)
# Every step is bounded; vm_stop is for an EXIT trap.
VM_NS=${VM_NS:-rxvt}
VM_BR=rxvbr0
VM_TAP=rxvtap1
VM_NET=${VM_NET:-10.232.0}
VM_HOST=$VM_NET.1
VM_GUEST=$VM_NET.2
VM_MODULES="virtio_pci virtio_net 9pnet_virtio 9p crc32_generic crc32_pclmul rdma_rxe ib_uverbs rdma_ucm"
VM_RUN=
VM_SEQ=0

vm_log() { echo "rxe-vm: $*" >&2; }

# The copies of FILE... under ROOT with their shared libraries (ldd closure).
vm_copy_libs() {
  local root=$1 f l; shift
  for f; do
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | while read -r l; do
      [ -e "$root$l" ] && continue
      mkdir -p "$root$(dirname "$l")" && cp -L "$l" "$root$l"
    done
  done
}

vm_prepare() {
  local dir=$1; shift
  mkdir -p "$dir" || return 1
  local kpkg deb kver
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [ -n "$kpkg" ] || { vm_log "apt-cache does not know linux-image-amd64"; return 2; }
  deb=$(ls "$dir/${kpkg}"_*.deb 2>/dev/null | tail -1)
  if [ -z "$deb" ]; then
    vm_log "downloading $kpkg"
    (cd "$dir" && apt-get download "$kpkg" >download.log 2>&1) || { cat "$dir/download.log" >&2; return 2; }
    deb=$(ls "$dir/${kpkg}"_*.deb | tail -1)
  fi
  # The initramfs again when an input changed (the stamp names them all).
  local inputs=("$(dirname "${BASH_SOURCE[0]}")/rxe_vm_init.sh" /bin/busybox "$deb" "$@")
  local stamp; stamp=$(ls -lL --time-style=+%s "${inputs[@]}" | md5sum | cut -d' ' -f1)
  if [ -f "$dir/vmlinuz" ] && [ -f "$dir/initramfs.cpio.gz" ] &&
     [ "$(cat "$dir/initramfs.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  # The package unpacked (400 MB) only while the initramfs is built.
  rm -rf "$dir/kpkg" && dpkg -x "$deb" "$dir/kpkg" || return 1
  kver=$(ls "$dir/kpkg/lib/modules" | head -1)
  depmod -b "$dir/kpkg" "$kver" && cp "$dir/kpkg/boot/vmlinuz-$kver" "$dir/vmlinuz" || return 1
  echo "$kver" >"$dir/kver"
  vm_log "building the initramfs"
  local r=$dir/root a m line
  rm -rf "$r" && mkdir -p "$r"/usr/{bin,sbin,lib,lib64} "$r"/{proc,sys,dev,tmp,run,share,etc/rxevm,opt/bin}
  ln -s usr/bin "$r/bin"; ln -s usr/sbin "$r/sbin"; ln -s usr/lib "$r/lib"; ln -s usr/lib64 "$r/lib64"
  cp /bin/busybox "$r/usr/bin/busybox"
  for a in $(/bin/busybox --list-full); do [ -e "$r/$a" ] || ln -s /usr/bin/busybox "$r/$a"; done
  install -m 755 "${inputs[0]}" "$r/init"
  for a; do cp -L "$a" "$r/opt/bin/" || return 1; done
  vm_copy_libs "$r" "$@"
  # The rxe provider libibverbs loads, and libgcc_s (pthread_cancel).
  local prov=/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
  mkdir -p "$r$(dirname "$prov")" "$r/etc/libibverbs.d"
  cp -L "$prov" "$r$prov" && cp /etc/libibverbs.d/rxe.driver "$r/etc/libibverbs.d/" || return 1
  vm_copy_libs "$r" "$prov"
  cp -L /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 "$r/usr/lib/x86_64-linux-gnu/"
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\n' >"$r/etc/group"
  printf '127.0.0.1 localhost\n' >"$r/etc/hosts"
  echo "$VM_MODULES" >"$r/etc/rxevm/modules"
  for m in $VM_MODULES; do
    modprobe -d "$dir/kpkg" -S "$kver" --show-depends "$m" | while read -r line; do
      case "$line" in
        insmod*) line=$(echo "$line" | awk '{print $2}')
                 a=${line#"$dir/kpkg"}
                 mkdir -p "$r$(dirname "$a")" && cp "$line" "$r$a" ;;
      esac
    done
  done
  cp "$dir/kpkg/lib/modules/$kver/"modules.{builtin,builtin.modinfo,order} "$r/lib/modules/$kver/"
  depmod -b "$r" "$kver" || return 1
  (cd "$r" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | gzip -1 >"$dir/initramfs.cpio.gz" || return 1
  echo "$stamp" >"$dir/initramfs.stamp"
  rm -rf "$dir/kpkg" "$r"
  vm_log "initramfs $(du -h "$dir/initramfs.cpio.gz" | cut -f1) (kernel $kver)"
}

vm_qemu_pid() {   # the guest's QEMU if it still runs (its pid file and command line agree)
  local p
  p=$(cat "$VM_RUN/qemu.pid" 2>/dev/null) || return 1
  [ -n "$p" ] && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "-name $VM_NS-guest " && echo "$p"
}

# vm_boot DIR MTU: DIR from vm_prepare; the guest's files in DIR/run.
vm_boot() {
  local dir=$1 mtu=$2
  VM_RUN=$dir/run
  vm_stop   # what a killed earlier run left
  rm -rf "$VM_RUN" && mkdir -p "$VM_RUN/share/q" || return 1
  ip netns add "$VM_NS" || return 1
  ip -n "$VM_NS" link set lo up
  ip -n "$VM_NS" link add "$VM_BR" type bridge &&
    ip -n "$VM_NS" addr add "$VM_HOST/24" dev "$VM_BR" &&
    ip -n "$VM_NS" tuntap add dev "$VM_TAP" mode tap &&
    ip -n "$VM_NS" link set "$VM_TAP" master "$VM_BR" || return 1
  ip -n "$VM_NS" link set "$VM_BR" mtu "$mtu" up && ip -n "$VM_NS" link set "$VM_TAP" mtu "$mtu" up || return 1
  # KVM where it is real; else TCG (-cpu max has PCLMUL for the ICRC's crc32).
  local accel="-accel tcg -cpu max"
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
    accel="-accel kvm -cpu host"
  fi
  # shellcheck disable=SC2086
  ip netns exec "$VM_NS" qemu-system-x86_64 -name "$VM_NS-guest" -machine pc $accel -smp 1 -m 512 \
    -nodefaults -no-user-config -display none -no-reboot \
    -kernel "$dir/vmlinuz" -initrd "$dir/initramfs.cpio.gz" \
    -append "console=ttyS0 loglevel=4 panic=-1 rxevm.ip=$VM_GUEST/24 rxevm.mtu=$mtu" \
    -serial "file:$VM_RUN/serial.log" \
    -netdev "tap,id=n0,ifname=$VM_TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:e8:00:02,romfile=" \
    -fsdev "local,id=fs0,path=$VM_RUN/share,security_model=none" \
    -device virtio-9p-pci,fsdev=fs0,mount_tag=share \
    -pidfile "$VM_RUN/qemu.pid" -daemonize 2>"$VM_RUN/qemu.err" || { cat "$VM_RUN/qemu.err" >&2; return 1; }
  # Up to 10 minutes for a loaded machine under TCG (a hang, not a slow boot).
  local i
  for i in $(seq 3000); do
    grep -q "rxevm: READY" "$VM_RUN/serial.log" 2>/dev/null && break
    grep -qE "rxevm: FAILED|Kernel panic" "$VM_RUN/serial.log" 2>/dev/null && break
    vm_qemu_pid >/dev/null || break
    sleep 0.2
  done
  if ! grep -q "rxevm: READY .*ffff" "$VM_RUN/serial.log" 2>/dev/null; then
    tail -30 "$VM_RUN/serial.log" >&2
    vm_log "the guest did not come up"
    return 1
  fi
  vm_log "guest up: $(grep -o 'READY.*' "$VM_RUN/serial.log")"
}

vm_exec() {
  local bg=0; [ "$1" = -b ] && { bg=1; shift; }
  local to=$1; shift
  local id=$VM_RUN/share/q/$$-$((VM_SEQ += 1))
  echo "$to" >"$id.timeout"
  printf '%s\n' "$*" >"$id.tmp" && mv "$id.tmp" "$id.cmd"
  if [ $bg = 1 ]; then echo "$id"; else vm_wait "$id"; fi
}

vm_wait() {
  local id=$1 rc
  # The guest's watchdog ends the command; this bound is for a dead guest.
  while [ ! -e "$id.rc" ]; do
    vm_qemu_pid >/dev/null || { cat "$id.out" 2>/dev/null; vm_log "the guest is gone"; return 1; }
    sleep 0.2
  done
  cat "$id.out"
  rc=$(cat "$id.rc")
  rm -f "$id".*
  return "$rc"
}

vm_kill() { touch "$1.kill"; }

vm_set_mtu() {
  ip -n "$VM_NS" link set "$VM_BR" mtu "$1" && ip -n "$VM_NS" link set "$VM_TAP" mtu "$1" &&
    vm_exec 30 "/opt/bin/ip link set eth0 mtu $1" >/dev/null
}

vm_stop() {
  local p
  if [ -n "$VM_RUN" ] && p=$(vm_qemu_pid); then
    kill -TERM "$p"
    for _ in $(seq 50); do [ -d "/proc/$p" ] || break; sleep 0.1; done
    p=$(vm_qemu_pid) && kill -KILL "$p"
  fi
  ip netns del "$VM_NS" 2>/dev/null
  return 0
}
