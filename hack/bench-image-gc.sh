#!/usr/bin/env bash
# Image GC benchmark: 50 unused images on a tmpfs imagefs at 90 %, brought
# under 80 % by criguard and by the kubelet's size arithmetic, side by side.
# Usage: hack/bench-image-gc.sh   (CRIGUARD_BENCH_IMAGES, CRIGUARD_BENCH_IMAGE_MIB size it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-image-gc.sh: run as root" >&2; exit 1; }
hack/install-deps.sh
CRIGUARD_LOG=warn cargo bench --bench image_gc
