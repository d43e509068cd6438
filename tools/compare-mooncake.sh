#!/usr/bin/env bash
# Compare tent with the classic Mooncake Transfer Engine over loopback TCP,
# with iperf3 on the same loopback as the ceiling, all measured in one run so
# the ratios (tent/mooncake, tent/iperf3) come from the same machine state.
#
# For each op (read, write) it runs three phases one after another, so that
# nothing else competes for the cores while one of them is measured:
#   1. tent:     one `tent-bench --mode target --transport tcp` for the whole
#                sweep, one `tent-bench --mode initiator` per block size;
#   2. mooncake: one `transfer_engine_bench --mode=target --protocol=tcp
#                --metadata_server=P2PHANDSHAKE` for the sweep, one initiator
#                per block size (classic backend, --backend=classic);
#   3. iperf3:   -P (threads x tent's transports/tcp/connections_per_peer)
#                streams, -l 1M, for the same duration.
# Then it prints one table per op and a last "no collapse" line: tent's
# 64M / 8M throughput per op (a large block must not be slower than 8M),
# beside the same ratio for a plain memcpy measured in the same run.
#
# Requirements (installed when missing, with apt-get / pip; needs root or sudo
# for apt-get): python3 with venv (Debian: python3-venv), iperf3, libibverbs1
# (transfer_engine_bench links it even for TCP), cargo for tent-bench, and
# PyPI access for mooncake-transfer-engine-non-cuda==0.3.13.post1, installed
# into a venv at ${TENT_VENV:-$HOME/.cache/tent/mooncake-venv} (reused).
#
# Environment:
#   TENT_VENV         venv for the Mooncake wheel (default above)
#   MOONCAKE_PKG      pip requirement (default mooncake-transfer-engine-non-cuda==0.3.13.post1)
#   TENT_BENCH        path to a tent-bench binary; skips `cargo build`
#   TENT_CONF         tent config; default forces loopback:
#                     {"rpc_server_hostname":"127.0.0.1","transports":{"tcp":{"connections_per_peer":N}}}
#   TENT_TCP_CONNS    N above, tent's connections per peer (default 4)
#   IPERF_P           iperf3 -P (default threads x TENT_TCP_CONNS)
#   COMPARE_KEEP_LOGS 1 keeps the per-step logs (their folder is printed)
#
# Example:
#   tools/compare-mooncake.sh
#   tools/compare-mooncake.sh --sizes "64K 1M" --duration 2 --ops read
#   tools/compare-mooncake.sh --threads 2 --batch 4 --sizes "1M 8M 64M"
#
# GB/s is 1e9 bytes/s everywhere (Mooncake's "GB", iperf3 bits/8e9, tent's gbps).
# "n/a" means that side did not produce a number (its log tail goes to stderr).
set -euo pipefail

SIZES="4K 64K 1M 8M 64M"
THREADS=1
BATCH=1
DURATION=3
OPS="read write"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  echo "Usage: $0 [--sizes \"4K 64K 1M 8M 64M\"] [--threads 1] [--batch 1] [--duration 3] [--ops \"read write\"]"
}

while [ "$#" -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=${2:?--sizes needs a value}; shift 2 ;;
    --sizes=*) SIZES=${1#*=}; shift ;;
    --threads) THREADS=${2:?--threads needs a value}; shift 2 ;;
    --threads=*) THREADS=${1#*=}; shift ;;
    --batch) BATCH=${2:?--batch needs a value}; shift 2 ;;
    --batch=*) BATCH=${1#*=}; shift ;;
    --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
    --duration=*) DURATION=${1#*=}; shift ;;
    --ops) OPS=${2:?--ops needs a value}; shift 2 ;;
    --ops=*) OPS=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare-mooncake: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

log() { printf 'compare-mooncake: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

for v in THREADS BATCH DURATION; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,} must be a positive integer (got ${!v})"
done

to_bytes() {
  local s=$1 n mul=1
  case "$s" in
    *[kK]) n=${s%?}; mul=1024 ;;
    *[mM]) n=${s%?}; mul=$((1 << 20)) ;;
    *[gG]) n=${s%?}; mul=$((1 << 30)) ;;
    *) n=$s ;;
  esac
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || die "bad size $s (use e.g. 4096, 64K, 1M)"
  echo $((n * mul))
}

