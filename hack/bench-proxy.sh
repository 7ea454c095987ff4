#!/usr/bin/env bash
# Proxy overhead benchmark, one run: containerd direct, socat, our own byte
# relay (examples/byte_relay) and criguard, side by side, with tonic, grpc-go
# and grpcio clients.
# Usage: hack/bench-proxy.sh   (CRIGUARD_BENCH_CONTAINERS, CRIGUARD_BENCH_CALLS,
#        CRIGUARD_BENCH_CLIENTS, CRIGUARD_BENCH_DIAL, CRIGUARD_BENCH_RELAY_MODE:
#        see benches/proxy.rs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-proxy.sh: run as root" >&2; exit 1; }
hack/install-deps.sh
hack/clients.sh >/dev/null
cargo build --release --example byte_relay
CRIGUARD_LOG=warn cargo bench --bench proxy
