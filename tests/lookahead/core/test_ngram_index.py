"""The sorted n-gram index answers exactly as a trie of the same sequence does."""

import random

import pytest

from lookahead.core.ngram_index import NGramIndex
from lookahead.core.trie import TokenTrie


def subtree(node) -> dict:
    """A node's counts and children, fully expanded, for comparing two kinds of node."""
    return {"count": float(node.count), "kids": {t: subtree(c) for t, c in sorted(node.children.items())}}


@pytest.mark.parametrize("seed", range(6))
def test_index_equals_trie_while_the_sequence_grows(seed):
    rng = random.Random(seed)
    n = rng.choice([2, 4, 13])
    stop = frozenset({0}) if seed % 2 else frozenset()
    trie, index = TokenTrie(n, stop), NGramIndex(n, stop)
    seq: list[int] = []
    for _ in range(12):
        old = len(seq)
        seq += [rng.randrange(5) for _ in range(rng.choice([1, 1, 3, 40]))]  # decode steps and a bulk prefill
        trie.extend(seq, old, len(seq))
        index.extend(seq, old, len(seq))
        for m in (1, 2, 3):
            for key in {tuple(seq[-m:]), tuple(rng.randrange(5) for _ in range(m))}:
                t, i = trie.find(key), index.find(key)
                assert (t is None) == (i is None), key
                if t is not None:
                    assert subtree(i) == subtree(t), key


def test_stop_words_never_start_an_ngram_and_the_tail_is_cut_short():
    index = NGramIndex(3, frozenset({9}))
    index.extend([9, 1, 2, 1, 2], 0, 5)
    assert index.find([9]) is None  # 9 starts nothing
    node = index.find([1])
    assert node.count == 2 and set(node.children) == {2}
    assert node.children[2].count == 2 and set(node.children[2].children) == {1}  # [1, 2] at the end stops there


def test_a_long_context_leaves_the_garbage_collector_nothing_to_walk():
    # Its n-grams are tuples of ints: the collector stops tracking them at its first pass, so a long prompt
    # adds nothing to later full passes, which stop the engine thread for every object they walk.
    import gc

    gc.collect()
    before = len(gc.get_objects())
    seq = [(i * 31 + i // 7) % 101 for i in range(5000)]
    index = NGramIndex(13)
    index.extend(seq, 0, len(seq))
    assert len(index.keys) > 4900
    gc.collect()
    assert len(gc.get_objects()) - before <= 8
