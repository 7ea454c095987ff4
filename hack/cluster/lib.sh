# shellcheck shell=bash
# What hack/cluster.sh and hack/cluster/vm-node.sh both do, sourced by each
# first thing: messages and usage, checking DIR, reading and waiting on
# pids, writing kubeconfigs, the criguard ServiceAccount's token, node
# readiness and log tails. The sourcing script sets SELF (its own path,
# whose header comment is its usage) and defines kubectl_ (kubectl on the
# cluster with the admin kubeconfig).

# log MESSAGE: to stderr, after the script's name.
log() { echo "${SELF##*/}: $*" >&2; }

# die MESSAGE: log it as an error and exit 1.
die() {
    log "ERROR: $*"
    exit 1
}

# usage: the script's header comment, up to `set -euo`, then exit 2.
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
    exit 2
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# set_dir PATH: DIR=PATH, which must be absolute, not /, and without white
# space (a trailing slash dropped).
set_dir() {
    [[ "$1" == /* ]] || die "DIR must be an absolute path, got '$1'"
    DIR="${1%/}"
    [[ -n "$DIR" && "$DIR" != *[[:space:]]* ]] || die "DIR must not be / nor contain white space"
}

# alive PID, read_pid FILE (and has_arg, wait_gone).
# shellcheck source=hack/lib/procs.sh
source "$REPO_ROOT/hack/lib/procs.sh"

# gone PID: no thread of PID runs any more. A killed multi-threaded process
# shows its leader as a zombie while its other threads are still exiting
# (the last one unmaps the memory, which mlockall makes slower): those still
# hold the open files, a listening port among them, until they are gone
# from /proc/PID/task.
gone() {
    local threads
    alive "$1" && return 1
    threads="$(find "/proc/$1/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
    ((threads <= 1))
}

# wait_exit PID SECS: wait up to SECS for PID to go (every thread); fails if
# it has not.
wait_exit() {
    local end=$((SECONDS + $2))
    while ! gone "$1" && ((SECONDS < end)); do sleep 0.1; done
    gone "$1"
}

# kubeconfig FILE CLUSTER-LINES USER-LINES: a kubeconfig, mode 0600, for the
# cluster and the user described by the lines of their mappings (indented
# four spaces).
kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: criguard-cluster
  cluster:
$2
users:
- name: user
  user:
$3
contexts:
- name: criguard-cluster
  context:
    cluster: criguard-cluster
    user: user
current-context: criguard-cluster
EOF
    chmod 0600 "$1"
}

# criguard_token VAR: VAR set to a token (48 h) of criguard's ServiceAccount
# (deploy/rbac.yaml).
criguard_token() {
    # Not `token`: a local of that name would hide the caller's VAR.
    local criguard_token_value
    criguard_token_value="$(kubectl_ -n kube-system create token criguard --duration 48h)"
    [[ -n "$criguard_token_value" ]] || die "kubectl create token criguard gave nothing"
    printf -v "$1" '%s' "$criguard_token_value"
}

# node_ready NAME: the node's Ready condition is True.
node_ready() {
    [[ "$(kubectl_ get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# tail_logs LINES FILE...: the last LINES lines of each readable FILE, under a
# header naming it.
tail_logs() {
    local n="$1" f
    shift
    for f in "$@"; do
        [[ -r "$f" ]] || continue
        echo "===== $f (last $n lines)"
        tail -n "$n" "$f"
    done
}
