#!/usr/bin/env bash
# tent-bench over TCP across two network namespaces joined by N veth rails,
# each shaped by tbf, against one rail alone in the same run: does spraying
# slices over rails add their bandwidth up?
#
#   tools/bench-rails.sh [--rails 2] [--rate 1gbit] [--size 256M] [--op read] [--duration 4]
#
# Needs root and iproute2 (tools/netns.sh). Prints one line per run and the
# ratio of the N-rail figure to the 1-rail figure.
set -euo pipefail
cd "$(dirname "$0")/.."

rails=2 rate=1gbit size=256M op=read duration=4
while [ $# -gt 0 ]; do
  case "$1" in
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
  esac
done

cargo build --release -q -p tent-tools --bin tent-bench
bench=$PWD/target/release/tent-bench
name="br$$"
name=${name:0:8}
target_pid=
cleanup() {
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null || true
  tools/netns.sh down "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# run RAILS: GB/s of one $op of $size, target in NAME-b, initiator in NAME-a.
run() {
  local n=$1 out seg gbps
  tools/netns.sh down "$name" >/dev/null 2>&1 || true
  tools/netns.sh up "$name" "$n" "$rate"
  out=$(mktemp)
  TENT_CONF='{"rpc_server_hostname":"10.77.1.2"}' ip netns exec "$name-b" \
    "$bench" --mode target --transport tcp --buffer-size "$size" >"$out" 2>/dev/null &
  target_pid=$!
  for _ in $(seq 1 100); do [ -s "$out" ] && break; sleep 0.1; done
  seg=$(head -n1 "$out")
  [ -n "$seg" ] || { echo "bench-rails: target did not start" >&2; exit 1; }
  gbps=$(TENT_LOG=warn TENT_CONF='{"rpc_server_hostname":"10.77.1.1"}' timeout 300 ip netns exec "$name-a" \
    "$bench" --mode initiator --transport tcp --target "$seg" --op "$op" \
    --block-size "$size" --batch 1 --threads 1 --duration "$duration" --json --no-baseline \
    | python3 -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.startswith("{")][0]["gbps"])')
  kill "$target_pid" 2>/dev/null || true
  wait "$target_pid" 2>/dev/null || true
  target_pid=
  rm -f "$out"
  echo "$gbps"
}

one=$(run 1)
many=$(run "$rails")
python3 - "$one" "$many" "$rails" "$rate" "$size" "$op" <<'EOF'
import sys
one, many, rails, rate, size, op = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
print(f"tcp {op} {size}, rails of tbf {rate}:")
print(f"  1 rail      : {one:.3f} GB/s = {one*8:.2f} Gbit/s")
print(f"  {rails} rails     : {many:.3f} GB/s = {many*8:.2f} Gbit/s   ({many/one:.2f}x one rail)")
EOF
