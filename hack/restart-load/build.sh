#!/usr/bin/env bash
# Build restart-load (the kubelet-like load across restarts that
# hack/bench-restart.sh and tests/it/drain.rs run) from this module, pinned by
# go.mod/go.sum, into the stack cache beside hack/k8s/build.sh's components:
#
#   $CRIGUARD_STACK_CACHE (default /var/cache/criguard/stack)/restart-load-<hash>/bin/restart-load
#
# keyed by a hash of go.mod, go.sum and main.go. Prints the binary's path.
# Needs Go 1.26 (the machine's /usr/local/go; Debian's 1.19 is too old for
# k8s.io/cri-client).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CRIGUARD_STACK_CACHE:-/var/cache/criguard/stack}"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
go_ok() { "$1" version 2>/dev/null | grep -Eq 'go1\.(2[6-9]|[3-9][0-9])(\.|[^0-9])'; }
for g in "$(command -v go || true)" /usr/local/go/bin/go; do
    if [[ -n "$g" ]] && go_ok "$g"; then
        export PATH="$(dirname "$g"):$PATH"
        break
    fi
done
go_ok go || { echo "restart-load/build.sh: Go 1.26 or newer is needed" >&2; exit 1; }
hash="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-12)"
out="$cache/restart-load-$hash"
mkdir -p "$cache"
exec {lock}>"$cache/.restart-load.lock"
flock "$lock"
if [[ ! -x "$out/bin/restart-load" ]]; then
    echo "restart-load/build.sh: building into $out" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/bin"
    (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/restart-load" .)
    rm -rf "$out"
    mv "$out.tmp" "$out"
fi
echo "$out/bin/restart-load"
