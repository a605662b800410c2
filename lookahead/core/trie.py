"""Token trie of n-grams: the draft source of Lookahead decoding.

Vocabulary (after PIA Lookahead, KDD 2024):
- n-gram: `branch_length + 1` consecutive tokens of a prompt or an output. Its
  first token hangs off the root, so a path root -> ... is an n-gram prefix.
- count: how many inserted n-grams pass through a node. A child never counts
  more than its parent, so count(node) / count(matched node) is the empirical
  probability of that continuation.
- stop word: a token id that never starts an n-gram (punctuation, say), so it
  never opens a branch.

This trie, with `max_nodes` set, is the shared output memory: n-grams of
finished outputs, bounded hard by node count, evicted by frequency decay. A
request's own prompt and output so far live in its `NGramIndex`
(`ngram_index.py`), which answers the same lookups; nothing else sees it (PIA
keeps prompts in one shared slot, so concurrent requests wipe each other's
branches).

Pure Python; no torch.
"""

from collections.abc import Sequence


class TrieNode:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.count = 0.0


class TokenTrie:
    def __init__(
        self,
        ngram_length: int,
        stop_words: frozenset[int] = frozenset(),
        max_nodes: int | None = None,
        decay: float = 0.5,
        low_water: float = 0.75,
    ) -> None:
        assert ngram_length >= 2
        self.ngram_length = ngram_length
        self.stop_words = stop_words
        self.max_nodes = max_nodes
        self.decay = decay
        self.low_water = low_water
        self.root = TrieNode()
        self.node_count = 0
        self.evictions = 0

    # ---- insertion -------------------------------------------------------
    def _insert_path(self, tokens: Sequence[int], count_from: int, weight: float) -> TrieNode:
        """Walk `tokens` from the root, creating nodes; add `weight` at depths >= count_from; return the last node."""
        node = self.root
        for depth, tok in enumerate(tokens):
            child = node.children.get(tok)
            if child is None:
                child = node.children[tok] = TrieNode()
                self.node_count += 1
            if depth >= count_from:
                child.count += weight
            node = child
        return node

    def add_sequence(self, seq: Sequence[int], weight: float = 1.0) -> None:
        """Insert every n-gram of `seq` (the tail's shorter ones too), once each."""
        self.extend(seq, 0, len(seq), weight)

    def extend(self, seq: Sequence[int], old_len: int, new_len: int, weight: float = 1.0) -> None:
        """`seq` grew from `old_len` to `new_len` tokens: add what the new tokens complete.

        Every start position s owns one n-gram, seq[s : s + n]. Before the growth
        it covered min(n, old_len - s) tokens; only its new depths are counted, so
        an n-gram counts once however many steps it took to arrive.

        The n-grams still growing are tracked by their deepest nodes, so each
        new token adds one child per growing n-gram instead of walking every
        path from the root again: ~n dictionary steps per token rather than
        ~n^2 / 2.
        """
        n = self.ngram_length
        stop = self.stop_words
        # the n-grams cut short at old_len: their nodes (created uncounted if evicted since)
        growing = [(self._insert_path(seq[s:old_len], old_len - s, weight), old_len - s)
                   for s in range(max(0, old_len - n + 1), old_len) if seq[s] not in stop]
        for i in range(old_len, new_len):
            tok = seq[i]
            if tok not in stop:
                growing.append((self.root, 0))
            grown = []
            for node, depth in growing:
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = TrieNode()
                    self.node_count += 1
                child.count += weight
                if depth + 1 < n:
                    grown.append((child, depth + 1))
            growing = grown
        if self.max_nodes is not None and self.node_count > self.max_nodes:
            self.evict(int(self.max_nodes * self.low_water))

    def merge(self, other: "TokenTrie", weight: float = 1.0) -> None:
        """Add every node of `other` (its count x `weight`) into this trie, then keep within `max_nodes`.

        Counts add, so a merged trie weighs an n-gram by how often either side saw it: the fleet memory's
        snapshot joins what a replica learnt alone this way."""
        assert other.ngram_length == self.ngram_length, "tries of different n-gram lengths do not merge"
        stack = [(other.root, self.root)]
        while stack:
            src, dst = stack.pop()
            for tok, child in src.children.items():
                mine = dst.children.get(tok)
                if mine is None:
                    mine = dst.children[tok] = TrieNode()
                    self.node_count += 1
                mine.count += child.count * weight
                stack.append((child, mine))
        if self.max_nodes is not None and self.node_count > self.max_nodes:
            self.evict(int(self.max_nodes * self.low_water))

    # ---- lookup ----------------------------------------------------------
    def find(self, key: Sequence[int]) -> TrieNode | None:
        node = self.root
        for tok in key:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    # ---- bounded memory --------------------------------------------------
    def evict(self, target_nodes: int) -> None:
        """Decay every count, then drop subtrees whose count fell under 1, until at most target_nodes remain.

        Counts never grow with depth, so a dropped node takes only weaker
        descendants with it. Repeated decay drives every count under 1, so the
        loop ends.
        """
        while self.node_count > target_nodes:
            self.evictions += 1
            self.node_count = _decay_and_prune(self.root, self.decay, 1.0)

    def clear(self) -> None:
        self.root = TrieNode()
        self.node_count = 0


def _decay_and_prune(root: TrieNode, decay: float, floor: float) -> int:
    """Scale counts by `decay`, delete nodes under `floor`; return the nodes left."""
    kept = 0
    stack = [root]
    while stack:
        node = stack.pop()
        dead = []
        for tok, child in node.children.items():
            child.count *= decay
            if child.count < floor:
                dead.append(tok)
            else:
                kept += 1
                stack.append(child)
        for tok in dead:
            del node.children[tok]
    return kept
