#!/usr/bin/env bash
# Issue 45's fan-in figures: 1 MiB WRITEs to one remote TCP target from N
# processes, each a client of one daemon (`tentd`) against each embedding
# an engine, in one run, for each N; then the CPU the node burns idle.
#
#   tools/bench-attach-tcp.sh [--counts "1 2 4 8"] [--duration S] [--batch B]
#
# For each N (alternating attached and embedded, so both see one machine
# state):
#   - N `tent-bench --mode initiator --transport tcp --block-size 1M`
#     processes against one target process, all started together; the
#     aggregate is the sum of their GB/s;
#   - the TCP connections the target holds meanwhile (`ss`, sockets of the
#     target's pid, sampled through the run, the most seen): with a daemon
#     they are the daemon's, whatever N is;
# then the CPU N idle processes burn, in ms per second: attached (the
# clients plus the daemon, while all are attached) against embedded (each
# with its workers);
# then two attached clients streaming, one killed with SIGKILL 3 s in:
# the survivor's GB/s over the second after against the second before
# (its 100 ms series, aligned on when its measurement started).
# Prints one line per measurement and the ratios attached / embedded.
set -euo pipefail
cd "$(dirname "$0")/.."

counts="1 2 4 8"
duration=3
batch=8
while [ $# -gt 0 ]; do
  case "$1" in
    --counts) counts=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-attach-tcp: unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build -q --release -p tent-tools --bin tent-bench -p tentd
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The target: exports 1 GiB over TCP until its stdin closes.
mkfifo "$work/target.in"
"$bin/tent-bench" --mode target --transport tcp --buffer-size 1G --exit-on-stdin-eof \
  < "$work/target.in" > "$work/target.out" 2> "$work/target.err" &
tpid=$!
pids+=("$tpid")
exec 9> "$work/target.in"
for _ in $(seq 100); do
  [ -s "$work/target.out" ] && break
  sleep 0.1
done
target=$(head -1 "$work/target.out")
[ -n "$target" ] || { echo "bench-attach-tcp: the target did not start" >&2; cat "$work/target.err" >&2; exit 1; }

# The daemon.
sock="$work/tentd.sock"
"$bin/tentd" --socket "$sock" > "$work/tentd.log" 2>&1 &
dpid=$!
pids+=("$dpid")
for _ in $(seq 100); do
  [ -S "$sock" ] && break
  sleep 0.1
done
[ -S "$sock" ] || { echo "bench-attach-tcp: tentd did not start" >&2; cat "$work/tentd.log" >&2; exit 1; }

