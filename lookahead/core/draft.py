"""Trie matches -> a `DraftTree`: the tokens one verification forward checks.

Vocabulary:
- root: the last accepted token. It is not yet in the KV cache, so it is row 0
  of the verification forward and every draft hangs below it.
- row: a position of the verification forward; row 0 is the root, rows 1..n
  are draft tokens. A row's parent always comes before it, so any prefix of the
  rows is itself a valid tree (the planner truncates that way).
- prob: the trie's estimate that a row lies on the accepted path, i.e.
  count(row's node) / (count(matched node) + 1); the +1 keeps an n-gram seen
  once from claiming certainty. For `hier` the rows come out in
  non-increasing prob order.

Modes (PIA's `decoding_mode`): `hier` takes the most frequent nodes of the
matched subtree, best first; `par` takes disjoint branches, each the most
frequent chain below one first-level child; `one` takes the single most
frequent chain.

Pure Python; no torch.
"""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from lookahead.core.ngram_index import NGramIndex
from lookahead.core.trie import TokenTrie

# A node of the matched subtree, one entry per source that has its path: (source, the source's node, the
# source's weight, its count x weight). The sources (TokenTrie, NGramIndex) answer `locate`, `has_children`,
# `count_of` and `branch` for their own kind of node: an id, a RangeNode.
_Entry = tuple[TokenTrie | NGramIndex, object, float, float]
_Virtual = list[_Entry]
PRIOR_COUNT = 1.0  # pseudo-count of "something unseen follows"


@dataclass
class DraftTree:
    tokens: list[int]  # [1 + n] row 0 = root token
    parents: list[int]  # [1 + n] parent row; parents[0] = -1
    depths: list[int]  # [1 + n] depth below the root; depths[0] = 0
    probs: list[float]  # [1 + n] estimated P(row accepted); probs[0] = 1
    match_length: int = 0  # context suffix length that matched the trie
    _children: list[dict[int, int]] | None = field(default=None, repr=False)

    @property
    def num_drafts(self) -> int:
        return len(self.tokens) - 1

    def truncated(self, num_drafts: int) -> "DraftTree":
        k = num_drafts + 1
        return DraftTree(self.tokens[:k], self.parents[:k], self.depths[:k], self.probs[:k], self.match_length)

    def children(self) -> list[dict[int, int]]:
        """children()[row] maps a child's token to its row."""
        if self._children is None:
            kids: list[dict[int, int]] = [{} for _ in self.tokens]
            for row in range(1, len(self.tokens)):
                kids[self.parents[row]][self.tokens[row]] = row
            self._children = kids
        return self._children


def root_only(token: int) -> DraftTree:
    return DraftTree([token], [-1], [0], [1.0])


def chain(tokens: list[int]) -> DraftTree:
    """One branch: tokens[0] is the root, each next token the child of the one before (start-up probes, timing)."""
    k = len(tokens)
    return DraftTree(list(tokens), list(range(-1, k - 1)), list(range(k)), [1.0] * k)


def _count(v: _Virtual) -> float:
    return v[0][3] if len(v) == 1 else sum(e[3] for e in v)


def _kids(v: _Virtual) -> dict[int, _Virtual]:
    if len(v) == 1:  # the common case, without the merge
        src, node, w, _ = v[0]
        return src.branch(node, w)
    merged: dict[int, _Virtual] = {}
    for src, node, w, _ in v:
        for t, entries in src.branch(node, w).items():
            merged.setdefault(t, []).extend(entries)
    return merged


def match(sources: Sequence[tuple[TokenTrie | NGramIndex, float]], context: Sequence[int], max_q: int, min_q: int) -> tuple[int, _Virtual]:
    """Longest context suffix (max_q down to min_q tokens) that some source continues."""
    for m in range(min(max_q, len(context)), min_q - 1, -1):
        key = context[len(context) - m :]
        found = []
        for trie, w in sources:
            if w <= 0:
                continue
            node = trie.locate(key)
            if node is not None and trie.has_children(node):
                found.append((trie, node, w, trie.count_of(node) * w))
        if found:
            return m, found
    return 0, []


def build_tree(
    root_token: int,
    matched: _Virtual,
    match_length: int,
    mode: str,
    max_drafts: int,
    max_depth: int,
    min_prob: float = 0.0,
    keep: int = 0,
) -> DraftTree:
    """`min_prob`, `keep` (hier only): once `keep` rows are in, stop at the first row less likely than
    `min_prob`. Rows come best first, so every row after it is less likely too."""
    tree = root_only(root_token)
    tree.match_length = match_length
    if not matched or max_drafts <= 0:
        return tree
    total = _count(matched) + PRIOR_COUNT
    if mode == "hier":
        _best_first(tree, matched, total, max_drafts, max_depth, min_prob * total, keep)
    else:
        branches = 1 if mode == "one" else max_drafts
        _chains(tree, matched, total, max_drafts, max_depth, branches)
    return tree


def _add(tree: DraftTree, token: int, parent: int, prob: float) -> int:
    tree.tokens.append(token)
    tree.parents.append(parent)
    tree.depths.append(tree.depths[parent] + 1)
    tree.probs.append(prob)
    return len(tree.tokens) - 1


def _best_first(tree: DraftTree, matched: _Virtual, total: float, max_drafts: int, max_depth: int,
                min_count: float = 0.0, keep: int = 0) -> None:
    heap: list[tuple[float, int, int, int, _Virtual]] = []
    seq = 0
    for tok, v in _kids(matched).items():
        heapq.heappush(heap, (-_count(v), seq, 0, tok, v))
        seq += 1
    while heap and tree.num_drafts < max_drafts:
        if -heap[0][0] < min_count and tree.num_drafts >= keep:
            return
        neg, _, parent, tok, v = heapq.heappop(heap)
        row = _add(tree, tok, parent, -neg / total)
        if tree.depths[row] < max_depth:
            for t2, v2 in _kids(v).items():
                heapq.heappush(heap, (-_count(v2), seq, row, t2, v2))
                seq += 1


def _chains(tree: DraftTree, matched: _Virtual, total: float, max_drafts: int, max_depth: int, branches: int) -> None:
    firsts = sorted(_kids(matched).items(), key=lambda kv: -_count(kv[1]))[:branches]
    for tok, v in firsts:
        parent = 0
        while tree.num_drafts < max_drafts:
            parent = _add(tree, tok, parent, _count(v) / total)
            kids = _kids(v)
            if not kids or tree.depths[parent] >= max_depth:
                break
            tok, v = max(kids.items(), key=lambda kv: _count(kv[1]))
        if tree.num_drafts >= max_drafts:
            return
