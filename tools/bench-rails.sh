#!/usr/bin/env bash
# tent-bench over TCP across two network namespaces joined by tbf-shaped
# veth rails (tools/netns.sh): smart scheduling and round robin in one run,
# as ratios to the sum of the rail rates and to the fastest rail.
#
#   tools/bench-rails.sh [--rates 1gbit,200mbit | --rails 2 --rate 1gbit]
#       [--policy smart|rr|both] [--size 256M] [--op read|write] [--duration 4]
#       [--config-extra JSON] [--reference] [--max-seconds 300]
#       [--cut RAIL:RATE@SECONDS [--cut-block 4M] [--cut-inflight 8] [--interval-ms 100]]
#
# --policy sets transports/rdma/enable_smart_scheduling (TCP rails too) in
# the initiator's TENT_CONF; --config-extra is merged into it (selector
# keys). --reference adds one rail of the fastest rate alone. --cut streams
# --cut-block ops, --cut-inflight in flight, changes rail RAIL's tbf to RATE
# SECONDS into the measured window (default window: SECONDS + 3), and
# prints the per-interval series and how long after the cut the throughput
# held 0.85x the new rail sum. Needs root, iproute2 and python3. Exit 0 when
# every run gave a figure, 1 when one did not, 2 on bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,19p' "$0"; exit 0 ;; esac
cargo build --release -q -p tent-tools --bin tent-bench
exec python3 tools/bench_rails.py --bench "$PWD/target/release/tent-bench" "$@"
