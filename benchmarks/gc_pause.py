"""How long one full pass of Python's cyclic collector stops a replica, before and after `lookahead.core.heap.settle`.

    python -m benchmarks.gc_pause --memory-nodes 400000

Loads the model as a replica does, fills an output memory with about
`--memory-nodes` trie nodes (random n-grams: the memory a long-running
replica accumulates), and times a full collection before and after
settling, then again after the memory has learnt as many nodes more (what a
replica learns while it serves, which no settle froze). A full pass comes
round each time the long-lived objects grow by a quarter, and the engine
thread stops for its whole length.
"""

import argparse
import gc
import random
import time

from lookahead.core import heap
from lookahead.model.models import load_model
from lookahead.model.runner import ModelRunner
from lookahead.core.trie import TokenTrie


def full_pass_ms() -> float:
    t0 = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--memory-nodes", type=int, default=400_000)
    args = ap.parse_args(argv)
    lm = load_model(args.model)
    ModelRunner(lm.model)
    memory, rng = TokenTrie(13, max_nodes=10 * args.memory_nodes), random.Random(0)
    while memory.node_count < args.memory_nodes:
        memory.add_sequence([rng.randrange(2000) for _ in range(128)])
    print(f"{len(gc.get_objects())} objects tracked, {memory.node_count} memory nodes")
    print(f"full pass before settle: {full_pass_ms():.0f} ms")
    frozen, _ = heap.settle()
    print(f"full pass after settle ({frozen} objects frozen): {full_pass_ms():.0f} ms")
    # What a replica learns while it serves is not frozen: the memory's own layout decides what a pass walks
    grown = memory.node_count
    while memory.node_count < grown + args.memory_nodes:
        memory.add_sequence([rng.randrange(2000) for _ in range(128)])
    print(f"full pass after {memory.node_count - grown} more memory nodes learnt since: {full_pass_ms():.0f} ms "
          f"({len(gc.get_objects())} objects tracked)")


if __name__ == "__main__":
    main()