# ------------------------------------------------------------------ sizes --

read -r -a SIZE_LIST <<<"$SIZES"
[ "${#SIZE_LIST[@]}" -gt 0 ] || die "--sizes is empty"
read -r -a OP_LIST <<<"$OPS"
[ "${#OP_LIST[@]}" -gt 0 ] || die "--ops is empty"
for op in "${OP_LIST[@]}"; do
  [[ $op == read || $op == write ]] || die "--ops: unknown op $op (read, write)"
done
declare -A BYTES=()
max_block=0
for s in "${SIZE_LIST[@]}"; do
  BYTES[$s]=$(to_bytes "$s")
  if [ "${BYTES[$s]}" -gt "$max_block" ]; then max_block=${BYTES[$s]}; fi
done
# Both benches address block * (i * threads + t) for i < batch, t < threads.
BUF=$((max_block * BATCH * THREADS))
if [ "$BUF" -lt $((1 << 30)) ]; then BUF=$((1 << 30)); fi
STEP_LIMIT=$((DURATION + 60)) # one initiator / iperf3 run
SWEEP_LIMIT=$(((DURATION + 60) * ${#SIZE_LIST[@]} + 120)) # one target sweep

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TENT_VENV:-$HOME/.cache/tent/mooncake-venv}
MOONCAKE_PKG=${MOONCAKE_PKG:-mooncake-transfer-engine-non-cuda==0.3.13.post1}
TENT_TCP_CONNS=${TENT_TCP_CONNS:-4}
if [ -n "${IPERF_P:-}" ]; then
  IPERF_P_WHY="IPERF_P from the environment"
else
  IPERF_P=$((THREADS * TENT_TCP_CONNS))
  IPERF_P_WHY="threads $THREADS x connections_per_peer $TENT_TCP_CONNS"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare-mooncake.XXXXXX")
BG_PIDS=()

# Every background process is started under `timeout`, so even a missed kill
# ends by itself; the trap stops them all (timeout forwards SIGTERM).
cleanup() {
  local rc=$? p
  for p in "${BG_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${BG_PIDS[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  if [ "${COMPARE_KEEP_LOGS:-0}" = 1 ]; then
    log "logs kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget_bg() { # pid: drop it from the list the trap kills
  local q keep=()
  for q in "${BG_PIDS[@]}"; do
    [ "$q" = "$1" ] || keep+=("$q")
  done
  BG_PIDS=("${keep[@]}")
}

stop_bg() { # pid: stop one background process and forget it
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget_bg "$1"
}

# step LOG CMD...: run one bounded step with stdout+stderr to LOG. It runs in
# the background and is waited for, so a signal to this script interrupts the
# wait at once and the trap stops the step too.
step() {
  local out=$1 p rc=0
  shift
  timeout "$STEP_LIMIT" "$@" >"$out" 2>&1 &
  p=$!
  BG_PIDS+=("$p")
  wait "$p" || rc=$?
  forget_bg "$p"
  return "$rc"
}

show_tail() { # file what: the end of a failed step's log, to stderr
  log "$2 failed; last lines of its log:"
  tail -n 15 "$1" 2>/dev/null | sed 's/^/    /' >&2 || true
}

ratio() { # a b: a/b with 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2f", a / b
    else printf "n/a" }'
}

# wait_match FILE ERE PID SECONDS: print the first match of ERE in FILE once
# it appears; fail if PID exits first or SECONDS pass.
wait_match() {
  local file=$1 re=$2 pid=$3 secs=$4 i m
  for ((i = 0; i < secs * 10; i++)); do
    m=$(grep -m1 -oE "$re" "$file" 2>/dev/null || true)
    if [ -n "$m" ]; then
      echo "$m"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# ---------------------------------------------------------------- installs --

apt_ensure() { # packages...: apt-get install the ones dpkg does not have
  local p missing=() sudo=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get; install them by hand"
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 "${sudo[@]}" apt-get update -qq >&2 || log "apt-get update failed; trying the install anyway"
  timeout 900 "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

command -v python3 >/dev/null 2>&1 || apt_ensure python3
apt_ensure iperf3 libibverbs1

find_mc_bench() { # the ELF itself, not the venv/bin python wrapper around it
  [ -d "$VENV" ] || return 0
  { find "$VENV" -type f -name transfer_engine_bench -path '*/mooncake/*' 2>/dev/null || true; } | head -n1
}

MC_BIN=$(find_mc_bench)
if [ -z "$MC_BIN" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -c 'import venv, ensurepip' 2>/dev/null || apt_ensure python3-venv
    log "creating venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    timeout 300 python3 -m venv "$VENV" >&2 || die "python3 -m venv $VENV failed"
  fi
  log "pip install $MOONCAKE_PKG (one time, into $VENV)"
  t0=$SECONDS
  timeout 1200 "$VENV/bin/python" -m pip install -q "$MOONCAKE_PKG" >&2 \
    || die "pip install $MOONCAKE_PKG failed"
  log "pip install took $((SECONDS - t0)) s"
  MC_BIN=$(find_mc_bench)
  [ -n "$MC_BIN" ] || die "no transfer_engine_bench under $VENV after pip install"
fi
[ -x "$MC_BIN" ] || chmod +x "$MC_BIN"
if ldd "$MC_BIN" 2>/dev/null | grep -q 'not found'; then
  log "transfer_engine_bench misses shared libraries:"
  ldd "$MC_BIN" | grep 'not found' | sort -u >&2
  die "install the Debian packages that provide them"
fi
MC_VERSION=$("$VENV/bin/python" -m pip show "${MOONCAKE_PKG%%[=<>]*}" 2>/dev/null \
  | awk '/^Version:/ {print $2}' || true)

if [ -n "${TENT_BENCH:-}" ]; then
  TENT_BIN=$TENT_BENCH
else
  TENT_BIN=$ROOT/target/release/tent-bench
  log "cargo build --release -p tent-tools --bin tent-bench"
  if ! (cd "$ROOT" && timeout 900 cargo build --release -q -p tent-tools --bin tent-bench >&2); then
    if [ -x "$TENT_BIN" ]; then
      log "tent-bench build failed; using the existing (maybe stale) $TENT_BIN"
    else
      log "tent-bench build failed; tent columns will be n/a"
    fi
  fi
fi
if [ -z "${TENT_CONF:-}" ]; then
  TENT_CONF="{\"rpc_server_hostname\":\"127.0.0.1\",\"transports\":{\"tcp\":{\"connections_per_peer\":$TENT_TCP_CONNS}}}"
fi
export TENT_CONF

declare -A TENT=() MC=()
declare -A IPERF=()
NOTES=()

# ------------------------------------------------------------------- tent --

tent_sweep() { # op
  local op=$1 s tlog ilog pid name g
  for s in "${SIZE_LIST[@]}"; do TENT[$op:$s]=n/a; done
  if [ ! -x "$TENT_BIN" ]; then
    log "tent: no $TENT_BIN"
    return 0
  fi
  tlog=$WORK/tent-target-$op.log
  timeout "$SWEEP_LIMIT" "$TENT_BIN" --mode target --transport tcp --buffer-size "$BUF" \
    >"$tlog.out" 2>"$tlog" &
  pid=$!
  BG_PIDS+=("$pid")
  if ! name=$(wait_match "$tlog.out" '^[^ ]+:[0-9]+$' "$pid" 30); then
    cat "$tlog.out" >>"$tlog"
    show_tail "$tlog" "tent target (tcp)"
    stop_bg "$pid"
    return 0
  fi
  log "tent $op: target $name"
  for s in "${SIZE_LIST[@]}"; do
    ilog=$WORK/tent-$op-$s.log
    if step "$ilog" "$TENT_BIN" --mode initiator --transport tcp --target "$name" \
      --op "$op" --block-size "${BYTES[$s]}" --batch "$BATCH" --threads "$THREADS" \
      --duration "$DURATION" --json --no-baseline; then
      g=$(python3 - "$ilog" <<'EOF'
import json, sys
g, err = None, 0
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if "gbps" in o:
        g, err = o["gbps"], o.get("errors", 0)
print("n/a" if g is None else "%.3f %d" % (g, err))
EOF
)
      if [ "$g" = n/a ]; then
        show_tail "$ilog" "tent $op $s (no gbps in output)"
      else
        TENT[$op:$s]=${g% *}
        [ "${g#* }" = 0 ] || NOTES+=("tent $op $s reported ${g#* } errors")
      fi
    else
      show_tail "$ilog" "tent $op $s"
    fi
    log "tent $op $s: ${TENT[$op:$s]} GB/s"
  done
  stop_bg "$pid"
}

# --------------------------------------------------------------- mooncake --

mc_sweep() { # op
  local op=$1 s tlog ilog pid port g
  local common=(--protocol=tcp --metadata_server=P2PHANDSHAKE --backend=classic --buffer_size="$BUF")
  for s in "${SIZE_LIST[@]}"; do MC[$op:$s]=n/a; done
  tlog=$WORK/mc-target-$op.log
  timeout "$SWEEP_LIMIT" "$MC_BIN" --mode=target "${common[@]}" \
    --local_server_name=127.0.0.1:17777 >"$tlog" 2>&1 &
  pid=$!
  BG_PIDS+=("$pid")
  # glog: "Transfer Engine RPC using P2P handshake, listening on 127.0.0.1:PORT"
  if ! port=$(wait_match "$tlog" 'P2P handshake, listening on [^ ]+:[0-9]+' "$pid" 30); then
    show_tail "$tlog" "mooncake target"
    stop_bg "$pid"
    return 0
  fi
  port=${port##*:}
  # The target registers its buffer after it starts listening.
  wait_match "$tlog" 'numa node num|registerLocalMemory' "$pid" 10 >/dev/null || true
  sleep 0.5
  log "mooncake $op: target 127.0.0.1:$port"
  for s in "${SIZE_LIST[@]}"; do
    ilog=$WORK/mc-$op-$s.log
    if step "$ilog" "$MC_BIN" --mode=initiator "${common[@]}" \
      --local_server_name=127.0.0.1:17778 --segment_id="127.0.0.1:$port" \
      --operation="$op" --block_size="${BYTES[$s]}" --batch_size="$BATCH" \
      --threads="$THREADS" --duration="$DURATION" --report_unit=GB --report_precision=3; then
      g=$(sed -nE 's/.*throughput ([0-9.]+) GB\/s.*/\1/p' "$ilog" | tail -n1)
      if [ -n "$g" ]; then
        MC[$op:$s]=$g
      else
        show_tail "$ilog" "mooncake $op $s (no throughput line)"
      fi
    else
      show_tail "$ilog" "mooncake $op $s"
    fi
    log "mooncake $op $s: ${MC[$op:$s]} GB/s"
  done
  stop_bg "$pid"
}

# ----------------------------------------------------------------- iperf3 --

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

iperf_run() { # op
  local op=$1 port slog clog pid
  IPERF[$op]=n/a
  port=$(free_port)
  slog=$WORK/iperf-server-$op.log
  clog=$WORK/iperf-client-$op.json
  timeout "$STEP_LIMIT" iperf3 -s -1 --forceflush -p "$port" -B 127.0.0.1 >"$slog" 2>&1 &
  pid=$!
  BG_PIDS+=("$pid")
  if ! wait_match "$slog" 'Server listening' "$pid" 15 >/dev/null; then
    show_tail "$slog" "iperf3 server"
    stop_bg "$pid"
    return 0
  fi
  if step "$clog" iperf3 -c 127.0.0.1 -p "$port" -P "$IPERF_P" -t "$DURATION" -l 1M -J; then
    IPERF[$op]=$(python3 -c '
import json, sys
try:
    o = json.load(open(sys.argv[1]))
    print("%.3f" % (o["end"]["sum_received"]["bits_per_second"] / 8e9))
except Exception:
    print("n/a")' "$clog")
  fi
  [ "${IPERF[$op]}" != n/a ] || show_tail "$clog" "iperf3 client"
  log "iperf3 ($op sweep) -P $IPERF_P: ${IPERF[$op]} GB/s"
  stop_bg "$pid"
}

# -------------------------------------------------------------------- run --

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
for op in "${OP_LIST[@]}"; do
  tent_sweep "$op"
  mc_sweep "$op"
  iperf_run "$op"
done

cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
rev=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo "?")
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
echo "tent vs Mooncake Transfer Engine (classic), loopback TCP -- $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: nproc $(nproc), kernel $(uname -r)${cpu:+, $cpu}; loadavg $LOAD_START at start, $LOAD_END at end"
echo "tent: $TENT_BIN (git $rev), TENT_CONF=$TENT_CONF"
echo "mooncake: ${MOONCAKE_PKG%%[=<>]*} ${MC_VERSION:-?}, transfer_engine_bench --protocol=tcp --backend=classic"
echo "threads $THREADS, batch $BATCH, duration ${DURATION}s per point, buffer $BUF B; iperf3 -P $IPERF_P -l 1M ($IPERF_P_WHY)"
echo "GB/s = 1e9 B/s"
for op in "${OP_LIST[@]}"; do
  echo
  printf '%-5s | %-5s | %9s | %13s | %13s | %11s | %11s\n' \
    op size "tent GB/s" "mooncake GB/s" tent/mooncake "iperf3 GB/s" tent/iperf3
  printf '%s\n' "------+-------+-----------+---------------+---------------+-------------+------------"
  for s in "${SIZE_LIST[@]}"; do
    printf '%-5s | %-5s | %9s | %13s | %13s | %11s | %11s\n' "$op" "$s" \
      "${TENT[$op:$s]}" "${MC[$op:$s]}" "$(ratio "${TENT[$op:$s]}" "${MC[$op:$s]}")" \
      "${IPERF[$op]}" "$(ratio "${TENT[$op:$s]}" "${IPERF[$op]}")"
  done
done
echo
for n in "${NOTES[@]}"; do echo "note: $n"; done

# The 64M and 8M rows, whatever spelling --sizes used for them.
s64="" s8=""
for s in "${SIZE_LIST[@]}"; do
  if [ "${BYTES[$s]}" -eq $((64 << 20)) ]; then s64=$s; fi
  if [ "${BYTES[$s]}" -eq $((8 << 20)) ]; then s8=$s; fi
done
line="no collapse (tent 64M / tent 8M, want >= 0.90):"
for op in "${OP_LIST[@]}"; do
  if [ -n "$s64" ] && [ -n "$s8" ]; then
    r=$(ratio "${TENT[$op:$s64]}" "${TENT[$op:$s8]}")
    verdict=$(awk -v r="$r" 'BEGIN { if (r !~ /^[0-9.]+$/) print "n/a"; else if (r + 0 >= 0.9) print "ok"; else print "COLLAPSE" }')
    line+=" $op $r ($verdict);"
  else
    line+=" $op n/a (sizes lack 8M or 64M);"
  fi
done
echo "${line%;}"

# The same ratio for a plain single-thread memcpy, measured now: when the
# 64 MiB working set leaves the cache, every byte copy costs more, whatever
# the transport. A bounded transport degrades no more than this; an
# unbounded one (UCX's puts: 0.24x) far more.
if [ -n "$s64" ] && [ -n "$s8" ]; then
  m8=$(timeout 120 "$TENT_BIN" --transport local --block-size 8M --duration 1 --json 2>/dev/null \
    | python3 -c 'import json,sys; print(next(d["gbps"] for d in map(json.loads, sys.stdin) if d.get("baseline") == "memcpy_1thread"))' || echo n/a)
  m64=$(timeout 120 "$TENT_BIN" --transport local --block-size 64M --duration 1 --json 2>/dev/null \
    | python3 -c 'import json,sys; print(next(d["gbps"] for d in map(json.loads, sys.stdin) if d.get("baseline") == "memcpy_1thread"))' || echo n/a)
  echo "memcpy 1 thread 64M / 8M in this run: $(ratio "$m64" "$m8") (the memory system's own drop)"
fi
