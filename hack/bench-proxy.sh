#!/usr/bin/env bash
# Proxy overhead benchmark: containerd direct vs through criguard, side by side.
# Usage: hack/bench-proxy.sh   (CRIGUARD_BENCH_CONTAINERS, CRIGUARD_BENCH_CALLS size it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-proxy.sh: run as root" >&2; exit 1; }
hack/install-deps.sh
CRIGUARD_LOG=warn cargo bench --bench proxy
