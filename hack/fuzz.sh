#!/usr/bin/env bash
# Fuzz the relay's frame reader and header-block path with cargo fuzz
# (libFuzzer), growing the committed corpus in fuzz/corpus/.
#
# Usage: hack/fuzz.sh [SECONDS per target, default 300] [TARGET ...]
#   targets: relay, header_block (default: both)
# cargo fuzz needs nightly flags; the machine's stable toolchain accepts them
# with RUSTC_BOOTSTRAP=1. The corpus replay in the test suite
# (tests/it/fuzz_corpus.rs) runs every input found here on each `hack/test.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-300}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(relay header_block)
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    echo "fuzz: $t for ${secs}s" >&2
    cargo fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" -max_len=65536 -print_final_stats=1
    # Keep the corpus small: only inputs that add coverage.
    tmp=$(mktemp -d)
    cargo fuzz run "$t" "$tmp" "fuzz/corpus/$t" -- -merge=1 >/dev/null 2>&1
    rm -rf "fuzz/corpus/$t" && mv "$tmp" "fuzz/corpus/$t"
done
