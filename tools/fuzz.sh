#!/usr/bin/env bash
# Coverage-guided fuzzing of tent's wire decoders with cargo-fuzz (libFuzzer,
# AddressSanitizer, nightly toolchain). The targets live in fuzz/:
#   control_decode  control-plane codec (control::wire::{decode, read_message}):
#                   never panics, both readers agree, decode∘encode round-trips
#   data_frames     TCP data-plane headers (transport::tcp::frame): round trips,
#                   decoded lengths within MAX_OP_LEN
#   shm_descriptor  shm segment descriptor parser (transport::shm::desc): admitted
#                   regions bounded, sorted, disjoint, non-wrapping; memfds
#                   mapped only sealed and large enough; names one component
# CI does not run this: it runs the proptests (`cargo test`), which cover the
# same decoders briefly. This script is for longer runs by hand, e.g.
#   FUZZ_SECONDS=3600 tools/fuzz.sh control_decode
#
# Usage: tools/fuzz.sh [TARGET...]     (default: every target in fuzz/fuzz_targets)
# Env:   FUZZ_SECONDS  seconds per target (default 60)
#        FUZZ_ARGS     extra libFuzzer flags, e.g. "-jobs=4 -workers=4"
# Installs cargo-fuzz (and the nightly toolchain) when missing. The corpus
# grows in fuzz/corpus/TARGET (seeded read-only from fuzz/seeds/TARGET); a
# crash leaves its input in fuzz/artifacts/TARGET/ and makes the script exit 1
# after the remaining targets ran. Reproduce one with
#   cargo +nightly fuzz run --fuzz-dir fuzz TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fuzz_dir=$root/fuzz
seconds=${FUZZ_SECONDS:-60}

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
  echo "== $t: ${seconds}s" >&2
  rc=0
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" "$t" "${dirs[@]}" -- \
    -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 ${FUZZ_ARGS:-} \
    2>&1 | tee "$log" || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  if [ "$rc" -eq 0 ]; then
    summary+=("$t: ${runs:-?} runs in ${seconds}s, cov ${cov:-?}, no crash")
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    summary+=("$t: CRASH after ${runs:-?} runs (exit $rc), input: ${artifact:-see $log}")
  fi
done

echo "== tools/fuzz.sh summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
