#!/usr/bin/env bash
# The VM tier: a Debian bookworm machine under QEMU, with systemd as PID 1,
# cgroup v2 only (memory controller, PSI) and a root that holds every
# capability, for what this host cannot show: criguard's units under
# systemd, the systemd cgroup driver, v2 memory pressure, the kubelet's
# negative oom_score_adj. Everything comes from Debian's packages; the guest
# has no network (but the relays --forward asks for). QEMU runs under TCG (this host's /dev/kvm cannot boot a
# Debian kernel), so the guest is several times slower than the host.
#
# Usage:
#   hack/vm.sh deps
#       Install the host packages the tier needs (qemu-system-x86,
#       qemu-utils, debootstrap, e2fsprogs, kmod, cpio, busybox-static).
#   hack/vm.sh image
#       Build the machine once (hack/vm/image/build.sh) into
#       target/vm/images/<hash of hack/vm/image/>, or reuse it; print its
#       directory. Older images are removed.
#   hack/vm.sh run [--timeout SECS] [--share DIR]... [--share-rw DIR]...
#                  [--forward GUESTIP:PORT=HOSTIP:PORT]... [--env KEY=VALUE]... -- CMD [ARG...]
#       Boot the machine (root disk copy-on-write: the image never changes),
#       run CMD in the repository once the system is up, power off. The
#       repository and each --share DIR are mounted read-only at the same
#       paths as here, so binaries built here run there unchanged; each
#       --share-rw DIR is mounted read-write at its path (a channel both
#       sides write to while the VM runs). CMD's output streams to stdout;
#       the exit status is CMD's (124: timed out, 125: the VM failed before
#       CMD ended). Results, the console and the guest's journal stay in
#       target/vm/runs/<id>/ (the last 5 runs).
#       Without --forward the VM has no network device. With it, one NIC on
#       QEMU's user network with restrict=on (no packet leaves QEMU, nothing
#       reaches the guest from outside), the guest at 10.0.2.15/24, and for
#       each --forward a guestfwd: a TCP connection to GUESTIP:PORT (in
#       10.0.2.0/24, not .2, .3 or .15) is relayed to HOSTIP:PORT on this
#       machine, one socat per connection.
#   hack/vm.sh test [FILTER...]
#       Build tests/vm/main.rs and criguard, then run the VM scenarios (all, or
#       those matching FILTER) inside the machine.
#
# Environment: CRIGUARD_VM_MEM (MiB, default 2048), CRIGUARD_VM_CPUS (2),
# CRIGUARD_VM_ACCEL (tcg,thread=multi), CRIGUARD_VM_MIRROR (the Debian
# mirror debootstrap uses), CRIGUARD_VM_DIR (default <repo>/target/vm).
set -euo pipefail
export LC_ALL=C

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
REPO="$(cd "$(dirname "$SELF")/.." && pwd)"
VMDIR="${CRIGUARD_VM_DIR:-$REPO/target/vm}"
MEM="${CRIGUARD_VM_MEM:-2048}"
CPUS="${CRIGUARD_VM_CPUS:-2}"
ACCEL="${CRIGUARD_VM_ACCEL:-tcg,thread=multi}"
KEEP_RUNS=5
# The guest's writes (images, containers, the pressure scenario's files)
# stay well under this.
MIN_FREE_MIB=2048
# The guest's address on QEMU's user network (slirp's own DHCP address),
# set by hack/vm/guest.sh when the kernel command line has criguard.net=.
GUEST_ADDR=10.0.2.15/24

log() { echo "vm.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
    exit 2
}
need_root() { [[ "$(id -u)" -eq 0 ]] || die "run as root (debootstrap, mkfs, apt-get)"; }

# ---- host packages --------------------------------------------------------------

