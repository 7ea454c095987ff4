#!/usr/bin/env bash
# criguard's whole test suite: lint, unit tests, and the integration tests
# that start private containerds (so it needs root).
#
# Usage: hack/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "test.sh: run as root (the tests start containerd)" >&2; exit 1; }

hack/install-deps.sh
hack/clients.sh >/dev/null
cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test "$@"
