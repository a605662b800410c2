#!/usr/bin/env bash
# After the A/B (docs/bench/stop32/ab.sh), on the same idle machine: one decode step of 16 rows through the batch
# cache at the commit before the KV pool (OLD), with the pool gathered (LOOKAHEAD_NATIVE=0) and read in place by the
# paged kernel; then issue 17's cost of exactness (bf16_cost.sh).
#   bash docs/bench/stop33/post.sh OLD_DIR OUT_DIR
old=$1; out=$2; py=${PY:-.venv/bin/python}
cd "$(git rev-parse --show-toplevel)"
mkdir -p "$out"
for shape in "16 300" "16 1000" "4 600"; do
  set -- $shape
  for arm in old gather paged; do
    case $arm in
      old) $py benchmarks/kv_pool_step.py --root "$old" --rows $1 --context $2 ;;
      gather) LOOKAHEAD_NATIVE=0 $py benchmarks/kv_pool_step.py --rows $1 --context $2 ;;
      paged) $py benchmarks/kv_pool_step.py --rows $1 --context $2 ;;
    esac 2>/dev/null | grep "ms per step" | sed "s/^/$arm: /"
  done
done | tee "$out/step.out"
bash docs/bench/stop33/bf16_cost.sh "$out/bf16" 2>&1 | tee "$out/bf16_cost.out"
