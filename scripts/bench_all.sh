#!/usr/bin/env bash
# docs/benchmarks.md's single-stream benchmark: SmolLM2-135M, greedy, 128 new tokens, chat template, first 20 prompts of each set.
# Usage: bash scripts/bench_all.sh [OUT_DIR] [extra bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench}
shift || true
data=benchmarks/prompts
mkdir -p "$out"
for set in narrativeqa debian_faq_zh humaneval mtbench; do
    .venv/bin/python -m benchmarks.bench --model smollm2-135m-instruct --prompts "$data/$set.jsonl" \
        --limit 20 --max-new-tokens 128 --chat --json "$out/$set.json" "$@" | tee "$out/$set.log"
done
.venv/bin/python -m benchmarks.bench_report "$out"/*.json | tee "$out/table.md"
