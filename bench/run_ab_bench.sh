#!/usr/bin/env bash
# Side-by-side EP benchmark of two builds in one GPU session: the base (an older source tree and its
# precompiled bundles) and this checkout (bundles in ./.bundles), interleaved for ROUNDS rounds so that
# drift of the machine falls on both. Then bench/ab_compare.py prints new/base per leg.
#   bash bench/run_ab_bench.sh BASE_SRC BASE_BUNDLES [ROUNDS]     (logs and JSON in $OUT, else ./ab-logs)
# The base is installed into a private folder (PYTHONPATH) so each side imports its own runtime.
set -uo pipefail
base_src=$1 base_bundles=$2 rounds=${3:-2}
OUT=${OUT:-ab-logs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/ab_base_site "$base_src" 2>&1 | grep -v WARNING | tail -2
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
side() {  # side NAME ROUND: run both benchmarks with that side's runtime and bundles
  local name=$1 r=$2 env=() src=.
  if [ "$name" = base ]; then env=(PYTHONPATH=/tmp/ab_base_site MORI_COMPILER_CACHE_DIR=$base_bundles); src=$base_src
  else env=(MORI_COMPILER_CACHE_DIR=$PWD/.bundles); fi
  (cd /tmp && env "${env[@]}" python3 -c "import mori_compiler; print('$name runtime:', mori_compiler.__file__)")
  env "${env[@]}" timeout 200 python3 "$src/bench/ep_bench.py" --json "$OUT/${name}_ep_$r.json" > "$OUT/${name}_ep_$r.log" 2>&1 \
    || { echo "$name ep_bench round $r failed"; tail -5 "$OUT/${name}_ep_$r.log"; }
  env "${env[@]}" timeout 200 python3 "$src/bench/ep_ll_bench.py" --ll-blocks 16,32 --json "$OUT/${name}_ll_$r.json" \
    > "$OUT/${name}_ll_$r.log" 2>&1 || { echo "$name ep_ll_bench round $r failed"; tail -5 "$OUT/${name}_ll_$r.log"; }
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then side base "$r"; side new "$r"; else side new "$r"; side base "$r"; fi
done
python3 bench/ab_compare.py "$OUT"/base_ep_*.json -- "$OUT"/new_ep_*.json | tee "$OUT/ab_ep.txt"
python3 bench/ab_compare.py "$OUT"/base_ll_*.json -- "$OUT"/new_ll_*.json | tee "$OUT/ab_ll.txt"
