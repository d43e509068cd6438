#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo-fuzz (libFuzzer, AddressSanitizer,
# nightly toolchain) of everything a peer, a client or a file hands the
# engine. Each target's body is a function in src/fuzzing.rs (the invariants
# it checks are documented there); fuzz/fuzz_targets/ holds the libFuzzer
# entry points:
#   control_decode  control-plane codec (control::wire::{decode, read_message})
#   data_frames     TCP data-plane headers (transport::tcp::frame)
#   shm_descriptor  shm segment descriptor parser and memfd admission
#   config_text     configuration text (Config::from_json_str, to_json)
#   tcp_handshake   the TCP data handshake's state machines, both sides
#   http_request    the HTTP endpoint's request decision (http::request::answer)
#   etcd_gateway    etcd's JSON gateway answers and watch stream (control::etcd::wire)
#   daemon_setup    the daemon's set-up frames, request and reply (daemon::wire)
# `cargo test` runs every body over fuzz/seeds/TARGET and over the inputs a
# campaign kept (fuzz/regressions/TARGET: copy a crash there once fixed),
# in tests/fuzz_inputs.rs. This script is for campaigns, e.g.
#   FUZZ_RUNS=10000000 tools/fuzz.sh            # 10 M executions per target
#   FUZZ_SECONDS=3600 tools/fuzz.sh control_decode
#
# Usage: tools/fuzz.sh [TARGET...]     (default: every target in fuzz/fuzz_targets)
# Env:   FUZZ_RUNS     executions per target (overrides FUZZ_SECONDS)
#        FUZZ_SECONDS  seconds per target (default 60)
#        FUZZ_SANITIZER  address (default) or none (about 10x the executions
#                      per second; the parsers are safe Rust)
#        FUZZ_ARGS     extra libFuzzer flags, e.g. "-jobs=4 -workers=4"
# Installs cargo-fuzz (and the nightly toolchain) when missing. The corpus
# grows in fuzz/corpus/TARGET (seeded read-only from fuzz/seeds/TARGET); a
# crash leaves its input in fuzz/artifacts/TARGET/ and makes the script exit 1
# after the remaining targets ran. Reproduce one with
#   cargo +nightly fuzz run --fuzz-dir fuzz TARGET fuzz/artifacts/TARGET/crash-...
# The summary gives per target the executions, the edge coverage (`cov`)
# and features (`ft`) libFuzzer reached, and the corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fuzz_dir=$root/fuzz
seconds=${FUZZ_SECONDS:-60}
runs_wanted=${FUZZ_RUNS:-}

usage() { echo "usage: tools/fuzz.sh [TARGET...]  (targets: ${all[*]})" >&2; }

all=()
for f in "$fuzz_dir"/fuzz_targets/*.rs; do
  all+=("$(basename "$f" .rs)")
done
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ "$#" -eq 0 ]; then set -- "${all[@]}"; fi
for t in "$@"; do
  if [ ! -f "$fuzz_dir/fuzz_targets/$t.rs" ]; then
    echo "tools/fuzz.sh: unknown target '$t'" >&2
    usage
    exit 2
  fi
done

./tools/setup.sh # hwloc/udev headers for the tent build
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "tools/fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

summary=()
failed=0
for t in "$@"; do
  corpus=$fuzz_dir/corpus/$t
  seeds=$fuzz_dir/seeds/$t
  mkdir -p "$corpus"
  dirs=("$corpus")
  [ -d "$seeds" ] && dirs+=("$seeds")
  log=$(mktemp "${TMPDIR:-/tmp}/tent-fuzz-$t.XXXXXX")
  if [ -n "$runs_wanted" ]; then
    limit=(-runs="$runs_wanted")
    budget="$runs_wanted runs"
  else
    limit=(-max_total_time="$seconds")
    budget="${seconds}s"
  fi
  echo "== $t: $budget" >&2
  rc=0
  start=$(date +%s)
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  cargo +nightly fuzz run -s "${FUZZ_SANITIZER:-address}" --fuzz-dir "$fuzz_dir" "$t" "${dirs[@]}" -- \
    "${limit[@]}" -max_len=65536 -print_final_stats=1 ${FUZZ_ARGS:-} \
    2>&1 | tee "$log" || rc=$?
  took=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  corp=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  if [ "$rc" -eq 0 ]; then
    summary+=("$t: ${runs:-?} runs in ${took}s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, no crash")
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    summary+=("$t: CRASH after ${runs:-?} runs (exit $rc), input: ${artifact:-see $log}")
  fi
done

echo "== tools/fuzz.sh summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
