#!/usr/bin/env bash
# Profile a tent-bench run: build with frame pointers (own target dir, since
# cargo refuses rustflags in a profile), record `perf record -e cpu-clock -g`
# (no hardware counters on these machines), and draw a flamegraph.
#
#   tools/profile.sh                       # 8 B WRITEs over shm, 3 s
#   tools/profile.sh --block-size 1M --duration 5
# Output: perf.data and flamegraph.svg in the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
RUSTFLAGS="-C force-frame-pointers=yes" \
  cargo build --profile profiling -p tent-tools --bin tent-bench --target-dir target/profiling-fp
bin=target/profiling-fp/profiling/tent-bench
if [ "$#" -eq 0 ]; then set -- --block-size 8 --duration 3 --no-baseline; fi
perf record -e cpu-clock -F 4000 -g -o perf.data -- "$bin" "$@"
if ! command -v inferno-flamegraph >/dev/null 2>&1; then
  cargo install inferno --locked >/dev/null
fi
perf script -i perf.data 2>/dev/null | inferno-collapse-perf | inferno-flamegraph > flamegraph.svg
echo "tools/profile.sh: wrote perf.data and flamegraph.svg"
perf report -i perf.data --stdio --no-children --percent-limit 2 2>/dev/null | head -60
