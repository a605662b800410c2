"""One decode step of a 16-row batch, timed and profiled: what the batch cache's layout costs inside a real step.

SmolLM2-135M fp32 on CPU; every row has `--context` tokens; each step verifies one token per row (plain decoding)
and commits it. Prints ms per step for three rounds of 20 steps, minor page faults per step, and with --profile
the top operators of 10 steps. `--root` runs another checkout's `lookahead` (an A/B of two commits):

    python benchmarks/kv_pool_step.py --root /tmp/old --rows 16 --context 300 --profile
"""

import argparse
import resource
import sys
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None, help="a checkout whose lookahead package to import (default: this one)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.root:
        sys.path.insert(0, args.root)
    from lookahead.core.draft import DraftTree
    from lookahead.model.models import load_model
    from lookahead.model.runner import ModelRunner

    lm = load_model("smollm2-135m-instruct", dtype="float32", device="cpu")
    runner = ModelRunner(lm.model)
    single = runner.new_cache(args.context + 80)
    runner.prefill(single, list(range(100, 100 + args.context)))
    try:
        cache = runner.new_batch_cache(args.rows, args.context + 80)
    except TypeError:  # a checkout from before the KV pool
        cache = runner.new_batch_cache(args.rows)
    for _ in range(args.rows):
        cache.admit(single, 80)
    trees = [DraftTree([5], [-1], [0], [1.0])] * args.rows

    def step():
        runner.verify_batch(cache, trees, 1, ragged=True).argmax()
        cache.commit([[0]] * args.rows)

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        rounds.append((time.perf_counter() - t0) / 20 * 1e3)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 60
    print(f"{args.rows} rows x {args.context} tokens: ms per step {' '.join(f'{r:.1f}' for r in rounds)}; "
          f"minor page faults per step {faults:.0f}")
    if args.profile:
        with torch.profiler.profile() as prof:
            for _ in range(10):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
