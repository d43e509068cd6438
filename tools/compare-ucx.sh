#!/usr/bin/env bash
# Compare tent's small-op rate over shm with UCX's posix transport, measured
# one after the other in the same run so the ratio comes from one machine
# state (issue 16's yardstick):
#   1. UCX:  `ucx_perftest -t ucp_put_bw -s SIZE -n ITERS` (server and client
#            on 127.0.0.1, UCX_TLS=posix,self: one-sided puts into the
#            server's shared memory). UCX posts no completion per put: its
#            figure is a message rate with completions only per window.
#   2. tent: `tent-bench --block-size SIZE --batch N` over shm, one CQE per op
#            (the app refills each slot as its CQE arrives).
# It prints both rates and tent/UCX, then tent-bench's own floors for the
# same point (the rings alone between the same two cores, a cross-core
# ping-pong).
#
# Requirements: ucx-utils (installed with apt-get when missing; needs root or
# sudo), cargo for tent-bench.
#
# Environment:
#   TENT_BENCH   path to a tent-bench binary; skips `cargo build`
#   UCX_ITERS    ucx_perftest -n (default 5000000: shorter runs swing 2x)
#
# Example:
#   tools/compare-ucx.sh
#   tools/compare-ucx.sh --size 4096 --batch 32 --duration 3
set -euo pipefail

SIZE=8
BATCH=32
DURATION=3
ITERS=${UCX_ITERS:-5000000}

while [ "$#" -gt 0 ]; do
  case "$1" in
    --size) SIZE=${2:?--size needs a value}; shift 2 ;;
    --batch) BATCH=${2:?--batch needs a value}; shift 2 ;;
    --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare-ucx: unknown argument $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if ! command -v ucx_perftest >/dev/null 2>&1; then
  $SUDO apt-get install -y ucx-utils >/dev/null
fi
if [ -z "${TENT_BENCH:-}" ]; then
  cargo build -q --release -p tent-tools --bin tent-bench
  TENT_BENCH=target/release/tent-bench
fi

logs=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$logs"' EXIT

# 1. UCX: a server, then the client against it; one port per run.
port=$((20000 + RANDOM % 20000))
UCX_TLS=posix,self ucx_perftest -p "$port" -c 1 >"$logs/ucx-server" 2>&1 &
server=$!
sleep 0.5
UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p "$port" -c 0 -t ucp_put_bw \
  -s "$SIZE" -n "$ITERS" >"$logs/ucx" 2>&1 || { cat "$logs/ucx" >&2; exit 1; }
wait "$server" 2>/dev/null || true
server=""
# The final line's 8th column (the "Final:" row) is the overall msg/s.
ucx_rate=$(awk '/Final:/ {print $(NF)}' "$logs/ucx")
[ -n "$ucx_rate" ] || { echo "compare-ucx: no Final: line from ucx_perftest" >&2; cat "$logs/ucx" >&2; exit 1; }

# 2. tent over shm, with its floors.
"$TENT_BENCH" --block-size "$SIZE" --batch "$BATCH" --duration "$DURATION" \
  >"$logs/tent" 2>/dev/null
tent_mops=$(awk -F'|' '/^ *[0-9]+[KMG]?i?B *\|/ {gsub(/ /,"",$5); print $5; exit}' "$logs/tent")
[ -n "$tent_mops" ] || { echo "compare-ucx: no point line from tent-bench" >&2; cat "$logs/tent" >&2; exit 1; }

python3 - "$SIZE" "$BATCH" "$ucx_rate" "$tent_mops" <<'EOF'
import sys
size, batch, ucx, tent = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) * 1e6
print(f"# {size} B puts, same run: UCX posix ucp_put_bw (no completion per put) vs tent shm WRITE --batch {batch} (one CQE per op)")
print(f"ucx_msgs_per_s {ucx/1e6:.2f} M   tent_ops_per_s {tent/1e6:.2f} M   tent/ucx {tent/ucx:.2f}x")
EOF
grep -E "^# (ring alone|cross-core|memcpy)" "$logs/tent" || true
