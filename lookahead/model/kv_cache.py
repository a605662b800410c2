"""A preallocated KV cache that keeps only accepted tree entries.

A verification forward appends the keys/values of every tree row (root +
drafts) after the committed prefix. Afterwards only the root and the accepted
path are real context: `commit` keeps those and forgets the rest. When the
accepted rows are the first rows in order (always true for `one` mode and for a
fully accepted chain) that is just a length change (a crop); otherwise the
accepted rows are gathered into place.

Buffers are allocated once per request at the needed capacity, so a step
writes its rows in place instead of concatenating the whole cache (what HF's
DynamicCache does, at a cost that grows with context length).
"""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _SlotLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: "KVCache") -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        cap = self.owner.capacity
        self.keys = key_states.new_zeros((b, h, cap, d))  # [batch, kv_heads, capacity, head_dim]
        self.values = value_states.new_zeros((b, h, cap, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.owner.length
        end = start + key_states.shape[-2]
        if end > self.keys.shape[-2]:
            self._grow(end)
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _grow(self, needed: int) -> None:
        if self.owner.fixed:
            raise RuntimeError(f"a request's KV outgrew its reserved range ({self.keys.shape[-2]} entries)")
        cap = max(needed, 2 * self.keys.shape[-2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], cap, old.shape[-1]))
            new[:, :, : old.shape[-2]] = old
            setattr(self, name, new)
        self.owner.capacity = max(self.owner.capacity, cap)

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


class KVCache(Cache):
    def __init__(self, num_layers: int, capacity: int) -> None:
        self.length = 0  # committed entries
        self.capacity = capacity
        self.fixed = False  # over a pool's range (`over`): it cannot grow
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])

    @classmethod
    def over(cls, views: list[tuple[torch.Tensor, torch.Tensor]]) -> "KVCache":
        """A cache over given per-layer (keys, values), each [1, kv_heads, capacity, head_dim]: a request's
        range of the engine's pool (`BatchKVCache.row_cache`). It writes in place and never grows."""
        cache = cls(len(views), views[0][0].shape[2])
        for layer, (k, v) in zip(cache.layers, views):
            layer.keys, layer.values, layer.is_initialized = k, v, True
        cache.fixed = True
        return cache

    @torch.inference_mode()
    def commit(self, base: int, keep_rows: list[int]) -> None:
        """After a forward written at `base`, keep the given rows (row 0 = root) as context."""
        n = len(keep_rows)
        if keep_rows != list(range(n)):
            idx = torch.tensor(keep_rows, device=self.layers[0].keys.device) + base
            for layer in self.layers:
                if layer.is_initialized:
                    layer.keys[:, :, base : base + n] = layer.keys.index_select(2, idx)
                    layer.values[:, :, base : base + n] = layer.values.index_select(2, idx)
        self.length = base + n
