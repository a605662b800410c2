#!/usr/bin/env bash
# issue 17's agreement measurement: SmolLM2 bf16, 32 prompts (the first 8 of each of the four sets), 128 new tokens,
# greedy; single stream (lookahead vs the engine's own plain loop vs HF generate, with the first divergence and the
# reference's top-2 gap) and 16 in flight (the on arm's outputs against the off arm's)
cd "$(git rev-parse --show-toplevel)"
out=${1:-docs/bench/stop31/bf16}
py=.venv/bin/python
$py -m lookahead.bench --prompts $out/mixed32.jsonl --max-new-tokens 128 --chat --dtype bfloat16 \
  --json $out/mixed32-single.json > $out/mixed32-single.log 2>&1
$py -m lookahead.bench --prompts $out/mixed32.jsonl --max-new-tokens 128 --chat --dtype bfloat16 \
  --concurrency 16 --json $out/mixed32-c16.json > $out/mixed32-c16.log 2>&1