do_deps() {
    local -a missing=()
    local c
    for c in qemu-system-x86_64 qemu-img debootstrap mkfs.ext4 depmod cpio dpkg-deb apt-get; do
        command -v "$c" >/dev/null 2>&1 || missing+=("$c")
    done
    # hack/images.sh builds the test images from the static busybox.
    [[ -x /bin/busybox ]] || missing+=(busybox-static)
    if ((${#missing[@]})); then
        need_root
        log "missing: ${missing[*]}; installing with apt-get"
        local -a apt=(apt-get) qemu=(qemu-system-x86 qemu-utils)
        local parts="" ok=1
        # Some machines come with qemu-utils from bookworm-backports (10.x),
        # which Breaks bookworm's qemu-system-common (< 8.0): QEMU then comes
        # from the same suite, through a sources directory of our own (the
        # machine's apt configuration is left as it was).
        if [[ "$(dpkg-query -W -f '${Version}' qemu-utils 2>/dev/null || true)" == *bpo12* ]]; then
            parts="$(mktemp -d)"
            cp -p /etc/apt/sources.list.d/* "$parts"/ 2>/dev/null || true
            printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
                'Suites: bookworm-backports' 'Components: main' \
                'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
                >"$parts/criguard-vm-backports.sources"
            apt+=(-o "Dir::Etc::sourceparts=$parts")
            qemu=(-t bookworm-backports qemu-system-x86)
            log "qemu-utils is from bookworm-backports: qemu-system-x86 from there too"
        fi
        export DEBIAN_FRONTEND=noninteractive
        "${apt[@]}" update -q >&2 &&
            "${apt[@]}" install -y -q --no-install-recommends "${qemu[@]}" >&2 &&
            apt-get install -y -q --no-install-recommends \
                debootstrap e2fsprogs kmod cpio busybox-static >&2 || ok=0
        [[ -z "$parts" ]] || rm -rf "$parts"
        ((ok)) || die "could not install the VM tier's packages (above)"
    fi
    # The kernel is fetched with apt-get download: its index must be there.
    if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
        need_root
        apt-get update -q >&2
    fi
}

# ---- the image ------------------------------------------------------------------

# Hash of everything the image is made from.
image_key() {
    (cd "$REPO/hack/vm/image" && find . -type f -print0 | sort -z | xargs -0 sha256sum) |
        sha256sum | cut -c1-16
}

do_image() {
    local key dir t0
    key="$(image_key)"
    dir="$VMDIR/images/$key"
    mkdir -p "$VMDIR/images"
    exec 9>"$VMDIR/images/.lock"
    flock 9
    if [[ -s "$dir/root.img" && -s "$dir/vmlinuz" && -s "$dir/initrd.img" ]]; then
        log "image $key cached"
    else
        do_deps
        need_root
        t0=$SECONDS
        "$REPO/hack/vm/image/build.sh" "$dir"
        log "image $key built in $((SECONDS - t0)) s"
    fi
    # Only the current image is kept.
    find "$VMDIR/images" -mindepth 1 -maxdepth 1 -type d ! -name "$key" \
        -exec rm -rf --one-file-system {} + 2>/dev/null || true
    exec 9>&-
    echo "$dir"
}

# ---- a run ----------------------------------------------------------------------

QEMU_PID=""
TAIL_PID=""
stop_children() {
    # Each kill may find its process gone: not an error (set -e).
    [[ -n "$TAIL_PID" ]] && { kill "$TAIL_PID" 2>/dev/null || true; }
    if [[ -n "$QEMU_PID" ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill -TERM "$QEMU_PID" 2>/dev/null || true
        sleep 1
        kill -KILL "$QEMU_PID" 2>/dev/null || true
    fi
    return 0
}

# One command to QEMU's human monitor of the running VM; its answer.
monitor() {
    python3 - "$out/monitor.sock" "$1" <<'PY' 2>&1 | tr -d '\r' | grep -v '^(qemu)\|^QEMU .*monitor' | head -n 5
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
time.sleep(1)
print(s.recv(65536).decode(errors="replace"))
PY
}

# guestfwd SPEC: QEMU's guestfwd= value for --forward GUESTIP:PORT=HOSTIP:PORT
# (each connection the guest opens to GUESTIP:PORT runs a socat to HOSTIP:PORT).
guestfwd() {
    local ip='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])' port='([1-9][0-9]{0,4})'
    local re="^(10\.0\.2\.$ip):$port=($ip\.$ip\.$ip\.$ip):$port\$"
    if [[ ! "$1" =~ $re ]]; then
        log "ERROR: --forward wants GUESTIP:PORT=HOSTIP:PORT with GUESTIP in 10.0.2.0/24, got '$1'"
        return 1
    fi
    local gip="${BASH_REMATCH[1]}" gport="${BASH_REMATCH[3]}" hip="${BASH_REMATCH[4]}" hport="${BASH_REMATCH[9]}"
    case "${gip##*.}" in
        2 | 3 | 15) log "ERROR: --forward: $gip is QEMU's gateway, DNS or the guest itself"; return 1 ;;
    esac
    ((gport <= 65535 && hport <= 65535)) || { log "ERROR: --forward: port out of range in '$1'"; return 1; }
    echo "tcp:$gip:$gport-cmd:socat - TCP:$hip:$hport"
}

do_run() {
    local timeout=900 image run out status t0 boot_s cmd_s free_mib
    local -a shares=("$REPO") rw_shares=() forwards=() envs=() cmd=()
    while (($#)); do
        case "$1" in
            --timeout) timeout="$2"; shift 2 ;;
            --share) shares+=("$(readlink -f "$2")"); shift 2 ;;
            --share-rw) rw_shares+=("$(readlink -f "$2")"); shift 2 ;;
            --forward) forwards+=("$2"); shift 2 ;;
            --env) envs+=("$2"); shift 2 ;;
            --) shift; cmd=("$@"); break ;;
            *) usage ;;
        esac
    done
    ((${#cmd[@]})) || usage
    [[ "$timeout" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds"
    do_deps
    image="$(do_image)"
    # The test images, built here (hack/images.sh takes half a minute under
    # TCG): the guest starts its own cache with copies of them.
    local oci="$VMDIR/oci"
    "$REPO/hack/images.sh" "$oci" >/dev/null
    shares+=("$oci")
    envs+=("CRIGUARD_VM_PREBUILT=$oci")

    run="$(date -u +%Y%m%dT%H%M%S)-$$"
    out="$VMDIR/runs/$run"
    mkdir -p "$out"
    (cd "$VMDIR/runs" && ls -1d -- */ 2>/dev/null | sort | head -n "-$KEEP_RUNS" |
        xargs -r rm -rf --one-file-system --) || true
    printf '%s\0' "${cmd[@]}" >"$out/cmd"
    printf '%s\n' "${envs[@]+"${envs[@]}"}" >"$out/env"

    # Shares: the repository first (the guest runs its hack/vm/guest.sh),
    # each mounted read-only at its own path; a path under another share
    # needs no share of its own.
    local -a qemu_shares=() cmdline_shares=() kept=()
    local s k i=0 inside
    for s in "${shares[@]}"; do
        [[ -d "$s" ]] || die "share $s is not a directory"
        [[ "$s" != *[[:space:],:]* ]] || die "share path must not contain spaces, commas or colons: $s"
        inside=0
        for k in "${kept[@]+"${kept[@]}"}"; do
            [[ "$s" == "$k" || "$s" == "$k"/* ]] && inside=1
        done
        ((inside)) && continue
        kept+=("$s")
        qemu_shares+=(-virtfs "local,path=$s,mount_tag=s$i,security_model=none,readonly=on")
        cmdline_shares+=("s$i:$s")
        i=$((i + 1))
    done
    qemu_shares+=(-virtfs "local,path=$out,mount_tag=out,security_model=none")
    local -a cmdline_rw=()
    i=0
    for s in "${rw_shares[@]+"${rw_shares[@]}"}"; do
        [[ -d "$s" ]] || die "share $s is not a directory"
        [[ "$s" != *[[:space:],:]* ]] || die "share path must not contain spaces, commas or colons: $s"
        qemu_shares+=(-virtfs "local,path=$s,mount_tag=w$i,security_model=none")
        cmdline_rw+=("w$i:$s")
        i=$((i + 1))
    done

    local append="console=ttyS0 root=/dev/vda rw quiet panic=-1"
    append+=" systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all psi=1"
    append+=" criguard.shares=$(IFS=,; echo "${cmdline_shares[*]}")"
    ((${#cmdline_rw[@]} == 0)) || append+=" criguard.shares_rw=$(IFS=,; echo "${cmdline_rw[*]}")"

    local -a qemu_net=(-nic none)
    if ((${#forwards[@]})); then
        command -v socat >/dev/null 2>&1 || die "--forward needs socat on this machine (apt-get install socat)"
        local netdev="user,id=n0,restrict=on" f
        for f in "${forwards[@]}"; do
            netdev+=",guestfwd=$(guestfwd "$f")" || exit 1
        done
        qemu_net=(-netdev "$netdev" -device "virtio-net-pci,netdev=n0")
        append+=" criguard.net=$GUEST_ADDR"
    fi

    free_mib="$(df -Pm "$out" | awk 'NR == 2 { print $4 }')"
    ((free_mib >= MIN_FREE_MIB)) ||
        die "the VM's disk overlay needs ${MIN_FREE_MIB} MiB free under $out; $free_mib MiB are"
    trap 'stop_children; exit 130' INT TERM HUP
    t0=$SECONDS
    log "booting (kernel $(cat "$image/kernel-version"), ${CPUS} CPUs, ${MEM} MiB, accel $ACCEL); run dir $out ($free_mib MiB free)"
    # The guest writes to a copy-on-write overlay of the image in the run
    # directory (not QEMU's snapshot=on file in /var/tmp, which may be a
    # small filesystem), so every run starts from the same image. A write
    # that fails is reported to the guest (werror=report) instead of
    # pausing the VM, QEMU's default on ENOSPC, which looks like a hang.
    qemu-img create -q -f qcow2 -F raw -b "$image/root.img" "$out/root.qcow2"
    qemu-system-x86_64 -accel "$ACCEL" -cpu max -m "$MEM" -smp "$CPUS" \
        -display none -monitor "unix:$out/monitor.sock,server=on,wait=off" \
        -serial "file:$out/console.log" "${qemu_net[@]}" -no-reboot \
        -kernel "$image/vmlinuz" -initrd "$image/initrd.img" -append "$append" \
        -drive "file=$out/root.qcow2,if=virtio,format=qcow2,werror=report,rerror=report" \
        "${qemu_shares[@]}" </dev/null >"$out/qemu.log" 2>&1 &
    QEMU_PID=$!
    tail -F -n +1 "$out/output" 2>/dev/null &
    TAIL_PID=$!

    local end=$((SECONDS + timeout)) timed_out=0
    while kill -0 "$QEMU_PID" 2>/dev/null; do
        if ((SECONDS >= end)); then
            timed_out=1
            log "timed out after ${timeout} s; QEMU says: $(monitor "info status")"
            log "stopping the VM (pid $QEMU_PID)"
            stop_children
            break
        fi
        sleep 0.5
    done
    wait "$QEMU_PID" 2>/dev/null || true
    QEMU_PID=""
    sleep 0.3 # let tail print the last lines
    kill "$TAIL_PID" 2>/dev/null || true
    wait "$TAIL_PID" 2>/dev/null || true
    TAIL_PID=""
    trap - INT TERM HUP
    rm -f "$out/root.qcow2" "$out/monitor.sock"

    status="$(cat "$out/status" 2>/dev/null || true)"
    boot_s="$(awk '$1 == "started" { print $2 }' "$out/times" 2>/dev/null || true)"
    cmd_s="$(awk '$1 == "started" { s = $2 } $1 == "ended" { printf "%.1f", $2 - s }' "$out/times" 2>/dev/null || true)"
    log "VM wall time $((SECONDS - t0)) s; boot to command ${boot_s:-?} s; command ${cmd_s:-?} s"
    if ((timed_out)); then
        log "console tail ($out/console.log):"
        tail -n 30 "$out/console.log" >&2 || true
        return 124
    fi
    if [[ ! "$status" =~ ^[0-9]+$ ]]; then
        log "the VM stopped before the command finished; console tail ($out/console.log):"
        tail -n 40 "$out/console.log" >&2 || true
        cat "$out/qemu.log" >&2 || true
        return 125
    fi
    ((status == 0)) || log "command exited with $status (journal: $out/journal)"
    return "$status"
}

# ---- the VM scenarios --------------------------------------------------------------

do_test() {
    local bin target
    (cd "$REPO" && cargo build --bin criguard >&2)
    # The test target's artifact: cargo also lists criguard's binary, in
    # an order of its own.
    bin="$(cd "$REPO" && cargo test --no-run --test vm --message-format=json 2>/dev/null |
        grep '"kind":\["test"\],[^}]*"name":"vm"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)"
    [[ -x "$bin" ]] || die "cannot find the tests/vm/main.rs binary"
    target="$(dirname "$(dirname "$(dirname "$bin")")")"
    do_run --share "$target" -- "$bin" --ignored --test-threads=1 "$@"
}

[[ $# -ge 1 ]] || usage
sub="$1"
shift
case "$sub" in
    deps) do_deps ;;
    image) do_image ;;
    run) do_run "$@" ;;
    test) do_test "$@" ;;
    *) usage ;;
esac
