#!/usr/bin/env bash
# docs/benchmarks.md's concurrency benchmark: N requests in flight through the engine, lookahead on vs off.
# Each level runs both arms twice, in the order on/off, off/on, and pools them (--repeats 2): a run of the
# same code moves by ~5% on this 2-vCPU machine, and the first runs in a process came out ~15-20% slower
# in traces, so a single on-then-off pair would charge that drift to the arm that runs first. Levels whose
# runs are short (16 requests at once are one ~12 s wave) get more rounds, in pairs, until each arm has run
# 60 s there (--min-seconds 60), so the noise weighs on every level about alike. Both arms first serve 4
# prompts unmeasured (--warmup 4), so the process's slow first runs land on no level.
# Usage: bash scripts/bench_concurrency.sh [OUT_DIR] [extra bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/concurrency}
shift || true
data=benchmarks/prompts
mkdir -p "$out"
for set in humaneval narrativeqa; do
    .venv/bin/python -m benchmarks.bench --model smollm2-135m-instruct --prompts "$data/$set.jsonl" \
        --limit 16 --max-new-tokens 128 --chat --concurrency 1,2,4,8,16 --repeats 2 --min-seconds 60 --warmup 4 --json "$out/$set.json" "$@" | tee "$out/$set.log"
done
.venv/bin/python -m benchmarks.bench_report "$out"/*.json | tee "$out/table.md"
