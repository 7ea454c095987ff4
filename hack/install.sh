#!/usr/bin/env bash
# Install criguard next to containerd: the binary, its systemd units, a
# defaults file, an annotated /etc/criguard/config.toml (kept if present)
# and the README; then enable the socket and the service when
# systemd runs this machine. Idempotent. `--uninstall` removes it all again.
#
# Usage: hack/install.sh [--uninstall]
# Environment:
#   DESTDIR        install under this root instead of / (packaging, tests);
#                  systemctl is not touched then
#   CRIGUARD_BIN   a criguard binary to install instead of building one
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest="${DESTDIR:-}"
bin="$dest/usr/local/bin/criguard"
units="$dest/etc/systemd/system"
defaults="$dest/etc/default/criguard"
config="$dest/etc/criguard/config.toml"
doc="$dest/usr/local/share/doc/criguard"

systemd_live() { [[ -z "$dest" && -d /run/systemd/system ]]; }

if [[ "${1:-}" == "--uninstall" ]]; then
    if systemd_live; then
        systemctl disable --now criguard.service criguard.socket || true
    fi
    rm -f "$bin" "$units/criguard.service" "$units/criguard.socket" "$doc/README.md" "$doc/rbac.yaml" "$doc/admin.proto"
    rmdir "$doc" 2>/dev/null || true
    systemd_live && systemctl daemon-reload
    echo "criguard removed; $defaults and $config kept (remove them by hand)."
    echo "Point the kubelet back at containerd: --container-runtime-endpoint=unix:///run/containerd/containerd.sock"
    exit 0
fi

if [[ -z "${CRIGUARD_BIN:-}" ]]; then
    # build.rs generates the admin API from proto/ with protoc, and
    # containerd-client's build compiles containerd's protos with it.
    command -v protoc >/dev/null || [[ -n "${PROTOC:-}" ]] ||
        { echo "install.sh: protoc is needed to build: run hack/install-deps.sh (protobuf-compiler)" >&2; exit 1; }
    cargo build --release --bin criguard
    CRIGUARD_BIN=target/release/criguard
fi
install -D -m 0755 "$CRIGUARD_BIN" "$bin"
install -D -m 0644 systemd/criguard.service "$units/criguard.service"
install -D -m 0644 systemd/criguard.socket "$units/criguard.socket"
install -D -m 0644 README.md "$doc/README.md"
install -D -m 0644 deploy/rbac.yaml "$doc/rbac.yaml"
# The admin API's definition, for grpcurl and node agents.
install -D -m 0644 proto/criguard/admin/v1/admin.proto "$doc/admin.proto"
if [[ ! -e "$config" ]]; then
    install -D -m 0644 etc/config.toml "$config"
fi
"$CRIGUARD_BIN" check-config --config "$config" >/dev/null
if [[ ! -e "$defaults" ]]; then
    install -D -m 0644 /dev/null "$defaults"
    cat >"$defaults" <<'DEFAULTS'
# Extra options for `criguard serve` (see `criguard serve --help`), e.g.
#   CRIGUARD_OPTS="--dynamic-oom-score-adj=false --log-format json"
CRIGUARD_OPTS=""
DEFAULTS
fi
if systemd_live; then
    systemctl daemon-reload
    systemctl enable --now criguard.socket criguard.service
fi
echo "criguard installed at $bin."
echo "Change one kubelet flag and restart the kubelet:"
echo "  --container-runtime-endpoint=unix:///run/criguard/criguard.sock"
