#!/usr/bin/env bash
# Build the real gRPC clients criguard's tests and benchmarks drive:
#   target/clients/crigo   grpc-go (Debian's golang-go and golang-google-grpc-dev,
#                          built offline from /usr/share/gocode, GOPATH mode)
#   target/clients/pyenv   a venv holding grpcio (PyPI, pinned in
#                          tests/clients/python/requirements.txt)
# Prints the two paths. Idempotent: rebuilds crigo only when a source is newer,
# touches pip only when the pinned grpcio is not already in the venv (so it
# runs offline once built). The Debian packages come from hack/install-deps.sh.
#
# Usage: hack/clients.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="$PWD/target/clients"
mkdir -p "$OUT"
# Tests and benches may call this concurrently: one build at a time.
exec 9>"$OUT/.lock"
flock 9

log() { echo "clients.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# --- grpc-go ---
GOSRC=tests/clients/go/crigo
command -v go >/dev/null || die "go not found: run hack/install-deps.sh (Debian golang-go)"
[[ -d /usr/share/gocode/src/google.golang.org/grpc ]] ||
    die "grpc-go sources missing: run hack/install-deps.sh (Debian golang-google-grpc-dev)"
if [[ ! -x "$OUT/crigo" ]] || [[ -n "$(find "$GOSRC" -newer "$OUT/crigo" -print -quit)" ]]; then
    log "building $OUT/crigo with $(go version | cut -d' ' -f3)"
    GOPATH=/usr/share/gocode GO111MODULE=off GOFLAGS= GOPROXY=off \
        GOCACHE="$OUT/gocache" CGO_ENABLED=0 \
        go build -o "$OUT/crigo.tmp" "./$GOSRC"
    mv "$OUT/crigo.tmp" "$OUT/crigo"
fi

# --- grpcio ---
REQ=tests/clients/python/requirements.txt
PIN="$(sed -n 's/^grpcio==\([0-9.]*\).*/\1/p' "$REQ")"
[[ -n "$PIN" ]] || die "$REQ must pin grpcio==VERSION"
VENV="$OUT/pyenv"
# Debian's interpreter, whatever python3 comes first on PATH.
PY=/usr/bin/python3
have_pin() {
    [[ -x "$VENV/bin/python" ]] &&
        "$VENV/bin/python" -c "import grpc, sys; sys.exit(grpc.__version__ != '$PIN')" 2>/dev/null
}
if ! have_pin; then
    [[ -x "$PY" ]] || die "$PY not found: run hack/install-deps.sh"
    "$PY" -c 'import ensurepip' 2>/dev/null || die "python3-venv missing: run hack/install-deps.sh"
    log "creating $VENV with grpcio $PIN"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --no-input -r "$REQ" ||
        die "pip install -r $REQ failed (PyPI reachable?)"
    have_pin || die "grpcio $PIN not importable from $VENV"
fi

echo "$OUT/crigo"
echo "$VENV"
