#!/usr/bin/env bash
# Run a private containerd (with its CRI plugin) entirely under one directory,
# for the criguard integration tests or by hand.
#
# Usage:
#   hack/containerd.sh start DIR
#       Create DIR (absolute path), write DIR/config.toml, start containerd in
#       the background (log DIR/containerd.log, pid DIR/containerd.pid), wait
#       until it answers, check that the CRI plugin loaded, and import the
#       pause and busybox images (built by hack/images.sh) into namespace
#       k8s.io. The last line on stdout is the containerd socket path
#       (DIR/containerd.sock), which also serves the CRI API.
#   hack/containerd.sh stop DIR [--purge]
#       Kill everything that containerd started (container processes, shims)
#       and containerd itself, by PID only; unmount whatever is mounted under
#       DIR; remove the containers' leaf cgroups. Leaves DIR in place unless
#       --purge is given. Safe to call twice, or after a failed start.
#   hack/containerd.sh import DIR TARBALL...
#       Import more image archives (e.g. from hack/images.sh --filler) into
#       namespace k8s.io of the running instance, unpacked for overlayfs.
#
# Environment:
#   CRIGUARD_IMAGE_CACHE           where hack/images.sh keeps its archives
#                                  (default: <repo>/target/criguard-images)
#   CRIGUARD_CONTAINERD_EXTRA_TOML TOML merged into the generated config:
#                                  keys it sets override ours, section by
#                                  section, one "key = value" per line (an
#                                  array may span lines); top-level keys such
#                                  as root = "..." may come first; new
#                                  sections are appended.
#   CRIGUARD_CONTAINERD_TIMEOUT    seconds to wait for startup (default 30)
#   CRIGUARD_CONTAINERD            which containerd start runs: "1.6" (the
#                                  default) is Debian's /usr/bin/containerd
#                                  1.6 with a version = 2 config; "2" is
#                                  containerd 2.x built by hack/k8s/build.sh
#                                  (containerd, its own shim and ctr; bin dir
#                                  from `hack/k8s/build.sh --path containerd`)
#                                  with a version = 3 config. The sections
#                                  EXTRA_TOML names differ between the two.
#                                  stop and import read the version from
#                                  DIR/config.toml, whatever this says.
#   CRIGUARD_CONTAINERD2_BIN       bin dir of containerd 2.x (default: ask
#                                  hack/k8s/build.sh --path containerd)
#
# Not everything stays under DIR: containerd 1.6 shims put their sockets in
# /run/containerd/s/<sha256> (hard-coded; the hash covers DIR's socket path,
# so instances do not collide). Containers started with plain `ctr run`
# (not via CRI) also use /run/containerd/fifo/<n>/ for stdio fifos and, unless
# given --runc-root, /run/containerd/runc/<ns>/<id> for runc state. Container
# cgroups are /sys/fs/cgroup/*/<cgroupsPath>, e.g. /k8s.io/<id> when the pod
# sets no cgroup parent. stop removes all of those that belong to this
# instance (the shared parent directories stay).
#
# containerd 2.x: shim sockets go to DIR/s (socket_dir of the shim manager)
# when DIR is short enough for a unix socket path (len(DIR) <= 40), else to
# /run/containerd/s/<sha256 of DIR's socket path> as with 1.6; NRI is
# disabled (its default socket /var/run/nri/nri.sock would be shared by all
# instances); CDI spec dirs, the image verifier's bin dir and the temp dir are
# under DIR; `imports` is empty (2.x would otherwise read
# /etc/containerd/conf.d/*.toml). The sandbox (pause) image is pinned with
# pinned_images.sandbox; pod netns under DIR/state (netns_mounts_under_state_dir).
set -euo pipefail
export LC_ALL=C

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
# shellcheck source=hack/lib/mounts.sh
source "$REPO_ROOT/hack/lib/mounts.sh"
# shellcheck source=hack/lib/procs.sh
source "$REPO_ROOT/hack/lib/procs.sh"
IMAGE_CACHE="${CRIGUARD_IMAGE_CACHE:-$REPO_ROOT/target/criguard-images}"
NS=k8s.io
SNAPSHOTTER=overlayfs
TIMEOUT="${CRIGUARD_CONTAINERD_TIMEOUT:-30}"

