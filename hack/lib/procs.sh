# shellcheck shell=bash
# Process helpers shared by hack/containerd.sh, hack/crio.sh and
# hack/cluster/lib.sh (sourced): a process is only ever signalled by the
# PID its script recorded, after checking it is still the one it started.

# alive PID: the process exists and is neither a zombie nor dead.
alive() {
    local state
    [[ -r "/proc/$1/stat" ]] || return 1
    state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# has_arg PID ARG: PID's command line holds ARG as one whole argument.
has_arg() {
    tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF -- "$2"
}

# read_pid FILE: the pid in FILE (one whole-line number), or nothing if
# there is none.
read_pid() {
    local p=""
    [[ -r "$1" ]] && p="$(tr -d ' \n' <"$1" 2>/dev/null || true)"
    [[ "$p" =~ ^[1-9][0-9]*$ ]] && echo "$p"
    return 0
}

# wait_gone SECS PID...: wait until none of the PIDs is alive, up to SECS
# seconds; fails if one still is.
wait_gone() {
    local end=$((SECONDS + $1)) p left
    shift
    while :; do
        left=0
        for p in "$@"; do alive "$p" && left=1; done
        ((left)) || return 0
        ((SECONDS < end)) || return 1
        sleep 0.05
    done
}
