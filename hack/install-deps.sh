#!/usr/bin/env bash
# Install the system packages the criguard integration tests need.
#
# Usage: hack/install-deps.sh
#
# Idempotent: apt is only touched when something is missing. The Rust
# toolchain is not installed here; it has to come with the machine.
set -euo pipefail

missing=()

# Plain commands that must be on PATH (protoc: build.rs generates the admin
# API from proto/).
# docker-registry: a private OCI registry on loopback for real pulls
# (hack/registry.sh); openssl: the cluster tier's certificates; ip: the
# CNI bridges of tests/it/critest.rs; bindfs: a FUSE filesystem whose daemon
# tests/it/hung_fs.rs stops to hang nodefs for real (this kernel has no nfsd);
# mkfs.ext4: the cluster tier's small imagefs (a loop ext4); conmon: the
# container monitor of the private CRI-O (hack/crio.sh).
for cmd in containerd runc ctr protoc skopeo systemd-socket-activate go socat docker-registry openssl ip curl bindfs mkfs.ext4 conmon; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        missing+=("$cmd")
    fi
done

# The images are built from the *static* busybox (package busybox-static);
# the dynamically linked one from package "busybox" would not run inside an
# image that carries no libc.
if [[ ! -x /bin/busybox ]] ||
    [[ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("busybox-static")
fi

# hack/crio.sh builds CRI-O with its seccomp support (cgo, libseccomp).
if [[ ! -e /usr/include/seccomp.h ]]; then
    missing+=("libseccomp-dev")
fi

# Pod networks (bridge, host-local, portmap, loopback) for critest and the
# cluster tier.
if [[ ! -x /usr/lib/cni/bridge ]]; then
    missing+=("containernetworking-plugins")
fi

# The real clients the proxy is tested with (hack/clients.sh builds them):
# grpc-go's sources for an offline GOPATH build, and a venv for grpcio.
if [[ ! -d /usr/share/gocode/src/google.golang.org/grpc ]]; then
    missing+=("golang-google-grpc-dev")
fi
if ! /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1; then
    missing+=("python3-venv")
fi

if ((${#missing[@]} > 0)); then
    echo "install-deps: missing: ${missing[*]}; installing with apt-get" >&2
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "install-deps: need root to run apt-get" >&2
        exit 1
    fi
    # One update, then a single install of everything (already installed
    # packages are simply kept).
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        containerd runc busybox-static protobuf-compiler skopeo systemd ca-certificates \
        golang-go golang-google-grpc-dev socat python3-venv docker-registry openssl iproute2 curl \
        containernetworking-plugins bindfs e2fsprogs conmon libseccomp-dev
else
    echo "install-deps: containerd, runc, ctr, busybox-static, protoc, skopeo, systemd-socket-activate," \
        "go, grpc-go, socat, python3-venv, docker-registry, openssl, ip, curl, CNI plugins, bindfs, mkfs.ext4, conmon, libseccomp-dev present" >&2
fi

# promtool (deploy/: `promtool test rules` and `check metrics`, tests/it/deploy.rs)
# comes with Debian's prometheus package, whose postinst would also enable and
# start a Prometheus server listening on every interface (:9090) through its
# init script or unit. Installed with starting denied (policy-rc.d 101), then
# the server disabled and stopped, should anything have started it anyway:
# this machine needs the tool, not the server.
if ! command -v promtool >/dev/null 2>&1; then
    echo "install-deps: missing: promtool; installing prometheus (server left disabled)" >&2
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "install-deps: need root to run apt-get" >&2
        exit 1
    fi
    policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus ||
        { [[ -n "$policy" ]] && rm -f "$policy"; exit 1; }
    [[ -n "$policy" ]] && rm -f "$policy"
    if [[ -d /run/systemd/system ]]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    else
        # What `systemctl disable` would remove, should systemd boot here later.
        rm -f /etc/systemd/system/multi-user.target.wants/prometheus.service
    fi
    update-rc.d prometheus disable >/dev/null 2>&1 || true
    if [[ -x /etc/init.d/prometheus ]] && /etc/init.d/prometheus status >/dev/null 2>&1; then
        /etc/init.d/prometheus stop || true
    fi
fi

# cargo is not ours to install: say so clearly instead of failing later.
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: ERROR: cargo not found on PATH. The Rust toolchain must be" \
        "provided by the machine (e.g. rustup; try: source \"\$HOME/.cargo/env\")." >&2
    exit 1
fi
