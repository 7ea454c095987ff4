#!/usr/bin/env bash
# Build CRI-O from its Go module and run a private instance of it entirely
# under one directory, with NRI on, for the criguard integration tests
# (tests/it/crio.rs) or by hand.
#
# Usage:
#   hack/crio.sh build
#       Build crio (github.com/cri-o/cri-o v1.34.0, from the Go module
#       proxy) and pinns (its C helper, from the same module, linked
#       statically) once into
#       $CRIGUARD_STACK_CACHE (default /var/cache/criguard/stack)/cri-o-v1.34.0/bin;
#       skipped when already there. The last line on stdout is that bin dir.
#   hack/crio.sh start DIR
#       Create DIR (absolute path), write DIR/crio.conf, load the pause and
#       busybox images (built by hack/images.sh) into DIR's vfs storage with
#       skopeo, start crio in the background (log DIR/crio.log, pid
#       DIR/crio.pid) and wait until it answers on DIR/crio.sock and its NRI
#       socket DIR/nri.sock exists. The last line on stdout is DIR/crio.sock.
#   hack/crio.sh stop DIR
#       Stop crio (by the PID in DIR/crio.pid), then the containers' processes
#       and their conmons (by the PIDs in crio's and runc's state under DIR),
#       remove the containers' cgroups, unmount everything under DIR and
#       remove DIR. Safe to call twice, or after a failed start.
#
# Runtime: Debian's conmon (/usr/bin/conmon) and runc (/usr/sbin/runc);
# cgroupfs cgroup manager; vfs storage; CNI: only the loopback plugin of
# Debian's containernetworking-plugins (host-network pods only). Every
# socket is a unix socket under DIR: CRI DIR/crio.sock, NRI DIR/nri.sock;
# the streaming server listens on 127.0.0.1, a random port.
#
# What this host cannot do: root here lacks CAP_SYS_RESOURCE, so a negative
# oom_score_adj cannot be set, and CRI-O gives its infra (pause) container
# -998. With drop_infra_ctr = true (CRI-O's default) no infra container is
# made for a pod whose network namespace is the node's and whose pid
# namespace is per container (NamespaceOption network NODE, pid CONTAINER):
# run those pods only.
#
# Environment:
#   CRIGUARD_IMAGE_CACHE   where hack/images.sh keeps its archives
#                          (default: <repo>/target/criguard-images)
#   CRIGUARD_STACK_CACHE   the build cache (default /var/cache/criguard/stack)
#   CRIGUARD_CRIO_TIMEOUT  seconds to wait for startup (default 60)
#   CRIGUARD_CRIO_BIN      bin dir with crio and pinns (default: build)
set -euo pipefail
export LC_ALL=C

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
# shellcheck source=hack/lib/mounts.sh
source "$REPO_ROOT/hack/lib/mounts.sh"
# shellcheck source=hack/lib/procs.sh
source "$REPO_ROOT/hack/lib/procs.sh"
IMAGE_CACHE="${CRIGUARD_IMAGE_CACHE:-$REPO_ROOT/target/criguard-images}"
STACK_CACHE="${CRIGUARD_STACK_CACHE:-/var/cache/criguard/stack}"
TIMEOUT="${CRIGUARD_CRIO_TIMEOUT:-60}"
CRIO_VERSION=v1.34.0
CRIO_MODULE=github.com/cri-o/cri-o
# What CRI-O's own Makefile leaves out or stubs for a build without the
# btrfs, devicemapper, ostree and gpgme development headers.
CRIO_TAGS="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper seccomp"
PAUSE_IMAGE="registry.k8s.io/pause:3.9"

log() { echo "crio.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
    exit 2
}

# ---- build --------------------------------------------------------------------

# Go 1.24 or newer (cri-o v1.34.0 asks for go 1.24.1): the machine's own
# toolchain in /usr/local/go when Debian's older golang-go comes first.
use_go() {
    local g
    go_ok() { "$1" version 2>/dev/null | grep -Eq 'go1\.(2[4-9]|[3-9][0-9])(\.|[^0-9])'; }
    for g in "$(command -v go || true)" /usr/local/go/bin/go; do
        if [[ -n "$g" ]] && go_ok "$g"; then
            PATH="$(dirname "$g"):$PATH"
            export PATH
            return
        fi
    done
    die "Go 1.24 or newer is needed (found: $(go version 2>&1 || echo none))"
}

