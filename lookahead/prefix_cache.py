"""Prompt KV reused across requests that share a prefix.

Several questions about one document, or one long system prompt in front of
every chat, make requests whose prompts start alike. Their prefill is the
same computation: keys and values at positions 0..n-1 depend only on tokens
0..n-1. The engine keeps the prompt KV of recent requests here and, when a
new prompt starts with at least `min_tokens` of a kept prompt, copies those
entries into the new request's cache and prefills only the rest.

Bounded by bytes, least recently used first out. A prompt that extends a kept
one replaces it (it covers everything the shorter one could serve).

What it changes: time to first token and prefill compute, for lookahead on
and off alike (the reuse happens before decoding starts). The reused KV was
computed in different prefill chunks than a fresh prefill would use, which
differs only in float rounding order, like chunked prefill itself; the
losslessness tests run with it on.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from .kv_cache import KVCache

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


@dataclass
class PrefixEntry:
    tokens: list[int]  # the prompt tokens whose KV is held, in order
    keys: list[torch.Tensor]  # per layer [kv_heads, len(tokens), head_dim]
    values: list[torch.Tensor]  # per layer [kv_heads, len(tokens), head_dim]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PrefixCache:
    def __init__(self, max_bytes: int, min_tokens: int = 32) -> None:
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
        self._entries.clear()
        self.bytes = 0

    def _longest(self, tokens: list[int]) -> tuple[int | None, int]:
        best, best_n = None, 0
        for key, entry in self._entries.items():
            n = common_prefix_length(entry.tokens, tokens)
            if n > best_n:
                best, best_n = key, n
        return best, best_n

    @torch.inference_mode()
    def load_into(self, cache: KVCache, tokens: list[int]) -> int:
        """Copy the longest kept prefix of `tokens` into the empty `cache`; return how many tokens it covers."""
        if not self.enabled or cache.length:
            return 0
        key, n = self._longest(tokens)
        if key is None or n < self.min_tokens:
            return 0
        entry = self._entries[key]
        self._entries.move_to_end(key)
        for layer, k, v in zip(cache.layers, entry.keys, entry.values):
            if not layer.is_initialized:
                layer.lazy_initialization(k[None, :, :1], v[None, :, :1])
            layer.keys[0, :, :n] = k[:, :n]
            layer.values[0, :, :n] = v[:, :n]
        cache.length = n
        self.hits += 1
        self.reused_tokens += n
        return n

    @torch.inference_mode()
    def store(self, cache: KVCache, tokens: list[int]) -> None:
        """Keep the KV of `tokens` (the first len(tokens) entries of `cache`) for later prompts."""
        n = len(tokens)
        if not self.enabled or n < self.min_tokens or cache.length < n:
            return
        for key, entry in list(self._entries.items()):
            shared = common_prefix_length(entry.tokens, tokens)
            if shared == n:  # already covered by a kept prompt (equal or longer)
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):  # the new prompt extends a kept one: it replaces it
                self._drop(key)
        layers = [l for l in cache.layers if l.is_initialized]
        size = sum((l.keys[0, :, :n].numel() + l.values[0, :, :n].numel()) * l.keys.element_size() for l in layers)
        if size > self.max_bytes:  # sized before anything is copied: the bound holds at every moment
            return
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        entry = PrefixEntry(list(tokens), [l.keys[0, :, :n].clone() for l in layers],
                            [l.values[0, :, :n].clone() for l in layers])
        self._entries[self._next] = entry
        self._next += 1
        self.bytes += entry.nbytes

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes
