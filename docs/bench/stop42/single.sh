#!/usr/bin/env bash
# Issues 37/40: single stream, fp32, greedy, against HF generate in the same run, at several commits.
#   PY=.venv/bin/python bash docs/bench/stop41/single.sh OUT COMMIT...
# Each commit is checked out in a worktree under /tmp/la-wt and benched with this venv (the project on
# PYTHONPATH from the worktree), on the shipped humaneval and mtbench sets: 8 prompts each, 96 new tokens,
# chat template. Before aeb89bd the bench is lookahead.bench; after a8ae2ce, benchmarks.bench.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
OUT=$(realpath -m "$1"); shift
SETS=${SETS:-"humaneval mtbench"}
PROMPTS=${PROMPTS:-$ROOT/benchmarks/prompts}  # a folder of <set>.jsonl files
LIMIT=${LIMIT:-8}
TOKENS=${TOKENS:-96}
TAG=${TAG:-}  # appended to the file names (repeats)
mkdir -p "$OUT" /tmp/la-wt
for c in "$@"; do
    wt=/tmp/la-wt/$c
    [ -d "$wt" ] || git worktree add -q --detach "$wt" "$c"
    mod=benchmarks.bench
    [ -f "$wt/benchmarks/bench.py" ] || mod=lookahead.bench
    for s in $SETS; do
        echo "== $c $s ($mod)"
        (cd "$wt" && OMP_NUM_THREADS=2 PYTHONPATH="$wt" "$PY" -m "$mod" --prompts "$PROMPTS/$s.jsonl" \
            --limit "$LIMIT" --max-new-tokens "$TOKENS" --chat --dtype float32 --device cpu \
            --json "$OUT/$c-$s$TAG.json" > "$OUT/$c-$s$TAG.log" 2>&1) || echo "   exit $? (see $OUT/$c-$s$TAG.log)"
        grep -E "own plain|lookahead " "$OUT/$c-$s$TAG.log" | tail -2
    done
done
