#!/usr/bin/env bash
# In the cluster tier's VM node (run through `hack/cluster/vm-node.sh exec`):
# restart criguard.service under the running kubelet the way an operator
# does (systemctl restart), and read back what that did to the node: how
# long each restart took, how systemd counted them, and the CRI errors the
# kubelet logged.
#
# Usage:
#   criguard-restarts.sh now
#       The guest's clock, whole seconds since the epoch (a window's start).
#   criguard-restarts.sh restart N [FIRST]
#       N times: systemctl restart criguard, then wait until the new process
#       has answered the kubelet's runtime sanity check (a Status call with
#       code OK in its metrics: the kubelet makes one every 5 s and reports
#       "container runtime is down", the node NotReady, when none has
#       succeeded for 30 s) and its admin socket answers (criguard
#       evictions). Waiting for that check, not for any relayed call, paces
#       the restarts as an operator's rolling restart is paced: the kubelet
#       has seen the runtime up between two of them. One line per restart:
#       "restart I PID MS SYSTEMCTL_MS" (I counted from FIRST, default 1;
#       MS: systemctl restart's start to both answering; SYSTEMCTL_MS: how
#       long systemctl restart itself took, the old process's stop mostly).
#   criguard-restarts.sh upgrade N [FIRST]
#       N package upgrades, old -> new: the installed package
#       (/var/tmp/criguard-deb/*.deb, hack/deb.sh's) rebuilt with the
#       version VERSION+upI and installed with dpkg -i (without its
#       fsyncs, --force-unsafe-io), whose postinst
#       reloads the service (systemctl reload hands over to the binary dpkg
#       put in place) and waits for the new MainPID; then wait until it
#       answers as above. One line per upgrade: "upgrade I PID MS DPKG_MS"
#       (DPKG_MS: how long dpkg -i took, the postinst's wait included).
#   criguard-restarts.sh on-pressure TIMEOUT
#       Wait (at most TIMEOUT s) until criguard's metrics show its memory
#       signal under the threshold (criguard_signal_available <
#       criguard_signal_threshold for allocatableMemory.available), then
#       restart it as `restart 1` does. Prints "pressure AVAILABLE THRESHOLD"
#       then the restart's line.
#   criguard-restarts.sh report SINCE
#       What happened since SINCE (the guest's epoch seconds), as KEY=VALUE
#       lines: STARTS (systemd's "Started criguard.service" lines), FAILURES
#       (criguard.service "Failed with result" lines), NRESTARTS (systemd's
#       automatic restarts, crashes: `systemctl restart` does not count),
#       MAINPID, DOWNTIMES (for each restart SIGTERM_EPOCH_S:MS: criguard's
#       "SIGTERM: draining" and how long until the next process's
#       "forwarding CRI calls", the time the kubelet's new connections
#       wait in the socket's backlog),
#       KUBELET_CRI_ERRORS (kubelet journal lines with "rpc error"), then
#       those lines (at most 500), each after "kubelet: ".
set -uo pipefail
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ADMIN=/run/criguard/admin.sock
METRICS=127.0.0.1:9809

