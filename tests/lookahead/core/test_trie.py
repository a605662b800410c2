import random

from lookahead.core.trie import TokenTrie


def paths(trie, node=None, prefix=()):
    node = node or trie.root
    out = {}
    for tok, child in node.children.items():
        out[prefix + (tok,)] = child.count
        out.update(paths(trie, child, prefix + (tok,)))
    return out


def test_add_sequence_inserts_each_ngram_once():
    t = TokenTrie(ngram_length=3)
    t.add_sequence([1, 2, 3, 1, 2])
    # n-grams: 123, 231, 312, 12 (tail), 2 (tail); "1" starts two of them.
    p = paths(t)
    assert p[(1,)] == 2 and p[(1, 2)] == 2 and p[(1, 2, 3)] == 1
    assert p[(2,)] == 2 and p[(2, 3, 1)] == 1
    assert p[(3, 1, 2)] == 1
    assert t.node_count == len(p)


def test_extend_step_by_step_equals_one_shot():
    # Growing a sequence a few tokens at a time must count each n-gram exactly once.
    seq = [5, 6, 7, 5, 6, 8, 5, 6, 7, 9]
    one = TokenTrie(ngram_length=4)
    one.add_sequence(seq)
    inc = TokenTrie(ngram_length=4)
    inc.add_sequence(seq[:2])
    for old, new in [(2, 3), (3, 6), (6, 7), (7, 10)]:
        inc.extend(seq, old, new)
    assert paths(inc) == paths(one)


def test_child_count_never_exceeds_parent():
    t = TokenTrie(ngram_length=5)
    t.add_sequence([1, 2, 1, 2, 3, 1, 2, 1, 4, 1, 2, 1, 2])
    for path, count in paths(t).items():
        if len(path) > 1:
            assert count <= paths(t)[path[:-1]]


def test_stop_words_never_start_a_branch():
    t = TokenTrie(ngram_length=3, stop_words=frozenset({0}))
    t.add_sequence([0, 1, 2, 0, 3])
    assert 0 not in t.root.children  # but 0 may sit inside a branch:
    assert 0 in t.find([2]).children


def test_find_walks_a_path():
    t = TokenTrie(ngram_length=3)
    t.add_sequence([1, 2, 3])
    assert t.find([1, 2]).children.keys() == {3}
    assert t.find([2, 1]) is None


def test_hard_bound_holds_after_every_insert_and_keeps_frequent_ngrams():
    t = TokenTrie(ngram_length=4, max_nodes=200)
    frequent = [100, 101, 102, 103]
    for i in range(300):
        t.add_sequence(frequent)  # seen on every request
        t.add_sequence([1000 + i, 2000 + i, 3000 + i, 4000 + i])  # seen once each
        assert t.node_count <= 200
    assert t.evictions > 0
    assert t.find(frequent[:3]) is not None  # decay evicts the rare n-grams first
    assert t.node_count == len(paths(t))  # the count is exact after pruning


def test_open_ngrams_across_sequences_gaps_and_evictions_match_one_shot():
    import random

    rng = random.Random(3)
    for _ in range(50):
        stop = frozenset({0})
        seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(2)]
        one = TokenTrie(ngram_length=5, stop_words=stop)
        for s in seqs:
            one.add_sequence(s)
        inc = TokenTrie(ngram_length=5, stop_words=stop)
        grown = [[], []]
        while any(len(g) < len(s) for g, s in zip(grown, seqs)):
            k = rng.randrange(2)  # interleave two growing sequences: the open n-grams must follow the right one
            if len(grown[k]) == len(seqs[k]):
                continue
            old = len(grown[k])
            grown[k].extend(seqs[k][old : old + rng.randrange(1, 4)])
            inc.extend(grown[k], old, len(grown[k]))
        assert paths(inc) == paths(one) and inc.node_count == one.node_count

    bounded = TokenTrie(ngram_length=4, max_nodes=12)
    seq = []
    for tok in [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5]:
        seq.append(tok)
        bounded.extend(seq, len(seq) - 1, len(seq))  # evictions on the way drop open nodes: no count may vanish
        assert bounded.node_count <= 12
    assert bounded.find([4, 5]) is not None and bounded.find([4, 5]).count >= 1


def test_merge_adds_every_node_and_count_and_keeps_the_bound():
    a, b = TokenTrie(3), TokenTrie(3)
    a.add_sequence([1, 2, 3])
    b.add_sequence([1, 2, 4])
    b.add_sequence([5, 6])
    a.merge(b)
    assert a.find([1]).count == 2 and a.find([1, 2]).count == 2  # both saw 1, 2
    assert a.find([1, 2, 3]).count == 1 and a.find([1, 2, 4]).count == 1 and a.find([5, 6]).count == 1
    fresh = TokenTrie(3)
    fresh.add_sequence([1, 2, 3])
    fresh.add_sequence([1, 2, 4])
    fresh.add_sequence([5, 6])
    assert a.node_count == fresh.node_count  # node for node what inserting both sides' sequences builds
    small = TokenTrie(3, max_nodes=16)
    big = TokenTrie(3)
    for i in range(40):
        big.add_sequence([i, i + 1, i + 2])
    small.merge(big)
    assert small.node_count <= 16


def test_the_memory_holds_nothing_the_garbage_collector_walks():
    # A full collection walks every tracked container; a trie has no cycles, so it is built of parts the
    # collector does not walk (dicts of ints, an array of floats): a few objects, however many nodes.
    import gc

    gc.collect()
    before = len(gc.get_objects())
    rng = random.Random(0)
    t = TokenTrie(ngram_length=5, max_nodes=3000)
    for _ in range(100):
        t.add_sequence([rng.randrange(50) for _ in range(40)])
    assert t.node_count > 1000 and t.evictions > 0
    gc.collect()
    assert len(gc.get_objects()) - before <= 8
    assert not any(gc.is_tracked(kids) for kids in t._kids.values())  # a node's children: ints only


def test_evicted_ids_are_taken_again_and_counts_stay_consistent():
    t = TokenTrie(ngram_length=4, max_nodes=200)
    for i in range(100):
        t.add_sequence([i % 50, (i * 3) % 50, (i * 7) % 50, 1, 2])
        ids = [c for kids in t._kids.values() for c in kids.values()]
        assert len(ids) == len(set(ids)) == t.node_count <= 200  # every live node once, within the bound
        assert not set(ids) & set(t._free)
    assert len(t._counts) <= 201 + 4 * 5  # ids freed by eviction were reused: the array stays near the bound
