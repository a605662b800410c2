#!/usr/bin/env bash
# Issue 17's agreement after the native kernels: docs/bench/stop31/bf16/run32.sh's two runs (SmolLM2 bf16, the 32
# prompts of mixed32.jsonl, 128 new tokens, greedy; single stream, then 16 in flight), from SRC (a checkout or a
# copy of the package, so that the tree can change while it runs) into OUT.
#   bash docs/bench/stop33/agree.sh SRC OUT      (PY: the python; default the repo's .venv)
src=$1; out=$(realpath "$2"); py=${PY:-$(git rev-parse --show-toplevel)/.venv/bin/python}
cd "$src"
$py -m benchmarks.bench --prompts $out/mixed32.jsonl --max-new-tokens 128 --chat --dtype bfloat16 \
  --json $out/mixed32-single.json > $out/mixed32-single.log 2>&1
$py -m benchmarks.bench --prompts $out/mixed32.jsonl --max-new-tokens 128 --chat --dtype bfloat16 \
  --concurrency 16 --json $out/mixed32-c16.json > $out/mixed32-c16.log 2>&1
