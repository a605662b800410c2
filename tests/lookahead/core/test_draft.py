import random

from lookahead.core.draft import build_tree, match, root_only
from lookahead.core.trie import TokenTrie


def trie_of(*seqs, n=5):
    t = TokenTrie(ngram_length=n)
    for s in seqs:
        t.add_sequence(s)
    return t


def test_match_prefers_the_longest_suffix():
    t = trie_of([9, 1, 2, 3, 4], [7, 2, 5, 6, 8])
    m, matched = match([(t, 1.0)], [0, 1, 2], max_q=3, min_q=1)
    # "1 2" is continued by 3; "2" alone would also offer 5. The longer match wins.
    assert m == 2 and set(t.kids_of(matched[0][1])) == {3}


def test_match_returns_nothing_below_min_query_length():
    t = trie_of([1, 2, 3])
    assert match([(t, 1.0)], [8, 9, 1], max_q=3, min_q=2) == (0, [])


def test_hier_rows_are_best_first_and_parents_come_first():
    t = trie_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7], [1, 8, 9, 9])
    m, matched = match([(t, 1.0)], [1], 4, 1)
    tree = build_tree(1, matched, m, "hier", max_drafts=10, max_depth=3)
    assert tree.tokens[0] == 1 and tree.parents[0] == -1
    assert all(p < r for r, p in enumerate(tree.parents) if r)
    assert tree.probs[1:] == sorted(tree.probs[1:], reverse=True)
    assert tree.tokens[1] == 2 and tree.probs[1] == 3 / (4 + 1)  # 3 of the 4 n-grams after "1" go on with 2; +1 prior


def test_hier_respects_budget_and_depth():
    t = trie_of([1, 2, 3, 4, 5, 6, 7, 8], n=8)
    m, matched = match([(t, 1.0)], [1], 4, 1)
    assert build_tree(1, matched, m, "hier", max_drafts=3, max_depth=10).num_drafts == 3
    assert max(build_tree(1, matched, m, "hier", max_drafts=10, max_depth=2).depths) == 2


def test_par_branches_are_disjoint_chains_and_one_is_a_single_chain():
    t = trie_of([1, 2, 3, 4], [1, 2, 3, 4], [1, 5, 6, 7])
    m, matched = match([(t, 1.0)], [1], 4, 1)
    par = build_tree(1, matched, m, "par", max_drafts=10, max_depth=3)
    assert par.tokens[1:] == [2, 3, 4, 5, 6, 7]
    assert par.parents[1:] == [0, 1, 2, 0, 4, 5]
    one = build_tree(1, matched, m, "one", max_drafts=10, max_depth=3)
    assert one.tokens[1:] == [2, 3, 4] and one.parents[1:] == [0, 1, 2]


def test_two_sources_merge_counts_with_weights():
    prompt = trie_of([1, 2, 3])
    memory = trie_of([1, 4, 5], [1, 4, 5], [1, 4, 5])
    m, matched = match([(prompt, 4.0), (memory, 1.0)], [1], 4, 1)
    tree = build_tree(1, matched, m, "hier", max_drafts=2, max_depth=1)
    # weighted counts after "1": 2 -> 4.0, 4 -> 3.0
    assert tree.tokens[1:] == [2, 4]


def test_truncated_prefix_is_a_valid_tree():
    t = trie_of([1, 2, 3, 4], [1, 5, 6, 7])
    m, matched = match([(t, 1.0)], [1], 4, 1)
    tree = build_tree(1, matched, m, "hier", 10, 3).truncated(2)
    assert tree.num_drafts == 2 and len(tree.parents) == len(tree.probs) == 3
    assert root_only(7).num_drafts == 0


def test_every_draft_path_at_full_size_is_an_ngram_the_trie_saw():
    """PIA's sizes (64 drafts, branches of 12, n-grams of 13) on a 20k-token corpus: the tree keeps its bounds,
    and every path from the root continues the matched context as the corpus did. (How fast such a query
    runs is measured by benchmarks/draft_query.py, not asserted here.)"""
    rng = random.Random(0)
    n = 13
    corpus = [rng.randrange(300) for _ in range(20000)]
    seen = {tuple(corpus[i:i + k]) for k in range(1, n + 1) for i in range(len(corpus) - k + 1)}
    t = TokenTrie(ngram_length=n)
    t.add_sequence(corpus)
    for i in range(0, 300, 10):
        ctx = corpus[: 100 + i * 50]
        m, matched = match([(t, 1.0)], ctx, 4, 1)
        tree = build_tree(ctx[-1], matched, m, "hier", 64, 12)
        assert m >= 1 and 0 < tree.num_drafts <= 64 and max(tree.depths) <= 12
        for node in range(1, len(tree.tokens)):
            path = []
            while node > 0:
                path.append(tree.tokens[node])
                node = tree.parents[node]
            assert tuple(ctx[len(ctx) - m:] + path[::-1]) in seen


def test_a_hier_tree_built_to_a_floor_is_the_full_trees_prefix_past_the_rows_kept():
    t = trie_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7], [1, 8, 9, 9], [1, 2, 3, 4])
    m, matched = match([(t, 1.0)], [1], 4, 1)
    full = build_tree(1, matched, m, "hier", 10, 3)
    for floor in (0.0, 0.3, 0.5, 0.7, 1.0):
        for keep in (0, 2):
            cut = build_tree(1, matched, m, "hier", 10, 3, min_prob=floor, keep=keep)
            kept = max(keep, sum(p >= floor for p in full.probs[1:]))
            assert cut.tokens == full.tokens[: 1 + kept] and cut.probs == full.probs[: 1 + kept]
    par = build_tree(1, matched, m, "par", 10, 3, min_prob=0.9)
    assert par.tokens == build_tree(1, matched, m, "par", 10, 3).tokens  # chains are not best first: no floor
