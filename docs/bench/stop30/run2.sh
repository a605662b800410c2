#!/usr/bin/env bash
repo=$(git rev-parse --show-toplevel)
out=$(realpath -m ${1:-results/stop30}); mkdir -p $out
# the commit before the planner, beside this one: git worktree add /tmp/old 249d58f
py=$repo/.venv/bin/python
ss() { dir=$1; tag=$2; set=$3; (cd $dir && $py -m lookahead.bench --model smollm2-135m-instruct --prompts $repo/benchmarks/prompts/$set.jsonl --limit 10 --max-new-tokens 128 --chat --json $out/ss2-$tag-$set.json > $out/ss2-$tag-$set.log 2>&1); }
ss $repo new narrativeqa; ss /tmp/old old narrativeqa
ss /tmp/old old mtbench; ss $repo new mtbench
echo "ss done $(date)"
cd $repo
for a in "mtbench 4" "humaneval 4" "mtbench 16" "humaneval 16"; do $py $repo/docs/bench/stop30/abba.py $a 6 2>&1 | grep -v Warn | grep -v Loading | sed "s/^/$a: /"; done
echo "all done $(date)"
