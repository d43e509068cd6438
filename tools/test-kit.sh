#!/usr/bin/env bash
# The workspace's tests on another host, one with more cores than CI's two
# and no Rust (a lent accelerator machine): build the test binaries here,
# pack them, run them there at that host's default test threads.
#
#   tools/test-kit.sh build [DIR]        # default DIR: target/test-kit
#   DIR/test-kit.sh run [--reps N] [--only "NAME ..."] [--timeout S]
#
# `build` compiles every test binary of the workspace (debug assertions on,
# opt-level 1, no debug info, in target/test-kit-build), leaves out the
# ones that need what such a host lacks (netns: ip and tc; the Soft-RoCE
# guest: QEMU and a kernel image; the Python module; the C header test),
# strips them and packs them with tent-bench (the tools' tests run it from
# the path cargo compiled into them, which `run` recreates), libtent_c
# (the C tests also need a C compiler and the hwloc and udev development
# files there, as `tools/setup.sh` installs here) and the shared libraries
# they link beyond glibc's own: DIR/tests.tar.xz and this script.
#
# `run` unpacks into a scratch directory, runs each binary (NAME is the
# binary's name without its hash, e.g. `qos` or `tent`) with a timeout,
# prints one line per binary and, for a failure, its failing tests; with
# --reps N it runs the chosen binaries N times. Exit 1 if any run failed.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# Binaries whose tests need a facility such a host does not have.
LEFT_OUT='^(netns_|rxe_|python_module$|header$|loom_handshakes$)'

build() {
  local dir=${1:-target/test-kit}
  cd "$(dirname "$0")/.."
  local build=target/test-kit-build
  list=$(mktemp)
  trap 'rm -f "$list"' EXIT
  CARGO_TARGET_DIR=$build CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_OPT_LEVEL=1 \
    cargo test --workspace --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"].get("test"):
        print(m["target"]["name"], m["executable"])
' >"$list"
  [ -s "$list" ] || { echo "test-kit: cargo built no test binary" >&2; exit 1; }
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  local name exe
  while read -r name exe; do
    [[ $name =~ $LEFT_OUT ]] && continue
    cp "$exe" "$stage/bin/"
  done <"$list"
  cp "$build/debug/tent-bench" "$stage/tent-bench"
  realpath "$build/debug/tent-bench" >"$stage/tent-bench.path"
  # CARGO_TARGET_TMPDIR, compiled in as well (the C tests build there).
  mkdir -p "$build/tmp"
  realpath "$build/tmp" >"$stage/tmpdir.path"
  strip "$stage"/bin/* "$stage/tent-bench"
  # The C tests look for the library beside themselves.
  cp "$build"/debug/deps/libtent_c.so "$build"/debug/deps/libtent_c.a "$stage/bin/" 2>/dev/null || true
  # shellcheck source=tools/kit-libs.sh
  . tools/kit-libs.sh
  kit_copy_libs "$stage/lib" "$stage"/bin/* "$stage/tent-bench"
  local count
  count=$(find "$stage/bin" -type f ! -name '*.so' ! -name '*.a' | wc -l)
  rm -rf "$dir"
  mkdir -p "$dir"
  tar -C "$stage" -cf - . | xz -T0 -6 >"$dir/tests.tar.xz"
  rm -rf "$stage"
  cp tools/test-kit.sh "$dir/test-kit.sh"
  echo "test-kit: $dir ($(du -sh "$dir" | cut -f1), $count test binaries); on the other host: $dir/test-kit.sh run"
}

run() {
  local reps=1 only="" limit=300
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --reps) reps=${2:?--reps needs a value}; shift 2 ;;
      --only) only=${2:?--only needs a value}; shift 2 ;;
      --timeout) limit=${2:?--timeout needs a value}; shift 2 ;;
      *) echo "test-kit: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  local kit work
  kit=$(cd "$(dirname "$0")" && pwd)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -C "$work" -xJf "$kit/tests.tar.xz"
  export LD_LIBRARY_PATH=$work/lib
  # tent-bench where the tools' tests were compiled to find it.
  local bench
  bench=$(cat "$work/tent-bench.path")
  mkdir -p "$(dirname "$bench")" "$(cat "$work/tmpdir.path")"
  cp "$work/tent-bench" "$bench"
  echo "# host: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) cores, kernel $(uname -r)"
  local failed=0 r exe base rc t0 t1
  for r in $(seq "$reps"); do
    for exe in "$work"/bin/*; do
      base=$(basename "$exe")
      case $base in *.so | *.a) continue ;; esac
      if [ -n "$only" ] && ! grep -qw -- "${base%-*}" <<<"$only"; then
        continue
      fi
      t0=$(date +%s.%N)
      rc=0
      (cd "$work" && timeout "$limit" "$exe" >"$work/log" 2>&1) || rc=$?
      t1=$(date +%s.%N)
      printf '%-3s %-40s rc=%-3s %6.1fs %s\n' "$r" "$base" "$rc" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" \
        "$(grep -E '^test result:' "$work/log" | tail -n1)"
      if [ "$rc" -ne 0 ]; then
        failed=1
        grep -E -A8 '^test .* FAILED|panicked at' "$work/log" | head -n 40 | sed 's/^/    /'
      fi
    done
  done
  exit "$failed"
}

case "${1:-}" in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  -h|--help|"") usage ;;
  *) echo "test-kit: unknown command $1" >&2; exit 2 ;;
esac