do_build() {
    local out="$STACK_CACHE/cri-o-$CRIO_VERSION" lock work src start
    mkdir -p "$STACK_CACHE"
    exec {lock}>"$STACK_CACHE/.cri-o.lock"
    flock "$lock"
    if [[ -f "$out/.complete" && -x "$out/bin/crio" && -x "$out/bin/pinns" ]]; then
        log "cri-o $CRIO_VERSION cached in $out"
        echo "$out/bin"
        return
    fi
    use_go
    command -v cc >/dev/null || die "no C compiler (cc) for crio's cgo and pinns"
    pkg-config --exists libseccomp 2>/dev/null ||
        [[ -e /usr/include/seccomp.h ]] || die "libseccomp-dev missing (hack/install-deps.sh)"
    start=$(date +%s)
    log "building cri-o $CRIO_VERSION into $out (a few minutes)"
    work="$(mktemp -d)"
    # shellcheck disable=SC2064 # expand now: $work is local
    trap "rm -rf '$work'" EXIT
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/bin"
    (
        cd "$work"
        export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -p=1" CGO_ENABLED=1
        # A wrapper module requiring cri-o: only exact versions are served
        # by the proxy, so the version is named, not resolved.
        printf 'module criguard.local/crio\n\ngo 1.24.1\n' >go.mod
        printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/crio"\n' "$CRIO_MODULE" >tools.go
        # sum.golang.org does not know some pseudo-versions cri-o pins
        # (containerd/nri, CloudNativeAI/model-spec): cri-o's own go.sum
        # vouches for them, before anything resolves them.
        go mod download "$CRIO_MODULE@$CRIO_VERSION" >&2
        src="$(go env GOMODCACHE)/$CRIO_MODULE@$CRIO_VERSION"
        install -m 644 "$src/go.sum" go.sum
        go get "$CRIO_MODULE@$CRIO_VERSION" >&2
        go mod tidy >&2
        go build -tags "$CRIO_TAGS" -ldflags "-s -w" -o "$out.tmp/bin/crio" "$CRIO_MODULE/cmd/crio" >&2
        cc -std=c99 -O2 -Wall -static -o "$out.tmp/bin/pinns" "$src"/pinns/src/*.c >&2
    )
    echo "cri-o $CRIO_VERSION built in $(($(date +%s) - start)) s" >"$out.tmp/.complete"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    log "$(cat "$out/.complete")"
    echo "$out/bin"
}

# ---- paths and processes ------------------------------------------------------

set_paths() {
    [[ "$1" == /* ]] || die "DIR must be an absolute path, got '$1'"
    DIR="${1%/}"
    [[ -n "$DIR" ]] || die "refusing to use / as DIR"
    [[ "$DIR" != *[[:space:]]* ]] || die "DIR must not contain white space"
    CFG="$DIR/crio.conf"
    SOCK="$DIR/crio.sock"
    NRI_SOCK="$DIR/nri.sock"
    PIDFILE="$DIR/crio.pid"
    LOG="$DIR/crio.log"
    ROOT="$DIR/root"
    RUNROOT="$DIR/runroot"
    RUNC_ROOT="$DIR/runroot/runc"
}

# Does PID's command line contain STRING anywhere?
cmdline_has() {
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# The crio of this DIR, if running: the pid file's process, if it runs
# crio with our config.
our_crio() {
    local pid
    pid="$(read_pid "$PIDFILE")"
    if [[ -n "$pid" ]] && alive "$pid" && has_arg "$pid" "$CFG"; then
        echo "$pid"
    fi
}

# Does crio answer on its socket? (CRI-O serves its HTTP info endpoint on
# the CRI socket too.)
answers() {
    curl -sf --max-time 2 --unix-socket "$SOCK" http://localhost/info >/dev/null 2>&1
}

# ---- start --------------------------------------------------------------------

write_config() {
    cat >"$CFG" <<EOF
# Generated by hack/crio.sh; edits are overwritten on the next start.
[crio]
root = "$ROOT"
runroot = "$RUNROOT"
storage_driver = "vfs"
log_dir = "$DIR/pod-logs"
version_file = "$RUNROOT/version"
version_file_persist = "$ROOT/version"
clean_shutdown_file = "$ROOT/clean.shutdown"

[crio.api]
listen = "$SOCK"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
pinns_path = "$BIN/pinns"
container_exits_dir = "$RUNROOT/exits"
container_attach_socket_dir = "$RUNROOT/attach"
namespaces_dir = "$RUNROOT/ns"
hooks_dir = ["$DIR/hooks"]
cdi_spec_dirs = ["$DIR/cdi"]
default_mounts_file = ""
seccomp_profile = ""
apparmor_profile = "unconfined"
selinux = false

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_type = "oci"
runtime_root = "$RUNC_ROOT"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
signature_policy = "$DIR/policy.json"
signature_policy_dir = "$DIR/policies"
pause_image = "$PAUSE_IMAGE"

[crio.network]
network_dir = "$DIR/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = true
nri_listen = "$NRI_SOCK"
nri_plugin_dir = "$DIR/nri-plugins"
nri_plugin_config_dir = "$DIR/nri-conf"
# A plugin has 10 s to answer (NRI's default is 2 s), as the containerd
# tests give it: a loaded test machine can stall criguard that long.
nri_plugin_request_timeout = "10s"
EOF
}

start_failed() {
    log "start failed; last lines of $LOG:"
    tail -n 40 "$LOG" >&2 2>/dev/null || true
    log "cleaning up"
    do_stop || true
}

do_start() {
    local pid end images t0 t name
    t0="$(date +%s%N)"
    # Unix socket paths are limited to 107 bytes.
    ((${#SOCK} <= 107)) || die "DIR too long for a unix socket path: $SOCK"
    [[ -z "$(our_crio)" ]] || die "crio already running for $DIR (pid $(our_crio)); stop it first"
    [[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "CRIGUARD_CRIO_TIMEOUT must be a positive integer"
    [[ -x /usr/bin/conmon ]] || die "conmon missing (hack/install-deps.sh)"
    [[ -x /usr/sbin/runc ]] || die "runc missing (hack/install-deps.sh)"
    command -v skopeo >/dev/null || die "skopeo missing (hack/install-deps.sh)"

    if [[ -n "${CRIGUARD_CRIO_BIN:-}" ]]; then
        BIN="$CRIGUARD_CRIO_BIN"
    else
        BIN="$(do_build | tail -n1)"
    fi
    [[ -x "$BIN/crio" && -x "$BIN/pinns" ]] || die "crio or pinns missing in '$BIN'"

    mkdir -p "$DIR"/{root,runroot,pod-logs,conf.d,hooks,cdi,policies,nri-plugins,nri-conf,cni/net.d}
    write_config
    echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$DIR/policy.json"
    if [[ -x /usr/lib/cni/loopback ]]; then
        echo '{"cniVersion":"1.0.0","name":"loopback","plugins":[{"type":"loopback"}]}' \
            >"$DIR/cni/net.d/99-loopback.conflist"
    fi

    # Build (or reuse) the images before starting anything.
    mapfile -t images < <("$REPO_ROOT/hack/images.sh" "$IMAGE_CACHE")
    ((${#images[@]} == 2)) || die "hack/images.sh did not produce the images"

    # From here on a failure (or being interrupted) stops whatever was
    # started.
    trap start_failed EXIT
    trap 'exit 130' INT TERM HUP

    # The images into crio's storage, under the names in their archives,
    # before crio holds it.
    for t in "${images[@]}"; do
        name="$(sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p' \
            < <(tar -xOf "$t" ./index.json 2>/dev/null || tar -xOf "$t" index.json))"
        [[ -n "$name" ]] || die "no image name in $t"
        skopeo --policy "$DIR/policy.json" copy --quiet "oci-archive:$t" \
            "containers-storage:[vfs@$ROOT+$RUNROOT]$name" >&2 || die "loading $t failed"
    done

    # Own session, no inherited stdio, log appended to DIR/crio.log.
    # --config-dir: an empty drop-in dir (else /etc/crio/crio.conf.d).
    echo "=== $(date -u '+%Y-%m-%dT%H:%M:%SZ') hack/crio.sh start" >>"$LOG"
    setsid "$BIN/crio" --config "$CFG" --config-dir "$DIR/conf.d" --log-level info \
        </dev/null >>"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"

    end=$((SECONDS + TIMEOUT))
    until answers && [[ -S "$NRI_SOCK" ]]; do
        alive "$pid" || die "crio (pid $pid) exited during startup"
        ((SECONDS < end)) || die "crio did not answer on $SOCK within ${TIMEOUT}s"
        sleep 0.1
    done

    trap - EXIT INT TERM HUP
    log "cri-o $CRIO_VERSION ($BIN/crio) pid $pid ready in $((($(date +%s%N) - t0) / 1000000)) ms (log: $LOG)"
    echo "$SOCK"
}

# ---- stop ---------------------------------------------------------------------

# Field 22 of /proc/PID/stat: the process's start time in clock ticks.
start_time() {
    sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}

do_stop() {
    local pid st id init started conmon cg m kill_pids=() conmon_pids=() cg_dirs=() f p

    # 1. crio itself (it leaves the containers running when it stops).
    pid="$(our_crio)"
    if [[ -n "$pid" ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone 15 "$pid"; then
            log "crio (pid $pid) ignores SIGTERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone 5 "$pid" || log "warning: crio (pid $pid) survives"
        fi
    fi

    # 2. The containers: runc's state under DIR names each init process
    #    (trusted only if its start time matches) and its cgroups.
    for st in "$RUNC_ROOT"/*/state.json; do
        [[ -r "$st" ]] || continue
        init="$(sed -n 's/.*"init_process_pid":\([0-9]*\).*/\1/p' "$st")"
        started="$(sed -n 's/.*"init_process_start":\([0-9]*\).*/\1/p' "$st")"
        if [[ -n "$init" ]] && alive "$init" && [[ "$(start_time "$init")" == "$started" ]]; then
            kill_pids+=("$init")
        fi
        while IFS= read -r cg; do
            [[ -n "$cg" && -d "$cg" ]] && cg_dirs+=("$cg")
        done < <(grep -o '"cgroup_paths":{[^}]*}' "$st" | grep -o '"/sys/fs/cgroup/[^"]*"' | tr -d '"' | sort -u)
    done

    # 3. Their conmons: crio's state under DIR names each one's pid; trusted
    #    only if its command line names this container's bundle under DIR.
    for f in "$RUNROOT"/*-containers/*/userdata/conmon-pidfile; do
        [[ -r "$f" ]] || continue
        conmon="$(read_pid "$f")"
        id="$(basename "$(dirname "$(dirname "$f")")")"
        if [[ -n "$conmon" ]] && alive "$conmon" && cmdline_has "$conmon" "$id" &&
            cmdline_has "$conmon" "$DIR/"; then
            conmon_pids+=("$conmon")
            # The conmon's own cgroups (monitor_cgroup "pod": a leaf
            # crio-conmon-<id> in the pod's cgroup).
            while IFS= read -r cg; do
                for m in /sys/fs/cgroup/*; do
                    [[ -d "$m$cg" && "$cg" == */crio-conmon-* ]] && cg_dirs+=("$m$cg")
                done
            done < <(cut -d: -f3 "/proc/$conmon/cgroup" 2>/dev/null | sort -u)
        fi
    done

    # The pods' own (empty) cgroups beside their containers':
    #    <parent>/crio-<sandbox id>, for every id in crio's storage under DIR.
    if ((${#cg_dirs[@]})); then
        while IFS= read -r cg; do
            for id in "$ROOT"/*-containers/*/; do
                id="$(basename "$id")"
                [[ "$id" =~ ^[0-9a-f]{64}$ && -d "$cg/crio-$id" ]] && cg_dirs+=("$cg/crio-$id")
            done
        done < <(printf '%s\n' "${cg_dirs[@]}" | xargs -r -n1 dirname | sort -u)
    fi

    # 4. Kill the containers (init pids plus whatever is in their cgroups),
    #    then the conmons.
    for _ in 1 2 3 4 5; do
        for f in "${cg_dirs[@]}"; do
            [[ "$f" == */crio-conmon-* ]] && continue
            while read -r p; do
                [[ "$p" =~ ^[0-9]+$ ]] && kill_pids+=("$p")
            done 2>/dev/null <"$f/cgroup.procs" || true
        done
        ((${#kill_pids[@]})) || break
        mapfile -t kill_pids < <(printf '%s\n' "${kill_pids[@]}" | sort -un)
        log "killing container processes: ${kill_pids[*]}"
        kill -KILL "${kill_pids[@]}" 2>/dev/null || true
        wait_gone 5 "${kill_pids[@]}" || log "warning: some container processes survive"
        kill_pids=()
    done
    if ((${#conmon_pids[@]})); then
        log "killing conmons: ${conmon_pids[*]}"
        kill -KILL "${conmon_pids[@]}" 2>/dev/null || true
        wait_gone 5 "${conmon_pids[@]}" || log "warning: some conmons survive"
    fi

    # 5. The containers' and conmons' leaf cgroups (parents may be shared).
    for f in "${cg_dirs[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            [[ -d "$f" ]] || break
            rmdir "$f" 2>/dev/null && break
            sleep 0.1
        done
        [[ ! -d "$f" ]] || log "warning: cannot remove cgroup $f"
    done

    # 6. Unmount everything below DIR (storage layers, shm, namespaces).
    [[ -d "$DIR" ]] && unmount_under "$DIR"
    rm -f "$PIDFILE"
    log "stopped $DIR"
}

# ---- main ---------------------------------------------------------------------

[[ $# -ge 1 ]] || usage
cmd="$1"
shift
case "$cmd" in
    build)
        [[ $# -eq 0 ]] || usage
        do_build
        ;;
    start)
        [[ $# -eq 1 ]] || usage
        set_paths "$1"
        do_start
        ;;
    stop)
        [[ $# -eq 1 ]] || usage
        set_paths "$1"
        do_stop
        if [[ -d "$DIR" ]]; then
            [[ -z "$(mounts_under "$DIR")" ]] || die "mounts remain under $DIR; not removing it"
            rm -rf --one-file-system "$DIR"
        fi
        ;;
    *)
        usage
        ;;
esac
