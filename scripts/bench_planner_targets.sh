#!/usr/bin/env bash
# The step planner's targets: lookahead on vs off through the engine at 1, 4 and 16 requests in flight, on and off
# in the same run, with the pooled protocol of scripts/bench_concurrency.sh but a shorter minimum per arm.
# 16 prompts, 64 new tokens, chat. In order, so that a run cut short still has the most telling part:
#   1. greedy, one run of each set on its first 16 prompts (the prompts the planner was developed on);
#   2. greedy, held out: prompts 17-32 of mtbench and narrativeqa (--skip 16), never used in tuning;
#   3. mtbench sampled at temperature 1.0, at 4 and 16;
#   4. runs 2..RUNS of humaneval and narrativeqa.
# On an idle machine only: about 10 minutes a run.
# Usage: bash scripts/bench_planner_targets.sh [OUT_DIR] [RUNS] [MIN_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/planner-targets}
runs=${2:-3}
min_s=${3:-30}
data=benchmarks/prompts
mkdir -p "$out"
bench() {  # name set levels [flags...]
    local name=$1 set=$2 levels=$3
    shift 3
    .venv/bin/python -m benchmarks.bench --model smollm2-135m-instruct --prompts "$data/$set.jsonl" --limit 16 \
        --max-new-tokens 64 --chat --concurrency "$levels" --repeats 2 --min-seconds "$min_s" --warmup 2 \
        --json "$out/$name.json" "$@" | tee "$out/$name.log"
}
for set in humaneval narrativeqa debian_faq_zh mtbench; do
    bench "$set-run1" "$set" 1,4,16
done
bench mtbench-heldout mtbench 1,4,16 --skip 16
bench narrativeqa-heldout narrativeqa 1,4,16 --skip 16
bench mtbench-t1 mtbench 4,16 --temperature 1.0
for i in $(seq 2 "$runs"); do
    bench "humaneval-run$i" humaneval 1,4,16
    bench "narrativeqa-run$i" narrativeqa 1,4,16
done
.venv/bin/python -m benchmarks.bench_report "$out"/*.json | tee "$out/table.md"
