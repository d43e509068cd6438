#!/usr/bin/env bash
# Interleaved runs of one tent-bench binary with and without --scrape-hz 100
# (8 B shm WRITEs, --batch 32, 2 s each; odd pairs without first, even
# pairs with first): each run's tent_mops, then the medians and their ratio.
# BIN: the tent-bench to run (default: the one tools/ab.sh built last from the
# working tree); PAIRS (default 5). Issue #42's "a scrape loop cannot slow
# the engine" figure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/ab/work/release/tent-bench}
PAIRS=${PAIRS:-5}
run() {
  "$BIN" --block-size 8 --batch 32 --duration 2 --json "$@" 2>/dev/null |
    python3 -c 'import sys,json
for l in sys.stdin:
    try: o=json.loads(l)
    except Exception: continue
    if o.get("baseline")=="ring_alone" and "tent_mops" in o: print(o["tent_mops"]); break'
}
off=(); on=()
for i in $(seq 1 "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then order="off on"; else order="on off"; fi
  for mode in $order; do
    if [ "$mode" = on ]; then m=$(run --scrape-hz 100); on+=("$m"); else m=$(run); off+=("$m"); fi
    echo "pair $i $mode $m"
  done
done
python3 - "${off[@]}" -- "${on[@]}" <<'PY'
import sys,statistics
a=sys.argv[1:]; k=a.index('--'); off=list(map(float,a[:k])); on=list(map(float,a[k+1:]))
mo,mn=statistics.median(off),statistics.median(on)
print(f"without {mo:.3f}  with {mn:.3f}  ratio {mn/mo:.3f}  without spread {min(off):.2f}..{max(off):.2f}  with spread {min(on):.2f}..{max(on):.2f}")
PY
