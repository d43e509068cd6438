#!/usr/bin/env bash
# Before/after figures as the house rule asks for them: one session,
# interleaved runs of a `tent-bench` built at an earlier commit and of the
# working tree's, medians of each side and their ratio.
#
#   tools/ab.sh REF [--pairs N] [--field F] [--] TENT-BENCH-ARGS...
#
# REF is any commit (the one an issue starts from). Its `tent-bench` is
# built in a worktree under ${TENT_AB_DIR:-target/ab}/REF (kept, so a
# second call builds nothing); the working tree's into target/ab/work.
# Each pair runs both with the same arguments plus `--json`, N pairs
# (default 5), before first in odd pairs and after first in even ones.
# Every JSON line that carries F (default `gbps`) gives one figure, keyed
# by what names its point (op, transport, case, processes, a daemon's
# clients, slot interval, fairness weights,
# threads, batch, block size); a line with a `baseline` of `ring_alone`
# gives `tent_mops` (the `--batch` small-op figure). A run that fails is
# left out (its output kept as *.failed). Printed: per key, the before and
# after medians, their ratio (for a latency, lower is better), and the
# before runs' min..max (the spread a p99 or QoS figure must stay in).
# Exit status 1 when a side produced no figure at all.
#
# Examples:
#   tools/ab.sh 305d766 -- --block-size 8 --batch 32
#   tools/ab.sh 305d766 --pairs 8 --field p99_us -- --block-size 4K
#   tools/ab.sh HEAD~3 --                      # the default sweep
#
# Run it on a quiet machine: nothing else compiling or benchmarking.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

[ $# -ge 1 ] || { usage >&2; exit 2; }
case $1 in -h|--help) usage; exit 0 ;; esac
REF=$1; shift
PAIRS=5
FIELD=gbps
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) PAIRS=${2:?--pairs needs a value}; shift 2 ;;
    --field) FIELD=${2:?--field needs a value}; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ $PAIRS =~ ^[1-9][0-9]*$ ]] || { echo "ab: --pairs must be a positive integer" >&2; exit 2; }

ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
SHA=$(git rev-parse --verify --quiet "$REF^{commit}") || { echo "ab: $REF is no commit" >&2; exit 2; }
BASE=${TENT_AB_DIR:-$ROOT/target/ab}
TREE=$BASE/${SHA:0:12}
# A tree removed by `cargo clean` (still registered) or left half made by
# an interrupted checkout is made again.
if [ "$(git -C "$TREE" rev-parse HEAD 2>/dev/null)" != "$SHA" ]; then
  git worktree prune
  rm -rf "$TREE"
  mkdir -p "$BASE"
  git worktree add -f --detach "$TREE" "$SHA" >/dev/null
fi
echo "ab: building tent-bench at ${SHA:0:12} and in the working tree" >&2
# Explicit target folders: a CARGO_TARGET_DIR in the environment would
# otherwise put both builds in one place (and run a stale binary).
(cd "$TREE" && cargo build --release -q -p tent-tools --bin tent-bench --target-dir "$TREE/target")
cargo build --release -q -p tent-tools --bin tent-bench --target-dir "$BASE/work"
BEFORE=$TREE/target/release/tent-bench
AFTER=$BASE/work/release/tent-bench

OUT=$(mktemp -d "${TMPDIR:-/tmp}/tent-ab.XXXXXX")
echo "ab: runs in $OUT; before ${SHA:0:12}, after the working tree ($(git describe --always --dirty)); args: $* --json" >&2
for i in $(seq 1 "$PAIRS"); do
  order="before after"
  if [ $((i % 2)) -eq 0 ]; then order="after before"; fi
  for side in $order; do
    bin=$BEFORE
    if [ "$side" = after ]; then bin=$AFTER; fi
    if ! "$bin" "$@" --json > "$OUT/$side.$i.json" 2> "$OUT/$side.$i.err"; then
      mv "$OUT/$side.$i.json" "$OUT/$side.$i.failed"
      echo "ab: $side run $i failed, left out (see $OUT/$side.$i.err)" >&2
    fi
  done
done

python3 - "$OUT" "$PAIRS" "$FIELD" <<'PY'
import json, statistics, sys
out, pairs, field = sys.argv[1], int(sys.argv[2]), sys.argv[3]
NAMES = ("op", "transport", "case", "processes", "clients_of_one_daemon", "slot_interval_ms", "weights", "rate", "threads", "batch", "block_size")
def points(side):
    got = {}
    for i in range(1, pairs + 1):
        try:
            lines = open(f"{out}/{side}.{i}.json").read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if not isinstance(o, dict):
                continue
            # A flag names a point only when set (the qos mode's daemon rows).
            key = tuple(f"{n}={o[n]}" for n in NAMES if o.get(n) is not None and o.get(n) is not False)
            if o.get("baseline") == "ring_alone" and "tent_mops" in o:
                got.setdefault(key + ("tent_mops",), []).append(o["tent_mops"])
            elif "baseline" not in o and isinstance(o.get(field), (int, float)):
                got.setdefault(key + (field,), []).append(o[field])
    return got
b, a = points("before"), points("after")
print(f"{'before':>10} {'after':>10} {'ratio':>7}  {'before spread':>22}  point")
for key in sorted(set(b) | set(a)):
    bv, av = b.get(key, []), a.get(key, [])
    name = " ".join(key)
    if not bv or not av:
        print(f"{'':>10} {'':>10} {'':>7}  {'':>22}  {name}: missing on one side ({len(bv)} before, {len(av)} after)")
        continue
    mb, ma = statistics.median(bv), statistics.median(av)
    ratio = ma / mb if mb else float("nan")
    spread = f"{min(bv):.4g}..{max(bv):.4g}"
    print(f"{mb:10.4g} {ma:10.4g} {ratio:7.3f}  {spread:>22}  {name} (n={len(bv)}/{len(av)})")
if not b or not a:
    print(f"ab: no figure from the {'before' if not b else 'after'} side", file=sys.stderr)
    sys.exit(1)
PY
