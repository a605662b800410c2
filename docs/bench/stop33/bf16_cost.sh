#!/usr/bin/env bash
# Issue 17's cost of exactness, after the native kernels (exact_linear.cpp, paged_attention.cpp): SmolLM2 bf16 on
# CPU, the first 6 prompts of humaneval and mtbench, 64 new tokens, greedy, single stream; exact forwards (the
# default for bf16) and stock kernels (--inexact) back to back, as stop 31 measured them (docs/exactness.md).
#   bash docs/bench/stop33/bf16_cost.sh [OUT_DIR]
cd "$(git rev-parse --show-toplevel)"
out=${1:-docs/bench/stop33/bf16}
mkdir -p "$out"
for set in humaneval mtbench; do
  for arm in exact inexact; do
    flag=; [ $arm = inexact ] && flag=--inexact
    echo "$set $arm start $(date +%T)"
    .venv/bin/python -m benchmarks.bench --prompts benchmarks/prompts/$set.jsonl --limit 6 --max-new-tokens 64 --chat \
      --dtype bfloat16 $flag --json "$out/cost-$arm-$set.json" > "$out/cost-$arm-$set.log" 2>&1
    tail -4 "$out/cost-$arm-$set.log"
  done
done
