#!/usr/bin/env bash
# Build the VM tier's machine from Debian packages only: a bookworm root
# (debootstrap minbase + hack/vm/image/packages) as an ext4 image, Debian's
# amd64 kernel taken out of its package (never installed on the host), and
# a small initrd (busybox + the modules that mount the root and the shares).
#
# Usage: hack/vm/image/build.sh OUTDIR
#   Writes OUTDIR/{vmlinuz,initrd.img,root.img,kernel-version} through a
#   temporary directory next to OUTDIR, renamed into place when complete.
# Environment:
#   CRIGUARD_VM_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   CRIGUARD_VM_FREE_MIB  free space left in the root image (default 1536)
#
# Needs root and debootstrap, dpkg-deb, depmod (kmod), cpio, mkfs.ext4 and
# apt-get (hack/vm.sh installs them).
set -euo pipefail
export LC_ALL=C

SELF_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MIRROR="${CRIGUARD_VM_MIRROR:-http://deb.debian.org/debian}"
FREE_MIB="${CRIGUARD_VM_FREE_MIB:-1536}"
SUITE=bookworm
# Modules loaded by the initrd, in this order (their dependencies first,
# from modules.dep): the virtio disk, ext4 (crc32c is asked for by name at
# mount time, so it is loaded explicitly), 9p over virtio, overlay for
# containerd's snapshotter, and virtio-net for the cluster tier's VM node
# (`hack/vm.sh run --forward`; no NIC otherwise). No modules in the root:
# they stay loaded.
MODULES=(virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p overlay virtio_net)

log() { echo "vm/image/build.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

[[ $# -eq 1 && "$1" == /* ]] || die "usage: $0 OUTDIR (absolute)"
[[ "$(id -u)" -eq 0 ]] || die "run as root"
OUT="${1%/}"
WORK="$OUT.tmp.$$"
trap 'rm -rf --one-file-system "$WORK"' EXIT
rm -rf --one-file-system "$WORK"
mkdir -p "$WORK"
t0=$SECONDS

# ---- the kernel: the package linux-image-amd64 points to, unpacked --------
kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')"
[[ -n "$kpkg" ]] || die "apt-cache knows no linux-image-amd64 (run apt-get update)"
kver="${kpkg#linux-image-}"
log "kernel $kver: downloading $kpkg"
(cd "$WORK" && apt-get download -q "$kpkg" >&2) 2>&1 | grep -v 'unsandboxed' >&2 || true
deb="$(ls "$WORK"/"$kpkg"_*.deb 2>/dev/null | head -n1)"
[[ -n "$deb" ]] || die "apt-get download $kpkg failed"
dpkg-deb -x "$deb" "$WORK/kernel"
rm -f "$deb"
kmods="$WORK/kernel/lib/modules/$kver"
depmod -b "$WORK/kernel" "$kver"
cp "$WORK/kernel/boot/vmlinuz-$kver" "$WORK/vmlinuz"

# ---- the root: debootstrap minbase plus our packages -------------------------
mapfile -t pkgs < <(sed 's/#.*//; /^[[:space:]]*$/d' "$SELF_DIR/packages")
include="$(IFS=,; echo "${pkgs[*]}")"
log "debootstrap $SUITE minbase + $include"
ts=$SECONDS
debootstrap --variant=minbase --include="$include" "$SUITE" "$WORK/root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORK/debootstrap.log" >&2
    die "debootstrap failed"
}
log "debootstrap took $((SECONDS - ts)) s"
R="$WORK/root"

# The initrd takes busybox from the root, so it matches the packages.
[[ -x "$R/bin/busybox" ]] || die "busybox-static missing from the root"

# ---- the initrd ---------------------------------------------------------------
I="$WORK/initrd"
mkdir -p "$I/bin" "$I/lib/modules"
cp "$R/bin/busybox" "$I/bin/busybox"
install -m 0755 "$SELF_DIR/init" "$I/init"
: >"$I/modules"
declare -A seen=()
add_module() { # add_module NAME: its dependencies (modules.dep order reversed), then it
    local name="$1" line rel dep
    line="$(grep -E "/${name//_/[_-]}\.ko(\.[a-z]+)?:" "$kmods/modules.dep" | head -n1)"
    [[ -n "$line" ]] || die "module $name not in $kver"
    rel="${line%%:*}"
    local -a deps
    read -r -a deps <<<"${line#*:}"
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        dep="${deps[i]}"
        [[ -n "${seen[$dep]:-}" ]] && continue
        seen[$dep]=1
        cp "$kmods/$dep" "$I/lib/modules/" && echo "${dep##*/}" >>"$I/modules"
    done
    if [[ -z "${seen[$rel]:-}" ]]; then
        seen[$rel]=1
        cp "$kmods/$rel" "$I/lib/modules/" && echo "${rel##*/}" >>"$I/modules"
    fi
}
for m in "${MODULES[@]}"; do add_module "$m"; done
(cd "$I" && find . | cpio -o -H newc --quiet) >"$WORK/initrd.img"
rm -rf "$WORK/kernel"

# ---- configure the root -------------------------------------------------------
echo criguard-vm >"$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 criguard-vm\n' >"$R/etc/hosts"
: >"$R/etc/fstab"
: >"$R/etc/machine-id"
mkdir -p "$R/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' >"$R/etc/systemd/journald.conf.d/criguard-vm.conf"
# Nothing that waits for devices (there is no udev) or runs on timers.
for u in getty@.service serial-getty@.service getty.target \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
    systemd-tmpfiles-clean.timer e2scrub_all.timer fstrim.timer \
    systemd-timesyncd.service systemd-networkd.service; do
    ln -sf /dev/null "$R/etc/systemd/system/$u"
done
ln -sf /lib/systemd/system/multi-user.target "$R/etc/systemd/system/default.target"
install -m 0644 "$SELF_DIR/containerd-config.toml" "$R/etc/containerd/config.toml"
install -m 0755 "$SELF_DIR/criguard-vm-run" "$R/usr/local/sbin/criguard-vm-run"
install -m 0644 "$SELF_DIR/criguard-vm.service" "$R/etc/systemd/system/criguard-vm.service"
mkdir -p "$R/etc/systemd/system/multi-user.target.wants"
ln -sf ../criguard-vm.service "$R/etc/systemd/system/multi-user.target.wants/criguard-vm.service"
# Smaller image: no package cache, documentation or translations.
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* \
    "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/locale/*

# ---- the disk image -----------------------------------------------------------
used_mib=$(($(du -sxm "$R" | cut -f1) + FREE_MIB))
truncate -s "${used_mib}M" "$WORK/root.img"
mkfs.ext4 -q -F -L criguard-vm -d "$R" "$WORK/root.img"
rm -rf --one-file-system "$R"
echo "$kver" >"$WORK/kernel-version"
rm -f "$WORK/debootstrap.log"
rm -rf "$I"

rm -rf --one-file-system "$OUT"
mv "$WORK" "$OUT"
trap - EXIT
log "image ready in $((SECONDS - t0)) s: $OUT (kernel $kver, root ${used_mib} MiB)"
