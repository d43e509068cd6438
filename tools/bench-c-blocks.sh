#!/usr/bin/env bash
# Block lists from C (capi/bench/blocks.c) against the release C library:
# the time inside `tent_submit_blocks` and the end-to-end rate, to read
# beside `tent-bench --mode blocks` (Rust) and python/bench/blocks.py.
#
#   tools/bench-c-blocks.sh [blocks] [block_bytes] [reps]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build --release -q -p tent-capi
lib="$root/target/release"
exe="$(mktemp -d)/blocks"
trap 'rm -rf "$(dirname "$exe")"' EXIT
"${CC:-cc}" -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Wall -Wextra -Werror \
    -I capi/include capi/bench/blocks.c -o "$exe" -L "$lib" -ltent_c -Wl,-rpath,"$lib"
"$exe" "$@"
