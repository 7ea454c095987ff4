#!/usr/bin/env bash
# criguard's whole test suite: lint, unit tests, and the integration tests
# that start private containerds (so it needs root), the VM tier and the
# cluster tier.
#
# Usage: hack/test.sh                 everything (below)
#        hack/test.sh [cargo test arguments]
#                                     lint, then `cargo test ARGS` alone, on
#                                     the containerd CRIGUARD_CONTAINERD picks
#
# Everything is, after one build of every test binary:
#   1. the whole suite on Debian's containerd 1.6 (the host's packages), the
#      VM and cluster tiers running beside the rest;
#   2. the runtime-facing tests again on containerd 2.3 built from its Go
#      module (lifecycle, clients, crictl, critest, eviction, GC, events,
#      model, usage, restart, OOM, reload): CRIGUARD_CONTAINERD=2. critest runs here
#      only (containerd 2 is what nodes run today; one run is ~2.5 min);
#   3. the pressure tests with criguard as an NRI plugin of containerd 2;
#   4. one scenario against CRI-O 1.34 (hack/crio.sh): NRI plugin and proxy.
# The cluster tier (tests/it/cluster.rs, tests/it/cluster_vm.rs) runs its nodes on
# containerd 2 in step 1 already.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "test.sh: run as root (the tests start containerd)" >&2; exit 1; }

hack/install-deps.sh
# The real stack from its Go modules (Kubernetes, etcd, containerd 2,
# cri-tools): built once per pinned version into a cache outside the clone.
hack/k8s/build.sh
hack/restart-load/build.sh >/dev/null   # tests/it/drain.rs' kubelet-like load
hack/crio.sh build >/dev/null           # tests/it/crio.rs' CRI-O
hack/clients.sh >/dev/null
hack/check-docs.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

if (($# > 0)); then
    exec cargo test "$@"
fi

# The integration tests are one binary, tests/it/main.rs (besides
# tests/bounds.rs, which must run alone, and tests/vm/, which runs in the
# VM); its groups are filters on its module paths. A filter is a substring
# of the test's path:
# `eviction::` also takes `disk_eviction::` and `pid_eviction::`, `gc::`
# `image_gc::`, `events::` `task_events::` (`cargo test --test it -- --list`
# shows what a group takes).
#
# The cluster tier (a control plane, the VM node under QEMU TCG: mostly one
# busy core) runs beside the rest of the suite (which mostly waits on
# containerd, then boots the VM tier), the two groups about as long as each
# other. Each group's lines carry its tag.
tiers=(cluster:: cluster_vm::)
# Containerd 2 again: the runtime-facing modules (critest only here).
# criguard as an NRI plugin (CRIGUARD_MODE=nri: containerd 2 with NRI on,
# the pods created on containerd, criguard attached): the pressure, OOM and
# GC tests.
nri=(eviction:: oom:: gc:: nri:: --skip pid_eviction::)
# nri:: tests NRI here and in the NRI group; on containerd 1.6, which has
# no NRI on, its tests say so and pass (a --skip would also drop the NRI
# unit tests, whose paths hold nri:: too).
runtime=(lifecycle:: clients:: crictl:: critest:: eviction:: gc:: events::
         model:: usage:: restart:: oom:: reload:: nri:: --skip pid_eviction::)

cargo test --no-run --workspace --all-targets >/dev/null

# Every group's lines also go to one log, so the end of the run can name
# what failed: CI keeps only the tail of the output, and the tiers' lines
# interleave with the rest.
log=$(mktemp /tmp/criguard-test-log.XXXXXX)
trap 'rm -f "$log"' EXIT
tag() { sed -u "s/^/[$1] /" | tee -a "$log"; }

# The failed tests (libtest's closing `failures:` list of each binary, the
# VM's inner one included) and the first lines of every panic, last.
summary() {
    local failed
    failed=$(awk '
        { line = $0; prefix = ""
          while (match(line, /^ *\[[^]]+\] ?/)) { prefix = prefix substr(line, 1, RLENGTH); line = substr(line, RLENGTH + 1) } }
        line == "failures:" { list[prefix] = ""; next }
        line ~ /^test result: / { if (list[prefix] != "") printf "%s", list[prefix]; delete list[prefix]; next }
        (prefix in list) && line ~ /^    [^ ]+$/ { list[prefix] = list[prefix] prefix line "\n" }
    ' "$log")
    [[ -n $failed ]] || return 0
    echo "test.sh: failed:" >&2
    echo "$failed" >&2
    echo "test.sh: their panics:" >&2
    grep -E -A6 "panicked at " "$log" | head -n 80 >&2 || true
}

run_tiers() {
    local start=$SECONDS rc=0
    echo "test.sh: [tiers] the cluster tier (containerd 2.3 on the nodes)" >&2
    # 5 of the VM node's 20 restarts under the kubelet (each ~7 s under TCG);
    # `cargo test --test it -- cluster_vm::` alone runs all 20.
    CRIGUARD_CLUSTER_VM_RESTARTS=5 cargo test --no-fail-fast --test it -- "${tiers[@]}" 2>&1 | tag tiers || rc=1
    echo "test.sh: [tiers] done in $((SECONDS - start)) s" >&2
    return "$rc"
}

run_host() {
    local start=$SECONDS rc=0
    echo "test.sh: [1.6] unit tests and the host's integration tests on containerd 1.6" >&2
    (unset CRIGUARD_CONTAINERD
     kit=0
     cargo test --no-fail-fast -p criguard-test-kit --lib || kit=1
     cargo test --no-fail-fast --lib --bins --test it --test bounds -- "${tiers[@]/#/--skip=}" \
         --skip critest_passes_and_fails_the_same_specs_through_criguard && exit "$kit") 2>&1 | tag 1.6 || rc=1
    echo "test.sh: [1.6] done in $((SECONDS - start)) s" >&2
    start=$SECONDS
    echo "test.sh: [2.x] the runtime-facing tests on containerd 2" >&2
    CRIGUARD_CONTAINERD=2 cargo test --no-fail-fast --test it -- "${runtime[@]}" 2>&1 | tag 2.x || rc=1
    echo "test.sh: [2.x] done in $((SECONDS - start)) s" >&2
    start=$SECONDS
    echo "test.sh: [nri] the pressure, OOM and GC tests with criguard attached to containerd 2 by NRI" >&2
    CRIGUARD_CONTAINERD=2 CRIGUARD_MODE=nri cargo test --no-fail-fast --test it -- "${nri[@]}" 2>&1 | tag nri || rc=1
    echo "test.sh: [nri] done in $((SECONDS - start)) s" >&2
    start=$SECONDS
    echo "test.sh: [crio] criguard against CRI-O 1.34 (NRI plugin and proxy)" >&2
    CRIGUARD_CRIO=1 cargo test --no-fail-fast --test it -- crio:: 2>&1 | tag crio || rc=1
    echo "test.sh: [crio] done in $((SECONDS - start)) s" >&2
    start=$SECONDS
    echo "test.sh: [vm] the VM tier (cgroup v2, systemd)" >&2
    cargo test --no-fail-fast --test vm 2>&1 | tag vm || rc=1
    echo "test.sh: [vm] done in $((SECONDS - start)) s" >&2
    return "$rc"
}

start=$SECONDS
run_tiers &
tiers_pid=$!
failed=0
run_host || failed=1
wait "$tiers_pid" || failed=1
summary
echo "test.sh: everything done in $((SECONDS - start)) s; $([[ $failed == 0 ]] && echo passed || echo FAILED)" >&2
exit "$failed"
