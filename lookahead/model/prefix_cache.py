"""Prompt KV reused across requests that share a prefix.

Several questions about one document, or one long system prompt in front of
every chat, make requests whose prompts start alike. Their prefill is the
same computation: keys and values at positions 0..n-1 depend only on tokens
0..n-1. The engine keeps the prompt KV of recent requests here and, when a
new prompt starts with at least `min_tokens` of a kept prompt, copies those
entries into the new request's range and prefills only the rest.

Inside the KV budget: an entry is a range of the engine's pool, reserved in
the same ledger as the running requests' ranges, and checked against the
ledger and `max_bytes` before anything is copied. Least recently used out
first, within `max_bytes`; and first out of all, when a waiting request
needs room (`evict_one`, which the scheduler calls). A prompt that extends a
kept one replaces it (it covers everything the shorter one could serve).
Entries are copied on reuse, not shared in place: a request's range is
contiguous, so it cannot point into another's.

What it changes: time to first token and prefill compute, for lookahead on
and off alike (the reuse happens before decoding starts). The reused KV was
computed in different prefill chunks than a fresh prefill would use, which
differs only in float rounding order, like chunked prefill itself; the
losslessness tests run with it on.
"""

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only its bookkeeping and `copy_range` are used here
    from lookahead.model.batch_cache import BatchKVCache

_BLOCK = 64  # tokens compared per list slice when finding a common prefix


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (block-wise slice compares, then per token)."""
    n = min(len(a), len(b))
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)  # compared by identity: it is its own key in the ledger
class PrefixEntry:
    tokens: list[int]  # the prompt tokens whose KV is held, in order
    nbytes: int  # the whole blocks its range takes from the budget


class PrefixCache:
    def __init__(self, pool: "BatchKVCache", max_bytes: int, min_tokens: int = 32) -> None:
        self.pool = pool
        self.ledger = pool.ledger
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # insertion/LRU order, oldest first
        self._next = 0
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        while self.evict_one():
            pass

    def _longest(self, tokens: list[int]) -> tuple[int | None, int]:
        best, best_n = None, 0
        for key, entry in self._entries.items():
            n = common_prefix_length(entry.tokens, tokens)
            if n > best_n:
                best, best_n = key, n
        return best, best_n

    def load_into(self, dst: int, tokens: list[int]) -> int:
        """Copy the longest kept prefix of `tokens` to pool slots [dst, ...) (an empty request range); return
        how many tokens it covers."""
        if not self.enabled:
            return 0
        key, n = self._longest(tokens)
        if key is None or n < self.min_tokens:
            return 0
        entry = self._entries[key]
        self._entries.move_to_end(key)
        self.pool.copy_range(self.ledger.offset(entry), dst, n)
        self.hits += 1
        self.reused_tokens += n
        return n

    def store(self, src: int, tokens: list[int]) -> None:
        """Keep the KV of `tokens`, held at pool slots [src, src + len(tokens)), for later prompts."""
        n = len(tokens)
        if not self.enabled or n < self.min_tokens:
            return
        for key, entry in list(self._entries.items()):
            shared = common_prefix_length(entry.tokens, tokens)
            if shared == n:  # already covered by a kept prompt (equal or longer)
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):  # the new prompt extends a kept one: it replaces it
                self._drop(key)
        size = self.ledger.blocks_for(n) * self.ledger.block_bytes
        if size > self.max_bytes:  # sized before anything is reserved or copied: the bounds hold at every moment
            return
        while self._entries and (self.bytes + size > self.max_bytes or not self.ledger.can_reserve(n)):
            self.evict_one()
        if not self.ledger.can_reserve(n):  # the running requests hold the room: they come first
            return
        entry = PrefixEntry(list(tokens), size)
        self.ledger.reserve(entry, n)
        self.ledger.hold(entry, n)
        self.pool.copy_range(src, self.ledger.offset(entry), n)
        self._entries[self._next] = entry
        self._next += 1
        self.bytes += size

    def evict_one(self) -> bool:
        """Drop the least recently used entry, freeing its range; False when there was none."""
        if not self._entries:
            return False
        self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.ledger.release(entry)
        self.bytes -= entry.nbytes
