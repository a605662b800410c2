#!/usr/bin/env bash
# Stop 30's measurements, one after another on an idle machine.
repo=$(git rev-parse --show-toplevel)
out=$(realpath -m ${1:-results/stop30}); mkdir -p $out
# the commit before the planner, beside this one: git worktree add /tmp/old 249d58f
py=$repo/.venv/bin/python
ss() { dir=$1; tag=$2; set=$3; (cd $dir && $py -m lookahead.bench --model smollm2-135m-instruct --prompts $repo/benchmarks/prompts/$set.jsonl --limit 10 --max-new-tokens 128 --chat --json $out/ss-$tag-$set.json > $out/ss-$tag-$set.log 2>&1); }
# 1. single stream: this commit against 249d58f (before the planner), alternating which goes first
ss /tmp/old old humaneval; ss $repo new humaneval
ss $repo new narrativeqa; ss /tmp/old old narrativeqa
ss /tmp/old old mtbench; ss $repo new mtbench
ss $repo new debian_faq_zh; ss /tmp/old old debian_faq_zh
echo "single stream done $(date)"
b() { name=$1; shift; (cd $repo && $py -m lookahead.bench --model smollm2-135m-instruct --limit 16 --max-new-tokens 64 --chat --repeats 2 --min-seconds 30 --warmup 2 --json $out/$name.json "$@" > $out/$name.log 2>&1); }
# 2. sampled at temperature 1.0, mtbench, 4 and 16
b mtbench-t1 --prompts benchmarks/prompts/mtbench.jsonl --concurrency 4,16 --temperature 1.0
echo "t1 done $(date)"
# 3. greedy, 1/4/16, with the full-batch split
b mtbench --prompts benchmarks/prompts/mtbench.jsonl --concurrency 1,4,16
echo "mtbench done $(date)"
b humaneval --prompts benchmarks/prompts/humaneval.jsonl --concurrency 1,4,16
echo "all done $(date)"
