#!/usr/bin/env bash
# issue 15's required runs: greedy, 16 prompts, 64 tokens, concurrency 1,4,16, on/off in the same run
cd "$(git rev-parse --show-toplevel)"
out=${1:-docs/bench/stop31}; i=0
for set in humaneval narrativeqa humaneval narrativeqa debian_faq_zh mtbench humaneval narrativeqa; do
  i=$((i+1))
  echo "run $i $set start $(date +%T)"
  .venv/bin/python -m lookahead.bench --model smollm2-135m-instruct --prompts benchmarks/prompts/$set.jsonl \
    --limit 16 --max-new-tokens 64 --chat --concurrency 1,4,16 --repeats 2 --min-seconds 45 --warmup 2 \
    --json $out/run$i-$set.json > $out/run$i-$set.log 2>&1
  echo "run $i $set done $(date +%T)"; grep "^concurrency" $out/run$i-$set.log
done
