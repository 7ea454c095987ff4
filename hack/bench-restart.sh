#!/usr/bin/env bash
# Restart benchmark: calls a kubelet-like load sees fail across restarts of
# criguard, against the same restarts of a plain byte relay.
#
# One private containerd (hack/containerd.sh); two endpoints in front of it,
# each restarted the way systemd restarts a socket-activated service: the
# listening socket stays open in a supervisor (criguard.socket's role), each
# process gets it as fd 3 (LISTEN_FDS=1), a restart is SIGTERM, wait for the
# exit, start a new process. The load is hack/restart-load (the kubelet's own
# client stack, k8s.io/cri-client over grpc-go): ListPodSandbox,
# ListContainers and ContainerStatus every second, plus CreateContainer,
# StartContainer, StopContainer, RemoveContainer churn in one pod.
#   criguard: `criguard serve` (release build), SIGTERM drains with GOAWAY;
#   relay:    restart-load relay, bytes copied both ways, SIGTERM ends it
#             (what socat does: a byte relay cannot drain HTTP/2).
# Both run side by side against the same containerd.
#
# Usage: hack/bench-restart.sh [--restarts N] [--period DURATION]
#        (default 100 restarts, 2s of load between restarts: about 4 minutes)
# Prints, for each, calls, failed calls, failed calls per restart, drain
# (SIGTERM to exit) and gap (SIGTERM to a fresh connection answered) p50/max,
# and the failures' messages; then the ratio. Raw JSON in $OUT (printed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-restart.sh: run as root" >&2; exit 1; }
restarts=100
period=2s
while (($#)); do
    case "$1" in
        --restarts) restarts="$2"; shift 2 ;;
        --period) period="$2"; shift 2 ;;
        *) echo "usage: hack/bench-restart.sh [--restarts N] [--period DURATION]" >&2; exit 2 ;;
    esac
done
rl="$(hack/restart-load/build.sh)"
cargo build --release --bin criguard >&2
criguard="$PWD/target/release/criguard"
dir="$(mktemp -d /tmp/criguard-bench-restart.XXXXXX)"
OUT="$dir/out"
mkdir -p "$OUT"
cleanup() { hack/containerd.sh stop "$dir/ctrd" --purge >/dev/null 2>&1 || true; }
trap cleanup EXIT
sock="$(hack/containerd.sh start "$dir/ctrd" | tail -1)"

CRIGUARD_LOG=warn "$rl" bench -socket "$dir/criguard.sock" -restarts "$restarts" -period "$period" \
    -logs "$OUT" -name criguard -- "$criguard" serve --listen "$dir/unused.sock" \
    --admin-socket "$dir/admin.sock" --state-dir "$dir/state" --metrics-address none \
    --runtime-endpoint "unix://$sock" >"$OUT/criguard.json" 2>"$OUT/criguard.client.log" &
a=$!
"$rl" bench -socket "$dir/relay.sock" -restarts "$restarts" -period "$period" \
    -logs "$OUT" -name relay -- "$rl" relay -upstream "$sock" \
    >"$OUT/relay.json" 2>"$OUT/relay.client.log" &
b=$!
wait "$a" || { echo "criguard run failed: $(tail -3 "$OUT/criguard.client.log")" >&2; exit 1; }
wait "$b" || { echo "relay run failed: $(tail -3 "$OUT/relay.client.log")" >&2; exit 1; }

python3 - "$OUT/criguard.json" "$OUT/relay.json" <<'EOF'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:]]
print(f"{'':10} {'restarts':>8} {'calls':>7} {'failed':>7} {'per restart':>11} "
      f"{'drain p50/max ms':>17} {'gap p50/max ms':>15}")
for r in runs:
    d, g = r["drain_ms"], r["gap_ms"]
    print(f"{r['name']:10} {r['restarts']:>8} {r['calls']:>7} {r['failed']:>7} "
          f"{r['failed_per_restart']:>11.2f} {d['p50']:>8.1f}/{d['max']:<8.1f} "
          f"{g['p50']:>7.1f}/{g['max']:<7.1f}")
for r in runs:
    for m, n in sorted(r["by_method"]["messages"].items(), key=lambda x: -x[1]):
        print(f"  {r['name']}: {n} x {m}")
    if r["by_method"]["failed_outside_restarts"]:
        print(f"  {r['name']}: {r['by_method']['failed_outside_restarts']} failed outside any restart")
c, b = runs
if b["failed"]:
    print(f"criguard fails {c['failed']}/{b['failed']} = {c['failed'] / b['failed']:.2f} "
          f"of the byte relay's failed calls")
else:
    print(f"byte relay failed no call; criguard failed {c['failed']}")
EOF
echo "raw: $OUT" >&2
