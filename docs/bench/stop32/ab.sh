#!/usr/bin/env bash
# Issue 16's "no slower": the CPU concurrency bench (1/4/16) at the commit before the KV pool (OLD) and with it
# (NEW), alternated old-new-new-old per prompt set in one session on an idle machine. Each worktree's own
# `lookahead` is imported (python -m from its root); both use the same .venv.
#   bash docs/bench/stop32/ab.sh OLD_DIR NEW_DIR OUT_DIR     (PY: the python to use; default the repo's .venv)
old=$1; new=$2; out=$3; py=${PY:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)/.venv/bin/python}
mkdir -p "$out"
for set in ${SETS:-humaneval narrativeqa}; do
  for arm in old new new old; do
    dir=$old; [ $arm = new ] && dir=$new
    n=$(ls "$out" | grep -c "^$set-$arm")
    tag=$set-$arm$n
    echo "$tag start $(date +%T)"
    (cd "$dir" && $py -m lookahead.bench --model smollm2-135m-instruct --prompts benchmarks/prompts/$set.jsonl \
      --limit 16 --max-new-tokens 64 --chat --concurrency 1,4,16 --repeats 1 --min-seconds 15 --warmup 1 \
      --json "$out/$tag.json" > "$out/$tag.log" 2>&1)
    echo "$tag done $(date +%T)"; grep "^concurrency" "$out/$tag.log"
  done
done