log() { echo "containerd.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
    exit 2
}

# Set the paths of an instance from its directory argument.
set_paths() {
    [[ "$1" == /* ]] || die "DIR must be an absolute path, got '$1'"
    DIR="${1%/}"
    [[ -n "$DIR" ]] || die "refusing to use / as DIR"
    [[ "$DIR" != *[[:space:]]* ]] || die "DIR must not contain white space"
    CFG="$DIR/config.toml"
    SOCK="$DIR/containerd.sock"
    PIDFILE="$DIR/containerd.pid"
    LOG="$DIR/containerd.log"
}

ctr_() { "${CTR:-ctr}" --address "$SOCK" "$@"; }

# Which containerd ("1.6" or "2") CRIGUARD_CONTAINERD asks for: sets WANTED.
wanted_version() {
    case "${CRIGUARD_CONTAINERD:-1.6}" in
        1.6) WANTED=1.6 ;;
        2) WANTED=2 ;;
        *) die "CRIGUARD_CONTAINERD must be 1.6 or 2, got '${CRIGUARD_CONTAINERD}'" ;;
    esac
}

# Version of the instance in DIR, from the layout of its config.toml
# (version = 3 is containerd 2.x); empty if there is no config.
instance_version() {
    local v
    [[ -r "$CFG" ]] || return 0
    v="$(config_get '' version 2)"
    if [[ "$v" == 3 || "$v" == 4 ]]; then echo 2; else echo 1.6; fi
}

# Select containerd VERSION: sets VERSION and CRI_RUNC_OPTIONS (the config
# section of the runc options).
use_version() {
    VERSION="$1"
    if [[ "$VERSION" == 2 ]]; then
        CRI_RUNC_OPTIONS='[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]'
    else
        CRI_RUNC_OPTIONS='[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]'
    fi
}

# The binaries of VERSION: sets CONTAINERD, CTR and SHIM_DIR (where the daemon
# must find its shim first).
use_binaries() {
    if [[ "$VERSION" == 2 ]]; then
        BIN="${CRIGUARD_CONTAINERD2_BIN:-}"
        if [[ -z "$BIN" ]]; then
            BIN="$("$REPO_ROOT/hack/k8s/build.sh" --path containerd | tail -n1)" ||
                die "hack/k8s/build.sh --path containerd failed"
        fi
        [[ -x "$BIN/containerd" && -x "$BIN/containerd-shim-runc-v2" && -x "$BIN/ctr" ]] ||
            die "containerd 2 binaries missing in '$BIN' (CRIGUARD_CONTAINERD2_BIN or hack/k8s/build.sh)"
        CONTAINERD="$BIN/containerd"
        CTR="$BIN/ctr"
        SHIM_DIR="$BIN"
    else
        CONTAINERD="$(command -v containerd || true)"
        [[ -n "$CONTAINERD" ]] || die "containerd not installed (hack/install-deps.sh)"
        CTR=ctr
        SHIM_DIR=""
    fi
}

# Directory for the shims' sockets of a 2.x instance: DIR/s when
# DIR/s/<64 hex digits> fits a unix socket path (107 bytes), else "" (the
# default, /run/containerd/s).
shim_socket_dir() {
    if ((${#DIR} + 3 + 64 <= 107)); then echo "$DIR/s"; fi
}

# ---- configuration ------------------------------------------------------------

# Merge TOML file $2 into $1 (both "one key per line" TOML), printing the
# result: same section + same key -> the line from $2 wins; new keys and new
# sections are added. Comments of $1 are kept, those of $2 dropped.
toml_merge() {
    awk '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
    # net count of "[" minus "]" outside double-quoted strings and comments
    function depth(s,   i, c, n, q) {
        n = 0; q = 0
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (q) { if (c == "\\") i++; else if (c == "\"") q = 0; continue }
            if (c == "\"") q = 1
            else if (c == "#") break
            else if (c == "[") n++
            else if (c == "]") n--
        }
        return n
    }
    function addkey(sec, key, text) {
        if (!((sec, key) in val)) keys[sec, ++nkeys[sec]] = key
        val[sec, key] = text
    }
    FNR == 1 { sec = ""; cont = 0 }
    cont { val[sec, key] = val[sec, key] "\n" $0; d += depth($0); if (d <= 0) cont = 0; next }
    {
        t = trim($0)
        if (t == "") next
        if (t ~ /^#/) { if (FILENAME == ARGV[1]) addkey(sec, "#" NR, $0); next }
        if (t ~ /^\[/) {
            sub(/\][ \t]*#.*$/, "]", t)
            sec = t
            if (!(sec in seen)) { seen[sec] = 1; order[++nsec] = sec }
            next
        }
        eq = index(t, "=")
        if (eq == 0) { printf "bad TOML line in %s: %s\n", FILENAME, $0 > "/dev/stderr"; bad = 1; exit 1 }
        key = trim(substr(t, 1, eq - 1))
        addkey(sec, key, $0)
        d = depth(substr(t, eq + 1)); if (d > 0) cont = 1
    }
    END {
        if (bad) exit 1
        for (i = 1; i <= nkeys[""]; i++) print val["", keys["", i]]
        for (s = 1; s <= nsec; s++) {
            sec = order[s]
            print ""; print sec
            for (i = 1; i <= nkeys[sec]; i++) print val[sec, keys[sec, i]]
        }
    }' "$1" "$2"
}

write_config() {
    local base="$DIR/config.base.toml" extra="$DIR/config.extra.toml"
    if [[ "$VERSION" == 2 ]]; then
        write_config_v3 >"$base"
    else
        write_config_v2 >"$base"
    fi
    printf '%s\n' "${CRIGUARD_CONTAINERD_EXTRA_TOML:-}" >"$extra"
    toml_merge "$base" "$extra" >"$CFG.tmp"
    mv -f "$CFG.tmp" "$CFG"
    rm -f "$base" "$extra"
}

# The daemon's own sections, the same in both layouts: sockets under DIR, no
# debug or metrics listener, the opt plugin's directory under DIR.
daemon_sections() {
    cat <<EOF
[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  # No debug or metrics listeners.
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  # Default would be /opt/containerd.
  path = "$DIR/opt"
EOF
}

# containerd 1.6: version = 2 layout.
write_config_v2() {
    cat <<EOF
# Generated by hack/containerd.sh; edits are overwritten on the next start.
version = 2
# containerd's own persistent and runtime state, including the CRI plugin's
# (DIR/root/io.containerd.grpc.v1.cri, DIR/state/io.containerd.grpc.v1.cri).
root = "$DIR/root"
state = "$DIR/state"
# Leave our oom_score_adj alone (a negative one cannot be set here).
oom_score = 0
# Snapshotters that cannot work on this host; disabling them keeps the log
# free of their load errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

EOF
    daemon_sections
    cat <<EOF

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  # Root here lacks CAP_SYS_RESOURCE: clamp negative oom_score_adj requests
  # (the sandbox asks for -998) instead of failing.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pod network namespaces under DIR/state instead of /var/run/netns.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.grpc.v1.cri".cni]
  # No CNI config: only host-network pods can be run.
  bin_dir = "/usr/lib/cni"
  conf_dir = "$DIR/cni/net.d"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "$SNAPSHOTTER"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  # cgroupfs driver; runc state under DIR/runc, not /run/containerd/runc.
  SystemdCgroup = false
  Root = "$DIR/runc"
EOF
}

# containerd 2.x: version = 3 layout (the CRI plugin split into
# io.containerd.cri.v1.runtime, io.containerd.cri.v1.images and the gRPC
# service io.containerd.grpc.v1.cri).
write_config_v3() {
    local sockdir
    sockdir="$(shim_socket_dir)"
    cat <<EOF
# Generated by hack/containerd.sh (containerd 2.x); edits are overwritten on
# the next start.
version = 3
# containerd's own persistent and runtime state, including the CRI plugins'
# (DIR/root/io.containerd.cri.v1.images, DIR/state/io.containerd.grpc.v1.cri).
root = "$DIR/root"
state = "$DIR/state"
temp = "$DIR/tmp"
# No drop-ins from /etc/containerd/conf.d.
imports = []
# Leave our oom_score_adj alone (a negative one cannot be set here).
oom_score = 0
# Plugins that cannot work on this host or would use paths shared with other
# instances; disabling them keeps the log free of their load errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri"]

EOF
    daemon_sections
    cat <<EOF

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "$DIR/opt/image-verifier/bin"

[plugins."io.containerd.nri.v1.nri"]
  # Disabled above; should it be enabled, its socket is ours alone.
  disable = true
  socket_path = "$DIR/nri/nri.sock"
  plugin_path = "$DIR/nri/plugins"
  plugin_config_path = "$DIR/nri/conf.d"

[plugins."io.containerd.shim.v1.manager"]
  # Shim sockets under DIR (empty: /run/containerd/s, DIR being too long).
  socket_dir = "$sockdir"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "$SNAPSHOTTER"

[plugins."io.containerd.cri.v1.images".pinned_images]
  # The imported pause image; the CRI marks it pinned.
  sandbox = "registry.k8s.io/pause:3.9"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here lacks CAP_SYS_RESOURCE: clamp negative oom_score_adj requests
  # (the sandbox asks for -998) instead of failing.
  restrict_oom_score_adj = true
  enable_selinux = false
  # Pod network namespaces under DIR/state instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  # CDI specs (none) read from DIR, not /etc/cdi and /var/run/cdi.
  cdi_spec_dirs = ["$DIR/cdi"]

[plugins."io.containerd.cri.v1.runtime".cni]
  # No CNI config: only host-network pods can be run.
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$DIR/cni/net.d"

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  # cgroupfs driver; runc state under DIR/runc, not /run/containerd/runc.
  SystemdCgroup = false
  Root = "$DIR/runc"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

# Value of KEY in [SECTION] ("" = top level) of DIR/config.toml, unquoted.
config_get() { # config_get SECTION KEY DEFAULT
    local v=""
    if [[ -r "$CFG" ]]; then
        v="$(awk -v want="$1" -v key="$2" '
            /^[ \t]*\[/ { s = $0; gsub(/^[ \t]+|[ \t]+$/, "", s); next }
            /^[ \t]*#/ { next }
            {
                if (s != want) next
                i = index($0, "="); if (!i) next
                k = substr($0, 1, i - 1); gsub(/[ \t]/, "", k)
                if (k != key) next
                v = substr($0, i + 1); sub(/^[ \t]+/, "", v)
                if (v ~ /^"/) { v = substr(v, 2); v = substr(v, 1, index(v, "\"") - 1) }
                else { sub(/[ \t]*#.*$/, "", v); sub(/[ \t]+$/, "", v) }
                print v; exit
            }' s="" "$CFG")"
    fi
    echo "${v:-$3}"
}

# ---- start --------------------------------------------------------------------

start_failed() {
    log "start failed; last lines of $LOG:"
    tail -n 40 "$LOG" >&2 2>/dev/null || true
    log "cleaning up"
    do_stop || true
}

# The shim containerd 2.x will run (first containerd-shim-runc-v2 in the
# PATH it gets) must be its own 2.x build, not Debian's 1.6 one.
check_shim() {
    local shim v
    shim="$(PATH="$SHIM_DIR:$PATH" command -v containerd-shim-runc-v2 || true)"
    [[ "$shim" == "$SHIM_DIR/containerd-shim-runc-v2" ]] ||
        die "containerd 2 would run shim '$shim', not $SHIM_DIR/containerd-shim-runc-v2"
    v="$("$shim" -v 2>/dev/null | awk '$1 == "Version:" { print $2 }')"
    [[ "$v" == v2.* ]] || die "shim $shim reports version '$v', not v2.x"
}

do_start() {
    local pid end images log_off cri_status t0 p
    t0="$(date +%s%N)"

    # Unix socket paths are limited to 107 bytes.
    ((${#SOCK} + 6 <= 107)) || die "DIR too long for a unix socket path: $SOCK.ttrpc"

    pid="$(read_pid "$PIDFILE")"
    if [[ -z "$pid" ]] || ! is_our_containerd "$pid"; then
        pid="$(find_our_containerd)"
    fi
    [[ -z "$pid" ]] || die "containerd already running for $DIR (pid $pid); stop it first"
    [[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "CRIGUARD_CONTAINERD_TIMEOUT must be a positive integer"

    # Layout; the CNI conf dir must exist (it is watched) but stays empty.
    mkdir -p "$DIR"/{root,state,runc,opt,cni/net.d}
    if [[ "$VERSION" == 2 ]]; then
        mkdir -p "$DIR"/{tmp,cdi}
        [[ -z "$(shim_socket_dir)" ]] || mkdir -p "$(shim_socket_dir)"
        check_shim
    fi
    write_config

    # Build (or reuse) the images before starting anything.
    mapfile -t images < <("$REPO_ROOT/hack/images.sh" "$IMAGE_CACHE")
    ((${#images[@]} == 2)) || die "hack/images.sh did not produce the images"

    # From here on a failure (or being interrupted) stops whatever was
    # started.
    trap start_failed EXIT
    trap 'exit 130' INT TERM HUP

    # Own session, no inherited stdio (a caller reading our stdout must not
    # wait on containerd), log appended to DIR/containerd.log.
    echo "=== $(date -u '+%Y-%m-%dT%H:%M:%SZ') hack/containerd.sh start" >>"$LOG"
    log_off="$(stat -c %s "$LOG")"
    # containerd looks its shim up in PATH (after its own directory); with
    # 2.x its bin dir comes first, so Debian's 1.6 shim in /usr/bin is not
    # the one it runs.
    PATH="${SHIM_DIR:+$SHIM_DIR:}$PATH" setsid "$CONTAINERD" --config "$CFG" </dev/null >>"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"

    # Poll until the API answers, bailing out early if containerd died.
    end=$((SECONDS + TIMEOUT))
    until ctr_ version >/dev/null 2>&1; do
        alive "$pid" || die "containerd (pid $pid) exited during startup"
        ((SECONDS < end)) || die "containerd did not answer on $SOCK within ${TIMEOUT}s"
        sleep 0.05
    done

    # The CRI plugins must have loaded ("ok"), not "error"/"skip": in 1.6
    # one, io.containerd.grpc.v1 cri; in 2.x that one (the gRPC service)
    # plus io.containerd.cri.v1 runtime and images.
    local plugins want
    plugins="$(ctr_ plugins ls 2>/dev/null)"
    if [[ "$VERSION" == 2 ]]; then
        want=("io.containerd.grpc.v1 cri" "io.containerd.cri.v1 runtime" "io.containerd.cri.v1 images")
    else
        want=("io.containerd.grpc.v1 cri")
    fi
    for p in "${want[@]}"; do
        cri_status="$(awk -v t="${p% *}" -v id="${p#* }" '$1 == t && $2 == id { print $NF }' <<<"$plugins")"
        [[ "$cri_status" == ok ]] || die "CRI plugin $p status is '${cri_status:-missing}', not ok"
    done

    # Import (and unpack for the CRI snapshotter) pause and busybox.
    import_images "${images[@]}"

    # The CRI service marks itself ready right after starting its streaming
    # server; wait for that log line too (only logged at info level or finer).
    case "$(config_get '[debug]' level info)" in
        trace | debug | info)
            until grep -q 'Start streaming server' < <(tail -c "+$((log_off + 1))" "$LOG"); do
                alive "$pid" || die "containerd (pid $pid) exited during startup"
                ((SECONDS < end)) || die "CRI plugin did not start within ${TIMEOUT}s"
                sleep 0.05
            done
            ;;
    esac

    trap - EXIT INT TERM HUP
    log "containerd $VERSION ($CONTAINERD) pid $pid ready in $((($(date +%s%N) - t0) / 1000000)) ms (log: $LOG)"
    echo "$SOCK"
}

import_images() {
    local t
    for t in "$@"; do
        [[ -r "$t" ]] || die "no such archive: $t"
        ctr_ -n "$NS" images import --snapshotter "$SNAPSHOTTER" "$t" >&2 ||
            die "importing $t failed"
    done
}

# ---- stop ---------------------------------------------------------------------

# Parent pid of PID (empty if gone).
ppid_of() {
    awk '$1 == "PPid:" { print $2 }' "/proc/$1/status" 2>/dev/null || true
}

# Is PID in cgroup path CG (in any hierarchy)?
in_cgroup() {
    awk -F: -v cg="$2" '$3 == cg { f = 1 } END { exit !f }' "/proc/$1/cgroup" 2>/dev/null
}

# Is PID a live containerd shim serving our containerd?
is_our_shim() {
    [[ -n "$1" ]] && alive "$1" && has_arg "$1" "$SOCK" &&
        [[ "$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n1)" == *containerd-shim* ]]
}

# All live shims whose command line carries "-address DIR/containerd.sock".
find_our_shims() {
    local d p
    for d in /proc/[0-9]*; do
        p="${d#/proc/}"
        is_our_shim "$p" && echo "$p"
    done
    return 0
}

# Directories in /run/containerd/fifo (where ctr puts the stdio fifos of
# the tasks it starts) that the given shims hold open.
ctr_fifo_dirs() {
    local p fd t
    for p in "$@"; do
        for fd in "/proc/$p/fd/"*; do
            t="$(readlink "$fd" 2>/dev/null || true)"
            [[ "$t" =~ ^/run/containerd/fifo/[0-9]+/[^/]+$ ]] && dirname "$t"
        done
    done | sort -u
}

# Is PID a live containerd started with our config file?
is_our_containerd() {
    alive "$1" && has_arg "$1" "$CFG" &&
        [[ "$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n1)" == *containerd ]]
}

find_our_containerd() {
    local d
    for d in /proc/[0-9]*; do
        if is_our_containerd "${d#/proc/}"; then
            echo "${d#/proc/}"
            return 0
        fi
    done
    return 0
}

# cgroup mount points of this host (v1 hierarchies and/or the v2 tree).
cgroup_mounts() {
    awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == "cgroup" || $(i + 1) == "cgroup2") print $5 }' /proc/self/mountinfo
}

do_stop() {
    local state root runc_root pid b id ns cg init shim addr m f p rr
    local -a cgm=() kill_pids=() fifo_dirs=() shim_pids=() cg_dirs=() sockets=() runc_dirs=()

    if [[ ! -d "$DIR" ]]; then
        log "$DIR does not exist; nothing to stop"
        return 0
    fi
    state="$(config_get '' state "$DIR/state")"
    root="$(config_get '' root "$DIR/root")"
    runc_root="$(config_get "$CRI_RUNC_OPTIONS" Root "$DIR/runc")"

    # 1. containerd first, so that it starts nothing new meanwhile: the
    #    recorded pid if it is really our containerd, else (start killed
    #    before it wrote the pid file) one run with "--config DIR/config.toml".
    pid="$(read_pid "$PIDFILE")"
    if [[ -z "$pid" ]] || ! is_our_containerd "$pid"; then
        pid="$(find_our_containerd)"
    fi
    if [[ -n "$pid" ]]; then
        log "stopping containerd (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone 10 "$pid"; then
            log "containerd did not exit on TERM; killing"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone 5 "$pid" || log "warning: containerd pid $pid still alive"
        fi
    fi

    # 2. Every task bundle: container processes, its shim, cgroup, sockets.
    mapfile -t cgm < <(cgroup_mounts)
    for b in "$state"/io.containerd.runtime.v2.task/*/*/; do
        [[ -d "$b" ]] || continue
        b="${b%/}"
        id="${b##*/}"
        ns="$(basename "$(dirname "$b")")"

        # Shim (containerd 1.6.20 and 2.3 write no shim.pid; the init's
        # parent is the shim): must be a shim talking to *our* containerd.
        shim="$(read_pid "$b/shim.pid")"
        if [[ -z "$shim" ]] && init="$(read_pid "$b/init.pid")" && [[ -n "$init" ]]; then
            shim="$(ppid_of "$init")"
        fi
        is_our_shim "$shim" || shim=""
        # Shim socket: 1.6 writes it to "address", 2.x to bootstrap.json.
        addr="$(cat "$b/address" 2>/dev/null || true)"
        [[ -n "$addr" ]] ||
            addr="$(sed -n 's/.*"address":"\([^"]*\)".*/\1/p' "$b/bootstrap.json" 2>/dev/null || true)"
        addr="${addr#unix://}"
        [[ "$addr" == /run/containerd/s/* ]] && sockets+=("$addr")

        # cgroup of the container (cgroupfs-style paths only).
        cg="$(sed -n 's/.*"cgroupsPath":"\([^"]*\)".*/\1/p' "$b/config.json" 2>/dev/null || true)"
        if [[ "$cg" == /* && "$cg" != *..* ]]; then
            for m in "${cgm[@]}"; do
                [[ -d "$m$cg" ]] && cg_dirs+=("$m$cg")
            done
        fi

        # init process: trust init.pid only if it is in the container's
        # cgroup or a child of the container's shim.
        init="$(read_pid "$b/init.pid")"
        if [[ -n "$init" ]] && alive "$init"; then
            if { [[ -n "$cg" ]] && in_cgroup "$init" "$cg"; } ||
                [[ -n "$shim" && "$(ppid_of "$init")" == "$shim" ]]; then
                kill_pids+=("$init")
            fi
        fi

        # runc state of this container, wherever its root is: removed later
        # if it belongs to this very container (same init pid).
        rr="$(sed -n 's/.*"[Rr]oot":"\([^"]*\)".*/\1/p' "$b/options.json" 2>/dev/null || true)"
        for rr in "${rr:-/run/containerd/runc}" "$runc_root"; do
            if [[ -n "$init" && -r "$rr/$ns/$id/state.json" ]] &&
                grep -q "\"init_process_pid\":${init}[,}]" "$rr/$ns/$id/state.json"; then
                runc_dirs+=("$rr/$ns/$id")
            fi
        done
    done

    # 3. Kill the containers: init pids plus whatever is in their cgroups
    #    (exec'd processes, host-pid-namespace children), repeatedly in case
    #    something forks while we kill.
    for _ in 1 2 3 4 5; do
        for f in "${cg_dirs[@]}"; do
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

    # 4. Then the shims: those found above plus any other process whose
    #    command line is "containerd-shim* ... -address DIR/containerd.sock"
    #    (e.g. of bundles already deleted). Note the stdio fifos they hold
    #    that ctr created in /run/containerd/fifo, to remove them afterwards.
    mapfile -t -O "${#shim_pids[@]}" shim_pids < <(find_our_shims)
    if ((${#shim_pids[@]})); then
        mapfile -t shim_pids < <(printf '%s\n' "${shim_pids[@]}" | sort -un)
        mapfile -t fifo_dirs < <(ctr_fifo_dirs "${shim_pids[@]}")
        log "killing shims: ${shim_pids[*]}"
        kill -KILL "${shim_pids[@]}" 2>/dev/null || true
        wait_gone 5 "${shim_pids[@]}" || log "warning: some shims survive"
    fi
    # Their sockets (shim sockets are keyed by a hash of our socket path),
    # and ctr's fifos.
    ((${#sockets[@]} == 0)) || rm -f "${sockets[@]}"
    ((${#fifo_dirs[@]} == 0)) || rm -rf "${fifo_dirs[@]}"
    # runc state directories that described our (now dead) containers.
    ((${#runc_dirs[@]} == 0)) || rm -rf "${runc_dirs[@]}"

    # 5. Leaf cgroups of the containers (parents may be shared; kept).
    for f in "${cg_dirs[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            [[ -d "$f" ]] || break
            rmdir "$f" 2>/dev/null && break
            sleep 0.1
        done
        [[ ! -d "$f" ]] || log "warning: cannot remove cgroup $f"
    done

    # 6. Unmount everything below DIR (and root/state if moved elsewhere).
    unmount_under "$DIR" "$state" "$root"

    rm -f "$PIDFILE"
    log "stopped $DIR"
}

# ---- main ---------------------------------------------------------------------

[[ $# -ge 2 ]] || usage
cmd="$1"
set_paths "$2"
shift 2

case "$cmd" in
    start)
        [[ $# -eq 0 ]] || usage
        wanted_version
        use_version "$WANTED"
        use_binaries
        do_start
        ;;
    stop)
        purge=0
        case "${1:-}" in
            "") ;;
            --purge) purge=1 ;;
            *) usage ;;
        esac
        wanted_version
        v="$(instance_version)"
        use_version "${v:-$WANTED}"
        do_stop
        if ((purge)) && [[ -d "$DIR" ]]; then
            [[ -z "$(mounts_under "$DIR")" ]] || die "mounts remain under $DIR; not removing it"
            rm -rf --one-file-system "$DIR"
        fi
        ;;
    import)
        [[ $# -ge 1 ]] || usage
        wanted_version
        v="$(instance_version)"
        use_version "${v:-$WANTED}"
        use_binaries
        ctr_ version >/dev/null 2>&1 || die "no containerd answering on $SOCK"
        import_images "$@"
        ;;
    *)
        usage
        ;;
esac
