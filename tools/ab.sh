#!/usr/bin/env bash
# Before/after figures the way DEVELOPERS.md asks for them: one session,
# interleaved runs of a `tent-bench` built at an earlier commit and of the
# working tree's, medians of each side and their ratio.
#
#   tools/ab.sh REF [--pairs N] [--field F] [--] TENT-BENCH-ARGS...
#
# REF is any commit (the one an issue starts from). Its `tent-bench` is
# built in a worktree under ${TENT_AB_DIR:-target/ab}/REF (kept, so a
# second call builds nothing); the working tree's is built as usual. Each
# pair runs before then after with the same arguments plus `--json`, N
# pairs (default 5). Every JSON line of a point (one with a block_size and
# no `baseline`) gives F (default `gbps`) per block size; a line with a
# `baseline` of `ring_alone` gives `tent_mops` (the `--batch` small-op
# figure). Printed: per key, the before and after medians, their ratio,
# and the before runs' min..max (the spread a p99 or QoS figure must stay
# in). The raw lines stay in the run's folder, which is printed first.
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
if [ ! -d "$TREE" ]; then
  mkdir -p "$BASE"
  git worktree add --detach "$TREE" "$SHA" >/dev/null
fi
echo "ab: building tent-bench at ${SHA:0:12} and in the working tree" >&2
(cd "$TREE" && cargo build --release -q -p tent-tools --bin tent-bench)
cargo build --release -q -p tent-tools --bin tent-bench
BEFORE=$TREE/target/release/tent-bench
AFTER=$ROOT/target/release/tent-bench

OUT=$(mktemp -d "${TMPDIR:-/tmp}/tent-ab.XXXXXX")
echo "ab: runs in $OUT; before ${SHA:0:12}, after the working tree ($(git describe --always --dirty)); args: $* --json" >&2
for i in $(seq 1 "$PAIRS"); do
  for side in before after; do
    bin=$BEFORE; [ "$side" = after ] && bin=$AFTER
    if ! "$bin" "$@" --json > "$OUT/$side.$i.json" 2> "$OUT/$side.$i.err"; then
      echo "ab: $side run $i failed (see $OUT/$side.$i.err)" >&2
    fi
  done
done

python3 - "$OUT" "$PAIRS" "$FIELD" <<'PY'
import json, statistics, sys
out, pairs, field = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def points(side):
    got = {}
    for i in range(1, pairs + 1):
        try:
            lines = open(f"{out}/{side}.{i}.json").read().splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            if o.get("baseline") == "ring_alone" and "tent_mops" in o:
                got.setdefault(("batch", o.get("block_size"), "tent_mops"), []).append(o["tent_mops"])
            elif "baseline" not in o and "block_size" in o and o.get(field) is not None:
                got.setdefault((o.get("op", ""), o["block_size"], field), []).append(o[field])
    return got
b, a = points("before"), points("after")
print(f"{'op':6} {'block':>10} {'figure':10} {'before':>10} {'after':>10} {'ratio':>7}  before spread")
for key in sorted(set(b) | set(a), key=lambda k: (k[0], k[1] or 0)):
    bv, av = b.get(key, []), a.get(key, [])
    if not bv or not av:
        print(f"{key[0]:6} {key[1]!s:>10} {key[2]:10} missing on one side ({len(bv)} before, {len(av)} after)")
        continue
    mb, ma = statistics.median(bv), statistics.median(av)
    ratio = ma / mb if mb else float("nan")
    print(f"{key[0]:6} {key[1]!s:>10} {key[2]:10} {mb:10.4g} {ma:10.4g} {ratio:7.3f}  {min(bv):.4g}..{max(bv):.4g}  (n={len(bv)}/{len(av)})")
PY
