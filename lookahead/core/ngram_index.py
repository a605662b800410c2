"""A request's own draft source: its n-grams in a sorted list, read as a trie.

Same contents as a `TokenTrie` of the request's context (prompt + output so
far): every n-gram `seq[s : s + n]` whose first token is not a stop word,
those at the end cut short by the end of the sequence. Same answers: `find`
returns a node whose `count` is how many n-grams pass through it and whose
`children` map each next token to its node. What differs is the cost.

A trie pays one Python object and a few dictionary steps per token of every
n-gram up front (up to 13 nodes per token) before the request's first
draft. Here the n-grams are tuples in one list, sorted once (the comparisons
run in C): some forty times cheaper (docs/benchmarks.md, "Kernel
measurements"). Tuples of ints, unlike lists, leave the garbage collector's
tracking at its first pass, so a long prompt's n-grams add nothing to its
full passes. The
n-grams below a trie node are then one contiguous run of the sorted list, so
a node is just that run (`lo`, `hi`) and its depth, and its children are found
by binary search when something asks for them. A proposal looks at a few dozen
nodes; the rest are never built.

Only complete n-grams are in the list. The few at the end that the end of
the sequence still cuts short (fewer than n tokens; at most n - 1 of them) are
read from the sequence itself when `find` is asked, as a node's `tails`. So a
decode step that appends k tokens inserts k n-grams by binary search, and
moves nothing: the list never holds an n-gram that will grow.

One difference a caller can see: `children` come in token-id order, where a
trie's come in the order first seen, so a proposal breaks ties between equally
frequent continuations by token id. Measured accepted tokens per step did not
move (SmolLM2 at concurrency 1: humaneval 2.79 -> 2.78, narrativeqa 1.80 -> 1.78).

Nodes read the list as it was when `find` returned them; use them before the
next `extend`. Pure Python; no torch.
"""

from bisect import bisect_left, insort
from collections.abc import Sequence

_TOP = 1 << 62  # above every token id: key + (_TOP,) sorts after every n-gram that starts with key
_NONE: list[int] = []  # shared by every node without tails: never appended to (see `children`)
_BULK = 32  # appending more tokens than this at once sorts the whole list again instead of inserting each


class RangeNode:
    """The n-grams keys[lo:hi], and those cut short at the end of the sequence that start at each of `tails`:
    all of them start with the same `depth` tokens (the node's path)."""

    __slots__ = ("_index", "lo", "hi", "depth", "tails", "_children")

    def __init__(self, index: "NGramIndex", lo: int, hi: int, depth: int, tails: list[int]) -> None:
        self._index = index
        self.lo, self.hi, self.depth, self.tails = lo, hi, depth, tails
        self._children: dict[int, RangeNode] | None = None

    @property
    def count(self) -> int:
        return self.hi - self.lo + len(self.tails)

    @property
    def children(self) -> dict[int, "RangeNode"]:
        if self._children is None:
            index, d, hi = self._index, self.depth, self.hi
            keys = index.keys
            kids: dict[int, RangeNode] = {}
            i = self.lo if d < index.ngram_length else hi  # a path of n tokens has nothing below it
            while i < hi:
                tok = keys[i][d]
                j = bisect_left(keys, keys[i][:d] + (tok, _TOP), i + 1, hi)
                kids[tok] = RangeNode(index, i, j, d + 1, _NONE)
                i = j
            new = False
            for s in self.tails:  # a tail as long as the path ends here
                if index.length - s > d:
                    tok = index.seq[s + d]
                    if tok not in kids:
                        kids[tok], new = RangeNode(index, hi, hi, d + 1, _NONE), True
                    kids[tok].tails = [*kids[tok].tails, s]
            self._children = dict(sorted(kids.items())) if new else kids  # token-id order, as the keys give it
        return self._children


class NGramIndex:
    def __init__(self, ngram_length: int, stop_words: frozenset[int] = frozenset()) -> None:
        assert ngram_length >= 2
        self.ngram_length = ngram_length
        self.stop_words = stop_words
        self.keys: list[tuple[int, ...]] = []  # sorted: every complete n-gram, a tuple of n tokens
        self.seq: Sequence[int] = ()  # the sequence indexed (its first `length` tokens); the tails are read here
        self.length = 0
        self._tails: dict[int, list[int]] | None = None  # first token -> starts of cut-short n-grams (see find)

    def extend(self, seq: Sequence[int], old_len: int, new_len: int) -> None:
        """`seq` grew from `old_len` (the length indexed so far) to `new_len` tokens."""
        assert old_len == self.length, "extend the index from where it stopped"
        n, stop, keys = self.ngram_length, self.stop_words, self.keys
        # the n-grams the new tokens complete: those starting at s with old_len < s + n <= new_len
        fresh = [tuple(seq[s : s + n]) for s in range(max(0, old_len - n + 1), new_len - n + 1) if seq[s] not in stop]
        if len(fresh) > _BULK:
            keys.extend(fresh)
            keys.sort()
        else:
            for key in fresh:
                insort(keys, key)
        self.seq, self.length = seq, new_len
        self._tails = None  # first token -> starts of cut-short n-grams: rebuilt by the next find

    # draft.py's reads (the same as TokenTrie's, on this index's nodes)
    def locate(self, key: Sequence[int]) -> RangeNode | None:
        return self.find(key)

    @staticmethod
    def has_children(node: RangeNode) -> bool:
        return bool(node.children)

    @staticmethod
    def count_of(node: RangeNode) -> int:
        return node.count

    def branch(self, node: RangeNode, weight: float) -> dict[int, list[tuple]]:
        return {tok: [(self, c, weight, c.count * weight)] for tok, c in node.children.items()}

    def find(self, key: Sequence[int]) -> RangeNode | None:
        """The node of the path `key`: the n-grams that start with it, or None if none does."""
        key = tuple(key)
        m, seq, end = len(key), self.seq, self.length
        lo = bisect_left(self.keys, key)
        hi = bisect_left(self.keys, key + (_TOP,), lo)
        if self._tails is None:  # the cut-short n-grams' starts, by first token: once per extend
            self._tails = {}
            for s in range(max(0, end - self.ngram_length + 1), end):
                if seq[s] not in self.stop_words:
                    self._tails.setdefault(seq[s], []).append(s)
        starts = self._tails.get(key[0], ()) if key else [s for ss in self._tails.values() for s in ss]
        tails = [s for s in starts if s + m <= end and tuple(seq[s : s + m]) == key] if starts else _NONE
        return RangeNode(self, lo, hi, m, tails) if hi > lo or tails else None