die() {
    echo "criguard-restarts.sh: $*" >&2
    exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# metrics: criguard's metrics, as text (nothing if it does not answer).
metrics() {
    timeout 5 bash -c "exec 3<>/dev/tcp/${METRICS%:*}/${METRICS#*:}; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3" 2>/dev/null
}

# status_ok: how many of the kubelet's Status calls the running criguard
# has answered with OK.
status_ok() {
    metrics | awk '/^criguard_cri_request_duration_seconds_count\{/ && /method="runtime\.v1(alpha2)?\.RuntimeService\/Status"/ && /code="OK"/ { n += $NF } END { print n + 0 }'
}

# answering SECS: until the running criguard has answered the kubelet's
# Status and its admin socket answers, at most SECS seconds.
answering() {
    local end=$((SECONDS + $1))
    until (($(status_ok) > 0)) && criguard evictions --admin-socket "$ADMIN" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.1
    done
}

# restart_one I: one systemctl restart; prints "restart I PID MS SYSTEMCTL_MS".
restart_one() {
    local t0 t1 pid old
    old="$(systemctl show -p MainPID --value criguard.service)"
    t0="$(now_ms)"
    systemctl restart criguard.service || die "systemctl restart criguard (restart $1) failed"
    t1="$(now_ms)"
    answering 60 || die "criguard not answering 60 s after restart $1"
    pid="$(systemctl show -p MainPID --value criguard.service)"
    [[ "$pid" != 0 && "$pid" != "$old" ]] || die "restart $1: MainPID $old before, $pid after"
    echo "restart $1 $pid $(($(now_ms) - t0)) $((t1 - t0))"
}

DEB_DIR=/var/tmp/criguard-deb
STAGE=/var/tmp/criguard-upgrade

# stage_package: the installed package, unpacked in $STAGE once; prints its
# version.
stage_package() {
    local base
    if [[ ! -f "$STAGE/DEBIAN/control" ]]; then
        base="$(ls "$DEB_DIR"/criguard_*.deb 2>/dev/null | head -n1)"
        [[ -n "$base" ]] || die "no package in $DEB_DIR"
        rm -rf "$STAGE" && dpkg-deb -R "$base" "$STAGE" || die "unpack $base"
        sed -n 's/^Version: //p' "$STAGE/DEBIAN/control" >"$STAGE.version"
    fi
    cat "$STAGE.version"
}

# upgrade_one I: the package rebuilt as version +upI and installed; prints
# "upgrade I PID MS DPKG_MS".
upgrade_one() {
    local t0 t1 pid old version deb
    version="$(stage_package)+up$1"
    sed -i "s/^Version: .*/Version: $version/" "$STAGE/DEBIAN/control"
    deb="/var/tmp/criguard_$version.deb"
    dpkg-deb -Znone -b "$STAGE" "$deb" >/dev/null || die "build $deb"
    old="$(systemctl show -p MainPID --value criguard.service)"
    t0="$(now_ms)"
    # --force-unsafe-io: dpkg skips its fsyncs, the slowest part under TCG;
    # the unpack, the file replacement and the maintainer scripts are the same.
    dpkg -i --force-unsafe-io --force-confold --force-confdef "$deb" >/dev/null ||
        die "dpkg -i $deb (upgrade $1) failed"
    t1="$(now_ms)"
    rm -f "$deb"
    [[ "$(dpkg-query -W -f '${Version}' criguard)" == "$version" ]] || die "upgrade $1: criguard $version not installed"
    local end=$((SECONDS + 60))
    while :; do
        pid="$(systemctl show -p MainPID --value criguard.service)"
        [[ "$pid" != 0 && "$pid" != "$old" ]] && break
        ((SECONDS < end)) || die "upgrade $1: MainPID still $old 60 s after the reload"
        sleep 0.1
    done
    answering 60 || die "criguard not answering 60 s after upgrade $1"
    echo "upgrade $1 $pid $(($(now_ms) - t0)) $((t1 - t0))"
}

# metric NAME: the value of the allocatableMemory.available sample of NAME.
metric() {
    grep "^$1{signal=\"allocatableMemory.available\"}" | awk '{ print $2; exit }'
}

on_pressure() {
    local end=$((SECONDS + $1)) m avail thr
    while :; do
        m="$(metrics)"
        avail="$(metric criguard_signal_available <<<"$m")"
        thr="$(metric criguard_signal_threshold <<<"$m")"
        if [[ -n "$avail" && -n "$thr" ]] && ((thr > 0 && avail < thr)); then
            break
        fi
        ((SECONDS < end)) || die "no memory pressure in criguard's metrics within $1 s"
        sleep 0.1
    done
    echo "pressure $avail $thr"
    restart_one 1
}

report() {
    local since="$1" kubelet errors
    [[ "$since" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "report SINCE: epoch seconds, got '$since'"
    echo "STARTS=$(journalctl -u criguard.service --since "@$since" --no-pager -o cat | grep -c 'Started criguard.service')"
    echo "FAILURES=$(journalctl -u criguard.service --since "@$since" --no-pager -o cat | grep -c 'Failed with result')"
    echo "NRESTARTS=$(systemctl show -p NRestarts --value criguard.service)"
    echo "MAINPID=$(systemctl show -p MainPID --value criguard.service)"
    local down
    down="$(journalctl -u criguard.service --since "@$since" --no-pager -o short-unix |
        awk '/SIGTERM: draining/ { t = $1 } /forwarding CRI calls/ && t { printf "%s:%d ", t, ($1 - t) * 1000; t = 0 }')"
    echo "DOWNTIMES=$down"
    local journal
    journal="$(journalctl -u criguard.service --since "@$since" --no-pager -o short-unix)"
    echo "HANDOFFS=$(grep -c 'handoff: the new process accepts and guards' <<<"$journal")"
    echo "SERVING_MS=$(awk '/the binary was replaced on disk; handing over/ { t = $1 } /forwarding CRI calls/ && t { printf "%d ", ($1 - t) * 1000; t = 0 }' <<<"$journal")"
    kubelet="$(journalctl -u kubelet.service --since "@$since" --no-pager -o short-unix)"
    errors="$(grep 'rpc error' <<<"$kubelet")"
    echo "KUBELET_CRI_ERRORS=$(grep -c . <<<"$errors")"
    [[ -z "$errors" ]] || head -n 500 <<<"$errors" | sed 's/^/kubelet: /'
}

case "${1:-}" in
    now) date +%s ;;
    restart)
        [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "restart N: a positive count"
        first="${3:-1}"
        [[ "$first" =~ ^[0-9]+$ ]] || die "restart N FIRST: a number"
        for ((i = first; i < first + $2; i++)); do restart_one "$i" || exit 1; done
        ;;
    upgrade)
        [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "upgrade N: a positive count"
        first="${3:-1}"
        [[ "$first" =~ ^[0-9]+$ ]] || die "upgrade N FIRST: a number"
        for ((i = first; i < first + $2; i++)); do upgrade_one "$i" || exit 1; done
        ;;
    on-pressure)
        [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "on-pressure TIMEOUT: seconds"
        on_pressure "$2"
        ;;
    report) report "${2:?report SINCE}" ;;
    *) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
