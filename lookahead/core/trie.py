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

Nodes are ids, not objects. A node's children are a dict of token -> child id
(`_kids[node]`, only for nodes with children), and its count is a float in
one array (`_counts[node]`). A dropped node's id is taken again. Python's
cyclic garbage collector never tracks a dict of ints, and the array holds
no references. So a full collection, which stops the engine thread, does
not walk the memory. With ~918k nodes a pass took ~460 ms as one object
(and one dict) per node, and ~16 ms this way, over the one tracked dict of
dicts (docs/benchmarks.md, "Garbage-collector pauses from the output
memory"). A trie has no cycles, so the collector never had anything to find
there. `find` and `root` hand out `TrieNode` views (count, children) made on
demand. draft.py reads nodes by id (`locate`, `has_children`, `count_of`,
`branch`), as it reads the n-gram index's `RangeNode`s.

Pure Python; no torch.
"""

from array import array
from collections.abc import Sequence

ROOT = 0  # the root's id
_NONE: dict[int, int] = {}  # the children of a node without any: never written


class TrieNode:
    """A view of one node: its `count`, and its `children` (token -> view), read from the trie when asked."""

    __slots__ = ("_trie", "id")

    def __init__(self, trie: "TokenTrie", node_id: int) -> None:
        self._trie, self.id = trie, node_id

    @property
    def count(self) -> float:
        return self._trie._counts[self.id]

    @property
    def children(self) -> dict[int, "TrieNode"]:
        trie = self._trie
        return {tok: TrieNode(trie, child) for tok, child in trie._kids.get(self.id, _NONE).items()}


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
        self.evictions = 0
        self.clear()

    @property
    def root(self) -> TrieNode:
        return TrieNode(self, ROOT)

    @property
    def node_count(self) -> int:
        """Nodes below the root."""
        return len(self._counts) - 1 - len(self._free)

    # ---- nodes by id (the store and the merge read and build tries this way) ---
    def kids_of(self, node: int) -> dict[int, int]:
        """token -> child id; do not modify."""
        return self._kids.get(node, _NONE)

    def count_of(self, node: int) -> float:
        return self._counts[node]

    def add_child(self, node: int, tok: int, count: float = 0.0) -> int:
        """A new child of `node` under `tok` (there must be none yet); its id."""
        if self._free:
            child = self._free.pop()
            self._counts[child] = count
        else:
            child = len(self._counts)
            self._counts.append(count)
        kids = self._kids.get(node)
        if kids is None:
            kids = self._kids[node] = {}
        kids[tok] = child
        return child

    def _child(self, node: int, tok: int) -> int:
        """`node`'s child under `tok`, made (count 0) if missing."""
        kids = self._kids.get(node)
        if kids is not None:
            child = kids.get(tok)
            if child is not None:
                return child
        return self.add_child(node, tok)

    # ---- insertion -------------------------------------------------------
    def _insert_path(self, tokens: Sequence[int], count_from: int, weight: float) -> int:
        """Walk `tokens` from the root, creating nodes; add `weight` at depths >= count_from; return the last node."""
        node, counts = ROOT, self._counts
        for depth, tok in enumerate(tokens):
            node = self._child(node, tok)
            if depth >= count_from:
                counts[node] += weight
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
        counts, kids, add = self._counts, self._kids, self.add_child
        # the n-grams cut short at old_len: their nodes (created uncounted if evicted since)
        growing = [(self._insert_path(seq[s:old_len], old_len - s, weight), old_len - s)
                   for s in range(max(0, old_len - n + 1), old_len) if seq[s] not in stop]
        for i in range(old_len, new_len):
            tok = seq[i]
            if tok not in stop:
                growing.append((ROOT, 0))
            grown = []
            for node, depth in growing:  # `_child`, inlined: this loop runs ~n times a token learnt
                below = kids.get(node)
                child = None if below is None else below.get(tok)
                if child is None:
                    child = add(node, tok)
                counts[child] += weight
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
        counts, theirs = self._counts, other._counts
        stack = [(ROOT, ROOT)]
        while stack:
            src, dst = stack.pop()
            for tok, child in other.kids_of(src).items():
                mine = self._child(dst, tok)
                counts[mine] += theirs[child] * weight
                stack.append((child, mine))
        if self.max_nodes is not None and self.node_count > self.max_nodes:
            self.evict(int(self.max_nodes * self.low_water))

    # ---- lookup ----------------------------------------------------------
    def find(self, key: Sequence[int]) -> TrieNode | None:
        node = self.locate(key)
        return None if node is None else TrieNode(self, node)

    def locate(self, key: Sequence[int]) -> int | None:
        """The id of the node of the path `key`, or None."""
        node, kids = ROOT, self._kids
        for tok in key:
            node = kids.get(node, _NONE).get(tok)
            if node is None:
                return None
        return node

    # draft.py's reads, on ids: no view is made while a tree is built
    def has_children(self, node: int) -> bool:
        return node in self._kids

    def branch(self, node: int, weight: float) -> dict[int, list[tuple]]:
        """token -> [(self, child, weight, child's count x weight)]: draft.py's entries for `node`'s children."""
        counts = self._counts
        return {tok: [(self, c, weight, counts[c] * weight)] for tok, c in self._kids.get(node, _NONE).items()}

    # ---- bounded memory --------------------------------------------------
    def evict(self, target_nodes: int) -> None:
        """Decay every count, then drop subtrees whose count fell under 1, until at most target_nodes remain.

        Counts never grow with depth, so a dropped node takes only weaker
        descendants with it. Repeated decay drives every count under 1, so the
        loop ends.
        """
        while self.node_count > target_nodes:
            self.evictions += 1
            self._decay_and_prune(self.decay, 1.0)

    def clear(self) -> None:
        self._kids: dict[int, dict[int, int]] = {}  # node -> {token: child}, for nodes with children
        self._counts = array("d", [0.0])  # [id] the node's count (the root's: 0)
        self._free: list[int] = []  # ids of dropped nodes, taken again first

    def adopt(self, other: "TokenTrie") -> None:
        """Take `other`'s nodes as this trie's own (`other` is not to be used after)."""
        self._kids, self._counts, self._free = other._kids, other._counts, other._free

    def _decay_and_prune(self, decay: float, floor: float) -> None:
        """Scale counts by `decay`, delete the subtrees of nodes under `floor`."""
        counts, kids = self._counts, self._kids
        stack = [ROOT]
        while stack:
            node = stack.pop()
            mine = kids.get(node)
            if mine is None:
                continue
            dead = []
            for tok, child in mine.items():
                c = counts[child] * decay
                counts[child] = c
                if c < floor:
                    dead.append(tok)
                else:
                    stack.append(child)
            for tok in dead:
                self._drop(mine.pop(tok))
            if not mine:
                del kids[node]

    def _drop(self, node: int) -> None:
        """Forget `node` and everything below it (their ids go to the free list)."""
        free, kids = self._free, self._kids
        stack = [node]
        while stack:
            n = stack.pop()
            free.append(n)
            below = kids.pop(n, None)
            if below:
                stack.extend(below.values())
