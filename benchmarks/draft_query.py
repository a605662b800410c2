"""How long one draft query takes at PIA's sizes: match the context in a 20k-token trie, build a 64-draft tree.

    .venv/bin/python benchmarks/draft_query.py

A benchmark, not a test: the time depends on the machine. It prints the
median and the 90th percentile over 300 queries, on a random corpus over
300 token ids, with contexts growing from 100 to 15,050 tokens.
"""

import random
import statistics
import time

from lookahead.core.draft import build_tree, match
from lookahead.core.trie import TokenTrie


def main() -> None:
    rng = random.Random(0)
    trie = TokenTrie(ngram_length=13)
    corpus = [rng.randrange(300) for _ in range(20000)]
    trie.add_sequence(corpus)
    times = []
    for i in range(300):
        ctx = corpus[: 100 + i * 50]
        t0 = time.perf_counter()
        m, matched = match([(trie, 1.0)], ctx, 4, 1)
        build_tree(ctx[-1], matched, m, "hier", 64, 12)
        times.append(time.perf_counter() - t0)
    times.sort()
    print(f"draft query (match + 64-draft hier tree, 20k-token trie): median {statistics.median(times) * 1e3:.3f} ms, "
          f"p90 {times[int(len(times) * 0.9)] * 1e3:.3f} ms over {len(times)} queries")


if __name__ == "__main__":
    main()
