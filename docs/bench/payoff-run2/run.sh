#!/usr/bin/env bash
# After the payoff rework: the worst set first, then a held-out slice, then humaneval and narrativeqa.
cd "$(dirname "$0")/../../.."
out=${1:-results/run2}; mkdir -p $out
b() { name=$1; shift; .venv/bin/python -m lookahead.bench --model smollm2-135m-instruct --limit 16 --max-new-tokens 64 --chat --concurrency 1,4,16 --repeats 2 --min-seconds 30 --warmup 2 --json $out/$name.json "$@" > $out/$name.log 2>&1; }
b mtbench --prompts benchmarks/prompts/mtbench.jsonl
b mtbench-heldout --prompts benchmarks/prompts/mtbench.jsonl --skip 16
b humaneval --prompts benchmarks/prompts/humaneval.jsonl
b narrativeqa --prompts benchmarks/prompts/narrativeqa.jsonl
echo done
