"""KV cache for a continuous batch: one row per running request, rows of different lengths.

Layout per layer: `[slots, kv_heads, capacity, head_dim]`. The running requests
occupy rows 0..n-1 with no gaps (a leaving row is refilled by the last row),
so a forward reads a plain view `[:n, :, :kv_len]`, never a copy. Row b holds
`lengths[b]` committed entries at its front; a forward writes row b's tree (root +
drafts + padding up to the batch's width Q) at `[lengths[b], lengths[b] + Q)`.
Entries past a row's length are garbage that the attention mask never shows
and the next forward overwrites: no holes, no per-slot valid mask needed.

Memory bound: capacity only grows to what the longest row needs (doubling) and
shrinks back when rows leave, so the cache holds at most
`slots * 4 * (longest running row + width)` entries per layer; that bound is
asserted after every release and tested.
"""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .kv_cache import KVCache


class _BatchLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: "BatchKVCache") -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        o = self.owner
        _, h, _, d = key_states.shape
        self.keys = key_states.new_zeros((o.slots, h, o.capacity, d))
        self.values = value_states.new_zeros((o.slots, h, o.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def resize(self, capacity: int) -> None:
        keep = min(capacity, self.keys.shape[2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], capacity, old.shape[-1]))
            new[:, :, :keep] = old[:, :, :keep]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.owner.plan
        n, q = key_states.shape[0], key_states.shape[2]
        assert plan is not None and plan[0] == n and plan[1] == q, "begin_forward() must describe this forward"
        _, _, start, rows, pos, kv_len = plan
        if start is not None:  # every row at the same length: one slice write
            self.keys[:n, :, start : start + q] = key_states
            self.values[:n, :, start : start + q] = value_states
        else:
            self.keys[rows, :, pos] = key_states.transpose(1, 2)  # [n, q, heads, dim] at (row, position)
            self.values[rows, :, pos] = value_states.transpose(1, 2)
        return self.keys[:n, :, :kv_len], self.values[:n, :, :kv_len]

    def get_seq_length(self) -> int:
        return max(self.owner.lengths, default=0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class BatchKVCache(Cache):
    def __init__(self, num_layers: int, slots: int, capacity: int = 256) -> None:
        self.slots = slots
        self.capacity = capacity
        self.lengths: list[int] = []  # committed entries of running rows 0..n-1
        self.plan = None
        super().__init__(layers=[_BatchLayer(self) for _ in range(num_layers)])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _layers(self):
        return [l for l in self.layers if l.is_initialized]

    def _ensure_capacity(self, needed: int) -> None:
        if needed > self.capacity:
            self.capacity = max(needed, 2 * self.capacity)
            for layer in self._layers():
                layer.resize(self.capacity)

    # ---- forwards --------------------------------------------------------
    def begin_forward(self, width: int) -> int:
        """Prepare the writes of a forward `width` rows wide for every running row; return kv_len."""
        n = self.rows
        kv_len = max(self.lengths) + width
        self._ensure_capacity(kv_len)
        if all(l == self.lengths[0] for l in self.lengths):
            self.plan = (n, width, self.lengths[0], None, None, kv_len)
        else:
            base = torch.tensor(self.lengths)[:, None]
            pos = base + torch.arange(width)[None, :]  # [n, width]
            rows = torch.arange(n)[:, None].expand(n, width)
            dev = self._device()
            self.plan = (n, width, None, rows.to(dev), pos.to(dev), kv_len)
        return kv_len

    @torch.inference_mode()
    def commit(self, keeps: list[list[int]]) -> None:
        """After a forward: row b keeps its tree rows keeps[b] (root first) as context."""
        assert len(keeps) == self.rows
        movers = [(b, k) for b, k in enumerate(keeps) if k != list(range(len(k)))]
        if movers:
            width = max(len(k) for _, k in movers)
            rows = torch.tensor([[b] * width for b, _ in movers])
            src = torch.tensor([[self.lengths[b] + r for r in (k + [k[-1]] * (width - len(k)))] for b, k in movers])
            dst = torch.tensor([[self.lengths[b] + min(i, len(k) - 1) for i in range(width)] for b, k in movers])
            dev = self._device()
            rows, src, dst = rows.to(dev), src.to(dev), dst.to(dev)
            for layer in self._layers():
                for t in (layer.keys, layer.values):
                    t[rows, :, dst] = t[rows, :, src]  # the gather reads before the scatter writes
        self.lengths = [l + len(k) for l, k in zip(self.lengths, keeps)]
        self.plan = None

    # ---- joining and leaving ---------------------------------------------
    @torch.inference_mode()
    def admit(self, single: KVCache, headroom: int) -> int:
        """Copy a prefilled single-request cache into a new last row; return its row."""
        assert self.rows < self.slots, "no free slot"
        n, length = self.rows, single.length
        self._ensure_capacity(length + headroom)
        for mine, theirs in zip(self.layers, single.layers):
            if not theirs.is_initialized:
                continue
            if not mine.is_initialized:
                mine.lazy_initialization(theirs.keys[:, :, :1], theirs.values[:, :, :1])
            mine.keys[n, :, :length] = theirs.keys[0, :, :length]
            mine.values[n, :, :length] = theirs.values[0, :, :length]
        self.lengths.append(length)
        return n

    @torch.inference_mode()
    def release(self, row: int, headroom: int) -> int | None:
        """Free `row`; the last row moves into it. Return the row that moved (now at `row`), or None."""
        last = self.rows - 1
        moved = None
        if row != last:
            length = self.lengths[last]
            for layer in self._layers():
                layer.keys[row, :, :length] = layer.keys[last, :, :length]
                layer.values[row, :, :length] = layer.values[last, :, :length]
            self.lengths[row] = length
            moved = last
        self.lengths.pop()
        self._shrink(headroom)
        return moved

    def _shrink(self, headroom: int) -> None:
        need = max(self.lengths, default=0) + headroom
        if self.capacity > 4 * need and self.capacity > 256:
            self.capacity = max(256, 2 * need)
            for layer in self._layers():
                layer.resize(self.capacity)
        assert self.capacity <= max(256, 4 * need)

    def _device(self):
        layers = self._layers()
        return layers[0].keys.device if layers else torch.device("cpu")

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for l in self._layers() for t in (l.keys, l.values))
