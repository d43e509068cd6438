#!/usr/bin/env bash
# Issue 16's small-op figures on another host, one that has no Rust and no
# UCX (a lent accelerator machine, a customer's server): build a kit here,
# copy it there, run it there.
#
#   tools/bench-kit.sh build [DIR]   # default DIR: target/bench-kit
#   DIR/bench-kit.sh run [--cores "1 15"] [--reps N] [--duration S]
#
# `build` puts in DIR: tent-bench, the ring benchmark (benches/ring.rs),
# ucx_perftest with the UCX libraries and modules it loads, every shared
# library these link beyond glibc's own, this script, and env.sh (PATH,
# LD_LIBRARY_PATH, UCX_MODULE_DIR pointing into DIR). The host that runs it
# needs glibc at least as new as this one's and bash; nothing else.
#
# `run` prints the host (CPU, cores, RDMA devices in /sys/class/infiniband),
# then for each worker core in --cores (the submitting thread and UCX's
# client on core 0, the worker and UCX's server on that core), in
# alternating runs so the ratios come from one machine state:
#   - UCX posix `ucp_put_bw` 8 B (no completion per put) next to tent's
#     8 B shm WRITE at 32 in flight (a CQE per op), with the rings-alone
#     floor tent-bench measures;
#   - UCX posix `ucp_put_lat` 8 B (half a put round trip) next to tent's
#     8 B submit->CQE at one in flight and the cross-core ping-pong;
#   - tent's 4 KiB WRITE at 32 in flight against a 4 KiB memcpy loop, one
#     block and over the point's footprint;
# then the ring benchmark (tent-rings against rtrb, 64 B entries) and the
# medians of each series.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

build() {
  local dir=${1:-target/bench-kit}
  cd "$(dirname "$0")/.."
  command -v ucx_perftest >/dev/null 2>&1 || {
    echo "bench-kit: ucx_perftest not found (apt-get install ucx-utils)" >&2
    exit 1
  }
  cargo build -q --release -p tent-tools --bin tent-bench
  local ring
  ring=$(cargo bench -p tent --bench ring --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -n1)
  [ -x "$ring" ] || { echo "bench-kit: no ring benchmark binary" >&2; exit 1; }
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib/ucx"
  cp target/release/tent-bench "$dir/bin/"
  cp "$ring" "$dir/bin/ring-bench"
  cp "$(command -v ucx_perftest)" "$dir/bin/"
  # UCX's transports load as modules from a directory compiled into
  # libucs; env.sh points UCX_MODULE_DIR at the copies.
  local ucxlib
  ucxlib=$(dirname "$(ldd "$(command -v ucx_perftest)" | awk '/libucs\.so/ {print $3}')")
  cp -L "$ucxlib"/ucx/*.so.0 "$dir/lib/ucx/" 2>/dev/null || true
  # shellcheck source=tools/kit-libs.sh
  . tools/kit-libs.sh
  kit_copy_libs "$dir/lib" "$dir"/bin/*
  cat >"$dir/env.sh" <<'EOF'
K=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$K/bin:$PATH LD_LIBRARY_PATH=$K/lib UCX_MODULE_DIR=$K/lib/ucx
EOF
  cp tools/bench-kit.sh "$dir/bench-kit.sh"
  echo "bench-kit: $dir ($(du -sh "$dir" | cut -f1)); on the other host: $dir/bench-kit.sh run"
}

# Median of the numbers on stdin.
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }

# ucx TEST SIZE SERVER_CORE CLIENT_CORE ITERS: the Final: line's last
# column (msg/s for _bw, and for _lat the typical latency in us is $3).
ucx() {
  local port server
  port=$((20000 + RANDOM % 20000))
  UCX_TLS=posix,self ucx_perftest -p "$port" -c "$3" >/dev/null 2>&1 &
  server=$!
  sleep 0.4
  UCX_TLS=posix,self ucx_perftest 127.0.0.1 -p "$port" -c "$4" -t "$1" -s "$2" -n "$5" 2>&1 |
    awk '/Final:/ {print}'
  wait "$server" 2>/dev/null || true
}

run() {
  local cores="1 15" reps=5 duration=0.5
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --cores) cores=${2:?--cores needs a value}; shift 2 ;;
      --reps) reps=${2:?--reps needs a value}; shift 2 ;;
      --duration) duration=${2:?--duration needs a value}; shift 2 ;;
      *) echo "bench-kit: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  # shellcheck source=/dev/null
  . "$(dirname "$0")/env.sh"
  log=$(mktemp -d)
  trap 'rm -rf "$log"' EXIT
  echo "# host: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) cores, kernel $(uname -r)"
  echo "# RDMA devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ' || true)"
  local wc r line
  for wc in $cores; do
    for r in $(seq "$reps"); do
      line=$(ucx ucp_put_bw 8 "$wc" 0 3000000)
      echo "ucx put_bw 8 B, cores $wc,0: $line"
      awk '{printf "%.3f\n", $NF / 1e6}' <<<"$line" >>"$log/ucx_bw.$wc"
      tent-bench --cores "$wc" --block-size 8 --batch 32 --duration "$duration" 2>/dev/null |
        tee "$log/t" | grep -E 'B \||ring alone' | sed "s/^/tent worker $wc: /"
      awk '$2=="|" && $1 ~ /B$/ {print $9}' "$log/t" >>"$log/tent_b32.$wc"
      sed -n 's/.*no engine): \([0-9.]*\) M ops.*/\1/p' "$log/t" >>"$log/ring_b32.$wc"
    done
    for r in $(seq "$reps"); do
      line=$(ucx ucp_put_lat 8 "$wc" 0 500000)
      echo "ucx put_lat 8 B, cores $wc,0: $line"
      awk '{print $3}' <<<"$line" >>"$log/ucx_lat.$wc"
      tent-bench --cores "$wc" --block-size 8 --batch 1 --duration "$duration" 2>/dev/null |
        tee "$log/t" | grep -E 'B \||ping-pong|vs ping' | sed "s/^/tent worker $wc: /"
      awk '$2=="|" && $1 ~ /B$/ {print $11}' "$log/t" >>"$log/tent_b1.$wc"
      sed -n 's/.*vs ping-pong: p50 \([0-9.]*\)x.*/\1/p' "$log/t" >>"$log/pp_ratio.$wc"
    done
    tent-bench --cores "$wc" --block-size 4096 --batch 32 --duration "$duration" 2>/dev/null |
      grep -E 'B \||memcpy' | sed "s/^/tent worker $wc: /"
  done
  # criterion keeps its state under the working directory: a scratch one.
  (cd "$log" && ring-bench --bench --warm-up-time 1 --measurement-time 2 2>/dev/null) |
    grep -E '^ring_64B' || true
  echo "# medians of $reps runs each"
  for wc in $cores; do
    local ub tb rb ul t1 pr
    ub=$(median <"$log/ucx_bw.$wc")
    tb=$(median <"$log/tent_b32.$wc")
    rb=$(median <"$log/ring_b32.$wc")
    ul=$(median <"$log/ucx_lat.$wc")
    t1=$(median <"$log/tent_b1.$wc")
    pr=$(median <"$log/pp_ratio.$wc")
    echo "worker core $wc: 8 B x32: tent $tb M ops/s (a CQE each), UCX put_bw $ub M msg/s (none), rings alone $rb M;" \
      "8 B x1: tent p50 $t1 us (${pr}x the ping-pong), UCX put_lat $ul us (half a round trip)"
  done
}

case "${1:-}" in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  -h|--help|"") usage ;;
  *) echo "bench-kit: unknown command $1" >&2; exit 2 ;;
esac
