"""KV cache for a continuous batch: one row per running request, rows of different lengths.

Layout per layer: `[slots, kv_heads, capacity, head_dim]`. The running requests
occupy rows 0..n-1 with no gaps (a leaving row is refilled by the last row),
so a forward reads a plain view `[:n, :, :kv_len]`, never a copy. Row b holds
`lengths[b]` committed entries at its front; a forward writes row b's tree (root +
drafts + padding up to the batch's width Q) at `[lengths[b], lengths[b] + Q)`.
Entries past a row's length are garbage that the attention mask never shows
and the next forward overwrites: no holes, no per-slot valid mask needed.

A forward may also be ragged (`begin_forward(width, counts)`): row b sends
only its own `counts[b]` tree tokens, all rows' tokens packed into one
sequence, so the linear layers never compute padding. Its keys and values
are scattered to the same places; the slots between a row's last token and
`width` keep whatever they held, which the mask hides as it hides padding.

Memory bound: capacity only grows to what the longest row needs (doubling) and
shrinks back when rows leave, so the cache holds at most
`slots * 4 * (longest running row + width)` entries per layer; that bound is
asserted after every release and tested.
"""

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .kv_cache import KVCache


@dataclass
class ForwardPlan:
    """Where one forward's keys and values go, set by `begin_forward` before the model runs."""

    batch: int  # leading dim of the forward's key states: the running rows, or 1 when ragged
    tokens: int  # their token dim: the tree width, or all rows' packed tokens when ragged
    rows: int  # running rows; attention reads keys[:rows, :, :kv_len]
    kv_len: int
    start: int | None = None  # padded, every row at the same length: one slice write at [start, start + width)
    row_of: torch.Tensor | None = None  # otherwise [rows, width] (padded) or [tokens] (ragged): each entry's row
    pos_of: torch.Tensor | None = None  # same shape: each entry's position in its row

    @property
    def ragged(self) -> bool:
        return self.row_of is not None and self.row_of.dim() == 1


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
        p = self.owner.plan
        assert p is not None and (p.batch, p.tokens) == (key_states.shape[0], key_states.shape[2]), \
            "begin_forward() must describe this forward"
        if p.ragged:  # [1, heads, tokens, dim]: token t belongs to row row_of[t]
            self.keys[p.row_of, :, p.pos_of] = key_states[0].transpose(0, 1)  # [tokens, heads, dim]
            self.values[p.row_of, :, p.pos_of] = value_states[0].transpose(0, 1)
        elif p.start is not None:
            self.keys[: p.rows, :, p.start : p.start + p.tokens] = key_states
            self.values[: p.rows, :, p.start : p.start + p.tokens] = value_states
        else:
            self.keys[p.row_of, :, p.pos_of] = key_states.transpose(1, 2)  # [rows, width, heads, dim]
            self.values[p.row_of, :, p.pos_of] = value_states.transpose(1, 2)
        return self.keys[: p.rows, :, : p.kv_len], self.values[: p.rows, :, : p.kv_len]

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
        self.plan: ForwardPlan | None = None
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
    def begin_forward(self, width: int, counts: list[int] | None = None) -> ForwardPlan:
        """Plan the writes of a forward `width` tokens wide for every running row.

        With `counts` the forward is ragged: row b sends only its first counts[b]
        tree tokens, packed row after row into one sequence.
        """
        n = self.rows
        kv_len = max(self.lengths) + width
        self._ensure_capacity(kv_len)
        dev = self._device()
        if counts is not None:
            assert len(counts) == n and all(1 <= c <= width for c in counts)
            row_of = torch.repeat_interleave(torch.arange(n), torch.tensor(counts))  # [tokens]
            pos_of = torch.cat([torch.arange(l, l + c) for l, c in zip(self.lengths, counts)])  # [tokens]
            self.plan = ForwardPlan(1, sum(counts), n, kv_len, row_of=row_of.to(dev), pos_of=pos_of.to(dev))
        elif all(l == self.lengths[0] for l in self.lengths):
            self.plan = ForwardPlan(n, width, n, kv_len, start=self.lengths[0])
        else:
            pos_of = torch.tensor(self.lengths)[:, None] + torch.arange(width)[None, :]  # [n, width]
            row_of = torch.arange(n)[:, None].expand(n, width)
            self.plan = ForwardPlan(n, width, n, kv_len, row_of=row_of.to(dev), pos_of=pos_of.to(dev))
        return self.plan

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
