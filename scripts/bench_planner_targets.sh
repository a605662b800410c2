#!/usr/bin/env bash
# The step planner's targets (docs/planner.md): lookahead on vs off through the engine at 1, 4 and 16 requests in
# flight, on and off in the same run, with the pooled protocol of scripts/bench_concurrency.sh but a shorter
# minimum per arm. Greedy: RUNS runs each of humaneval and narrativeqa, one each of debian_faq_zh and mtbench;
# then mtbench sampled at temperature 1.0 at 4 and 16. On an idle machine only: about 10 minutes a run.
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
    .venv/bin/python -m lookahead.bench --model smollm2-135m-instruct --prompts "$data/$set.jsonl" --limit 16 \
        --max-new-tokens 64 --chat --concurrency "$levels" --repeats 2 --min-seconds "$min_s" --warmup 2 \
        --json "$out/$name.json" "$@" | tee "$out/$name.log"
}
for i in $(seq 1 "$runs"); do
    bench "humaneval-run$i" humaneval 1,4,16
    bench "narrativeqa-run$i" narrativeqa 1,4,16
done
bench debian_faq_zh debian_faq_zh 1,4,16
bench mtbench mtbench 1,4,16
bench mtbench-t1 mtbench 4,16 --temperature 1.0
.venv/bin/python -m lookahead.bench_report "$out"/*.json | tee "$out/table.md"
