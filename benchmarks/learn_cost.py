"""What learning a finished output into the output memory costs the engine thread, on real outputs.

Each prompt set's recorded SmolLM2 greedy outputs (`benchmarks/greedy_smollm2.json`) are added, in order, to
a memory of the default configuration (`TokenTrie.add_sequence`, what the engine's backlog runs), best of
`--repeats`. On a synchronous device this is time between two steps; on CUDA the backlog runs it while the
forward runs (lookahead/engine/backlog.py). Multiply the microseconds a token by the tokens a step delivers
across the batch for its share of a step:

    .venv/bin/python -m benchmarks.learn_cost
"""

import argparse
import json
import time
from pathlib import Path

from lookahead import LookaheadConfig
from lookahead.core.trie import TokenTrie

RECORDED = Path(__file__).resolve().parent / "greedy_smollm2.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outputs", type=Path, default=RECORDED, help="recorded greedy outputs (record_greedy.py)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    la = LookaheadConfig()
    print("| prompt set | outputs | tokens an output | ms an output | us a token |\n|---|---|---|---|---|")
    for name, rows in json.loads(args.outputs.read_text()).items():
        outputs = [r["out"] for r in rows]
        best = float("inf")
        for _ in range(args.repeats):
            memory = TokenTrie(la.branch_length + 1, la.stop_words, max_nodes=la.memory_max_nodes)
            t0 = time.perf_counter()
            for out in outputs:
                memory.add_sequence(out)
            best = min(best, time.perf_counter() - t0)
        tokens = sum(map(len, outputs))
        print(f"| {name} | {len(outputs)} | {tokens / len(outputs):.0f} | {best / len(outputs) * 1e3:.2f} "
              f"| {best / tokens * 1e6:.1f} |")


if __name__ == "__main__":
    main()
