#!/usr/bin/env bash
# Inside the VM (run by criguard-vm.service once the system is up): run the
# command hack/vm.sh left in the results share, in the repository, and put
# its output, exit status and timings back there.
#
# Usage: guest.sh OUTDIR
#   OUTDIR/cmd     the command, one NUL-terminated argument each (read)
#   OUTDIR/env     KEY=VALUE lines exported for it (read, optional)
#   OUTDIR/output  its stdout and stderr (written as it runs)
#   OUTDIR/status  its exit status (written last)
#   OUTDIR/times   seconds since boot when it started and ended
#   OUTDIR/journal the journal of this boot (written after it)
# From the kernel command line (hack/vm.sh run):
#   criguard.shares_rw=TAG:PATH,...  9p shares mounted read-write at PATH
#   criguard.net=ADDR/LEN            the address of the NIC (--forward); no
#                                    route beyond its subnet
set -uo pipefail
out="$1"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

read -r up _ </proc/uptime
echo "started $up" >"$out/times"
mapfile -d '' -t argv <"$out/cmd"
# The repository is mounted read-only: hack/images.sh keeps its archives in
# the guest, starting from those built on the host (kept as fresh as they
# are, so they are reused).
export CRIGUARD_IMAGE_CACHE=/var/tmp/criguard-images
if [[ -r "$out/env" ]]; then
    while IFS= read -r kv; do
        [[ -n "$kv" ]] && export "${kv?}"
    done <"$out/env"
fi
export CRIGUARD_VM_GUEST=1 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# cmdline_arg KEY: the value of KEY= on the kernel command line.
cmdline_arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p" | tail -n1; }
setup_errors=""
for s in $(cmdline_arg criguard.shares_rw | tr ',' ' '); do
    mkdir -p "${s#*:}" &&
        mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 "${s%%:*}" "${s#*:}" ||
        setup_errors+="cannot mount the read-write share $s; "
done
net="$(cmdline_arg criguard.net)"
if [[ -n "$net" ]]; then
    # The first NIC (there is no udev: its kernel name, eth0).
    nic=""
    for d in /sys/class/net/*; do
        [[ "${d##*/}" == lo ]] || { nic="${d##*/}"; break; }
    done
    if [[ -z "$nic" ]]; then
        setup_errors+="criguard.net=$net but no network interface; "
    else
        busybox ip link set lo up
        busybox ip addr add "$net" dev "$nic" && busybox ip link set "$nic" up ||
            setup_errors+="cannot set $net on $nic; "
    fi
fi
if [[ -d "${CRIGUARD_VM_PREBUILT:-}" ]]; then
    mkdir -p "$CRIGUARD_IMAGE_CACHE"
    cp -p "$CRIGUARD_VM_PREBUILT"/*.tar "$CRIGUARD_IMAGE_CACHE"/ 2>/dev/null || true
fi
{
    echo "guest: $(uname -r), systemd $(systemctl --version | awk 'NR == 1 { print $2 }')," \
        "$(nproc) CPUs, $(awk '$1 == "MemTotal:" { print $2 " kB" }' /proc/meminfo), up ${up} s"
    if [[ -n "$setup_errors" ]]; then
        echo "guest: setup failed: $setup_errors"
        exit 125
    fi
    cd "$repo" && "${argv[@]}"
} >"$out/output" 2>&1 </dev/null
status=$?
read -r up _ </proc/uptime
echo "ended $up" >>"$out/times"
journalctl -b --no-pager -o short-monotonic >"$out/journal" 2>&1
echo "$status" >"$out/status"
sync
