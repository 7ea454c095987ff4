#!/usr/bin/env bash
# Build the real components the cluster tier and the containerd 2 tests run,
# from their published Go modules, pinned by the wrapper modules beside this
# script (go.mod and go.sum committed):
#
#   kubernetes/    kubelet, kube-apiserver, kube-controller-manager,
#                  kube-scheduler, kubectl  (v1.37.2)
#   kubelet-1.34/  the older kubelet        (v1.34.4)
#   etcd/          etcd                     (v3.6.16)
#   containerd/    containerd, containerd-shim-runc-v2, ctr (v2.3.7)
#   cri-tools/     crictl, critest          (v1.37.0)
#
# Each component lands in its own directory of a cache outside the clone,
# keyed by its version and a hash of its go.mod/go.sum, so CI on the same
# machine reuses it and a fresh machine builds it once:
#
#   $CRIGUARD_STACK_CACHE (default /var/cache/criguard/stack)/<name>-<version>-<hash>/bin
#
# Usage: hack/k8s/build.sh [component ...]   (default: all)
#        hack/k8s/build.sh --path component  (print its bin directory; builds if missing)
#
# runc is Debian's (containerd 2.3 accepts runc 1.1). Module downloads go to
# the ordinary Go module cache and build objects to the ordinary Go build
# cache; both are reused across components.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CRIGUARD_STACK_CACHE:-/var/cache/criguard/stack}"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local

all=(containerd etcd cri-tools kubernetes kubelet-1.34)

# The wrapper modules need Go 1.26 (containerd v2.3.7 asks for go 1.26.8).
# Debian's golang-go (1.19, installed for hack/clients.sh) may come first on
# PATH; the machine's own toolchain lives in /usr/local/go.
go_ok() { "$1" version 2>/dev/null | grep -Eq 'go1\.(2[6-9]|[3-9][0-9])(\.|[^0-9])'; }
for g in "$(command -v go || true)" /usr/local/go/bin/go; do
    if [[ -n "$g" ]] && go_ok "$g"; then
        export PATH="$(dirname "$g"):$PATH"
        break
    fi
done
go_ok go || { echo "build.sh: Go 1.26 or newer is needed (found: $(go version 2>&1 || echo none))" >&2; exit 1; }

# version NAME: the pinned version of the component's main module.
version() {
    case "$1" in
        kubernetes | kubelet-1.34) awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/$1/go.mod" ;;
        etcd) awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/$1/go.mod" ;;
        containerd) awk '$1=="require" && $2=="github.com/containerd/containerd/v2" {print $3}' "$here/$1/go.mod" ;;
        cri-tools) awk '$1=="require" && $2=="sigs.k8s.io/cri-tools" {print $3}' "$here/$1/go.mod" ;;
        *) echo "build.sh: unknown component '$1' (known: ${all[*]})" >&2; exit 2 ;;
    esac
}

# dir NAME: the cache directory of the component as pinned now.
dir() {
    local v hash
    v="$(version "$1")"
    hash="$(cat "$here/$1/go.mod" "$here/$1/go.sum" | sha256sum | cut -c1-12)"
    echo "$cache/$1-$v-$hash"
}

# k8s_ldflags VERSION: the version stamps Kubernetes' own build sets.
k8s_ldflags() {
    local v="$1" minor
    minor="$(echo "$v" | cut -d. -f2)"
    local f="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$f"
}

build_one() {
    local name="$1" out v start lock
    out="$(dir "$name")"
    # One builder per component at a time (CI, a test and a person may ask
    # at once): the lock is released when this shell exits.
    mkdir -p "$cache"
    exec {lock}>"$cache/.$name.lock"
    flock "$lock"
    if [[ -f "$out/.complete" ]]; then
        echo "build.sh: $name $(version "$name") cached in $out" >&2
        return
    fi
    v="$(version "$name")"
    start=$(date +%s)
    echo "build.sh: building $name $v into $out" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/bin"
    (
        cd "$here/$name"
        case "$name" in
            kubernetes)
                go build -trimpath -ldflags "$(k8s_ldflags "$v")" -o "$out.tmp/bin/" \
                    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver \
                    k8s.io/kubernetes/cmd/kube-controller-manager \
                    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
                ;;
            kubelet-1.34)
                go build -trimpath -ldflags "$(k8s_ldflags "$v")" -o "$out.tmp/bin/kubelet" \
                    k8s.io/kubernetes/cmd/kubelet
                ;;
            etcd)
                go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/etcd" .
                ;;
            containerd)
                local pkg=github.com/containerd/containerd/v2
                go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
                    -ldflags "-s -w -X $pkg/version.Version=$v -X $pkg/version.Revision=module" \
                    -o "$out.tmp/bin/" \
                    $pkg/cmd/containerd $pkg/cmd/containerd-shim-runc-v2 $pkg/cmd/ctr
                ;;
            cri-tools)
                local pkg=sigs.k8s.io/cri-tools
                go build -trimpath -ldflags "-s -w -X $pkg/pkg/version.Version=$v" \
                    -o "$out.tmp/bin/crictl" $pkg/cmd/crictl
                # critest is cri-tools' Ginkgo suite, built as a test binary.
                go test -c -trimpath -ldflags "-s -w -X $pkg/pkg/version.Version=$v" \
                    -o "$out.tmp/bin/critest" $pkg/cmd/critest
                ;;
        esac
    )
    echo "$name $v built in $(($(date +%s) - start)) s, $(du -sh "$out.tmp/bin" | cut -f1)" \
        >"$out.tmp/.complete"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "build.sh: $(cat "$out/.complete")" >&2
}

if [[ "${1:-}" == "--path" ]]; then
    [[ -n "${2:-}" ]] || { echo "usage: build.sh --path component" >&2; exit 2; }
    [[ -f "$(dir "$2")/.complete" ]] || build_one "$2" >&2
    echo "$(dir "$2")/bin"
    exit 0
fi

if (($# == 0)); then set -- "${all[@]}"; fi
for name in "$@"; do
    version "$name" >/dev/null
done
for name in "$@"; do
    build_one "$name"
done
