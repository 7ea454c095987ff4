#!/usr/bin/env bash
# Node scale benchmark: N pods (default 250 × 2 containers) created through
# criguard in front of a private containerd; idle CPU, RSS, admin command
# times, List calls direct vs criguard, restart to first answer, and
# pressure → StopPodSandbox with every other pod present.
# Usage: hack/bench-scale.sh   (CRIGUARD_SCALE_PODS, CRIGUARD_SCALE_IDLE,
#        CRIGUARD_SCALE_TRIALS: see benches/scale.rs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-scale.sh: run as root" >&2; exit 1; }
hack/install-deps.sh
CRIGUARD_LOG="${CRIGUARD_LOG:-warn}" cargo bench --bench scale