conns() { ss -tnpH state established 2>/dev/null | grep -c "pid=$tpid," || true; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# N initiators at once; prints "aggregate_gbps max_connections".
fanin() {
  local n=$1 attach=$2 i
  local run=()
  for i in $(seq "$n"); do
    # shellcheck disable=SC2086
    "$bin/tent-bench" --mode initiator --target "$target" --transport tcp --block-size 1M \
      --batch "$batch" --duration "$duration" --json --no-baseline $attach \
      > "$work/init.$i.out" 2> "$work/init.$i.err" &
    run+=($!)
  done
  local most=0 c
  while kill -0 "${run[0]}" 2>/dev/null; do
    c=$(conns)
    [ "$c" -gt "$most" ] && most=$c
    sleep 0.2
  done
  local gbps=0 g
  for i in $(seq "$n"); do
    wait "${run[$((i - 1))]}" || { echo "bench-attach-tcp: initiator $i failed" >&2; cat "$work/init.$i.err" >&2; exit 1; }
    g=$(grep -o '"gbps":[0-9.e+-]*' "$work/init.$i.out" | head -1 | cut -d: -f2)
    gbps=$(echo "$gbps + ${g:-0}" | bc -l)
  done
  echo "$gbps $most"
}

# CPU time (ns) of every thread of process $1 so far.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f\n", s }'; }

# N idle processes over --duration; prints the CPU they (and, attached,
# the daemon over a window where all of them are attached) use, in ms per
# second.
idle() {
  local n=$1 attach=$2 i
  local run=() before after
  for i in $(seq "$n"); do
    # shellcheck disable=SC2086
    "$bin/tent-bench" --mode idle --duration "$duration" --json $attach \
      > "$work/idle.$i.out" 2> "$work/idle.$i.err" &
    run+=($!)
  done
  # Each measures itself from 0.3 s after its engine is up; the daemon is
  # measured from then to shortly before they end.
  sleep 0.6
  before=$(cpu_ns "$dpid")
  local t0 t1
  t0=$(date +%s.%N)
  sleep "$(echo "$duration - 0.5" | bc -l)"
  after=$(cpu_ns "$dpid")
  t1=$(date +%s.%N)
  local ms=0 m
  for i in $(seq "$n"); do
    wait "${run[$((i - 1))]}" || { echo "bench-attach-tcp: idle $i failed" >&2; cat "$work/idle.$i.err" >&2; exit 1; }
    m=$(grep -o '"cpu_ms":[0-9.e+-]*' "$work/idle.$i.out" | cut -d: -f2)
    ms=$(echo "$ms + ${m:-0}" | bc -l)
  done
  ms=$(echo "$ms / $duration" | bc -l)
  if [ -n "$attach" ]; then
    ms=$(echo "$ms + ($after - $before) / 1000000 / ($t1 - $t0)" | bc -l)
  fi
  echo "$ms"
}

echo "# bench-attach-tcp: 1 MiB TCP WRITE, batch $batch, ${duration} s, target $target; attached = clients of one tentd"
printf '%-9s %8s %12s %14s %16s\n' processes case GB/s connections idle_cpu_ms/s
for n in $counts; do
  read -r ag ac < <(fanin "$n" "--attach $sock")
  read -r eg ec < <(fanin "$n" "")
  ai=$(idle "$n" "--attach $sock")
  ei=$(idle "$n" "")
  printf '%-9s %8s %12.2f %14s %16.3f\n' "$n" attached "$ag" "$ac" "$ai"
  printf '%-9s %8s %12.2f %14s %16.3f\n' "$n" embedded "$eg" "$ec" "$ei"
  printf '# N=%s attached/embedded: throughput %.2fx, connections %s vs %s, idle CPU %.2fx\n' \
    "$n" "$(echo "$ag / $eg" | bc -l)" "$ac" "$ec" "$(echo "($ai + 0.001) / ($ei + 0.001)" | bc -l)"
done

# A client killed under load.
"$bin/tent-bench" --mode initiator --target "$target" --transport tcp --block-size 1M \
  --batch "$batch" --duration 6 --interval-ms 100 --json --no-baseline --attach "$sock" \
  > "$work/survivor.out" 2> "$work/survivor.err" &
survivor=$!
"$bin/tent-bench" --mode initiator --target "$target" --transport tcp --block-size 1M \
  --batch "$batch" --duration 60 --json --no-baseline --attach "$sock" \
  > /dev/null 2> "$work/victim.err" &
victim=$!
pids+=("$victim")
for _ in $(seq 1000); do
  grep -q '\[1/1\]' "$work/survivor.err" 2>/dev/null && break
  sleep 0.01
done
start=$(date +%s.%N)
sleep 3
kill -9 "$victim"
killed=$(date +%s.%N)
wait "$victim" 2>/dev/null || true
wait "$survivor" || { echo "bench-attach-tcp: the survivor failed" >&2; cat "$work/survivor.err" >&2; exit 1; }
k=$(echo "($killed - $start) * 1000" | bc -l)
read -r before after < <(awk -v k="$k" '/"t_ms"/ {
    match($0, /"t_ms":[0-9]+/); t = substr($0, RSTART + 7, RLENGTH - 7) + 0
    match($0, /"gbps":[0-9.e+-]+/); g = substr($0, RSTART + 7, RLENGTH - 7) + 0
    if (t > k - 1000 && t <= k) { b += g; nb++ }
    if (t > k && t <= k + 1000) { a += g; na++ }
  } END { printf "%.3f %.3f\n", (nb ? b / nb : 0), (na ? a / na : 0) }' "$work/survivor.out")
printf '# killed under load: the survivor %.2f GB/s the second before, %.2f the second after: %.2fx\n' \
  "$before" "$after" "$(echo "$after / ($before + 0.000001)" | bc -l)"
