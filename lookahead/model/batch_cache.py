"""KV cache for a continuous batch: every request's keys and values in a range of one pool.

Layout per layer: keys and values `[pool_tokens, kv_heads, head_dim]`
(token-major), on that layer's own device, allocated once at the size the
KV budget allows (`kv_memory.KVLedger`). A request's range is reserved when
it is admitted, for its worst case (prompt + max_new_tokens + the tree
headroom, in whole blocks), so the batch holds the sum of its rows' ranges,
never rows x the longest, and an admitted request can always finish. Its
prompt is prefilled straight into that range (`row_cache`) and it joins the
batch with no copy (`attach`); it leaves with no copy either (`release`).
On CPU the pool's pages are only backed once written, so resident memory
follows the tokens actually held.

A forward writes row b's tree (root + drafts, or padding up to the batch's
width Q) at its positions `[lengths[b], lengths[b] + Q)`. A ragged forward
(`begin_forward(width, counts)`) sends only each row's own `counts[b]`
tokens, packed into one sequence; its keys and values go to the same places.

Attention reads every row's entries at positions 0..kv_len-1, as the batch's
4D mask is laid out. One row: a view of its range, no copy. Several rows on
the CPU: the pool itself, read in place by `paged_attention` from each row's
offset and length (`ForwardPlan.read`). Several rows elsewhere (or with no
compiler for that kernel): their ranges are gathered into a staging buffer
per device as `[rows, kv_heads, kv_len, head_dim]` (`index_select`, one copy
of what attention reads next; the buffer is reused by every layer, so it
costs one layer's worth of rows x kv_len, not the batch's). Positions past
what a row has written point at its last written entry: masked, and always
finite values.

The rows' bookkeeping mirrors the scheduler's: rows 0..n-1 are the running
requests, and a leaving row is refilled by the last one.
"""

import ctypes
import ctypes.util
import sys
import weakref
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from lookahead.model.kv_cache import KVCache
from lookahead.model.kv_memory import SPARE_SLOTS, KVLedger
from lookahead.model.paged_attention import PagedKernel, PoolRead, kernel


@dataclass
class ForwardPlan:
    """Where one forward's keys and values go and what attention reads, set by `begin_forward`."""

    batch: int  # leading dim of the forward's key states: the running rows, or 1 when ragged
    tokens: int  # their token dim: the tree width, or all rows' packed tokens when ragged
    rows: int  # running rows
    kv_len: int  # attention reads positions 0..kv_len-1 of every row
    ragged: bool
    dst: torch.Tensor  # [batch * tokens] pool slot of each key-state entry, in [batch, tokens] order
    src: torch.Tensor | None  # [rows * kv_len] pool slot gathered for each (row, position); None: a view, or `read`
    first: int  # one row: where its range starts
    read: PoolRead | None = None  # several rows read in place (paged_attention): update() returns the pool itself
    kernel: PagedKernel | None = None  # what reads it (with `read`)
    _on: dict = field(default_factory=dict)  # device -> (dst, src) there (layers may sit on several devices)

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        got = self._on.get(device)
        if got is None:
            got = self._on[device] = (self.dst.to(device), None if self.src is None else self.src.to(device))
        return got


class _PoolLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: "BatchKVCache", keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = weakref.proxy(owner)  # no cycle: the cache goes (and its pool to the spare) when dropped
        self.keys, self.values = keys, values  # [pool_tokens, kv_heads, head_dim]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # allocated with the pool

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        p = self.owner.plan
        assert p is not None and (p.batch, p.tokens) == (key_states.shape[0], key_states.shape[2]), \
            "begin_forward() must describe this forward"
        dst, src = p.on(self.keys.device)
        for pool, new in ((self.keys, key_states), (self.values, value_states)):
            pool.index_copy_(0, dst, new.transpose(1, 2).flatten(0, 1))  # [batch * tokens, heads, dim]
        if p.read is not None:
            return self.keys, self.values  # [pool_tokens, heads, dim]: attention reads it at p.read's offsets
        return self.owner.read_rows(self.keys, self.values, p)

    def get_seq_length(self) -> int:
        return max(self.owner.lengths, default=0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


_HUGE = 2 << 20  # bytes of a transparent huge page on x86-64 and arm64 Linux
_MADV_HUGEPAGE = 14


def _huge_pages(t: torch.Tensor) -> None:
    """Ask Linux to back a CPU pool tensor with transparent huge pages (where THP is in `madvise` mode): its pages
    are first written one row's token at a time, and each first write of a 4 KiB page is a fault; a 2 MiB page
    takes one fault for 512 of them (measured with benchmarks/kv_pool_step.py: docs/benchmarks.md).
    Elsewhere, or if refused, nothing changes."""
    if t.device.type != "cpu" or not sys.platform.startswith("linux"):
        return
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    first, last = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
    if last <= first:
        return
    try:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


# One spare pool per layout: the tensors of the last pool no cache holds any more, taken by the next cache of that
# layout that fits in it. A process that builds engines one after another (a benchmark's levels, tests) then writes
# into memory it has already touched, as a long-running replica does; the first write to a fresh page is a fault,
# and on this project's VM first touches run at 0.5-4 GB/s against ~25 GB/s for memory touched before
# (benchmarks/kv_pool_step.py measured the faults). At most one spare per layout is kept.
_SPARE: dict["PoolLayout", list[tuple[torch.Tensor, torch.Tensor]]] = {}


def _pool_tensors(owner: object, layout: "PoolLayout", tokens: int) -> tuple[list, weakref.finalize]:
    """Per layer (keys, values), each [>= tokens, kv_heads, head_dim]: the spare pool when it is big enough, else
    new ones; and the finalizer that makes them the layout's spare, run when `owner` is collected or closed."""
    spare = _SPARE.get(layout)
    if spare is not None and spare[0][0].shape[0] >= tokens:
        whole = _SPARE.pop(layout)
    else:
        _drop_spares(layout)
        shape = (tokens, layout.kv_heads, layout.head_dim)
        whole = [(torch.empty(shape, dtype=layout.dtype, device=d), torch.empty(shape, dtype=layout.dtype, device=d))
                 for d in layout.devices]
        for pair in whole:
            for t in pair:
                _huge_pages(t)
    give_back = weakref.finalize(owner, _SPARE.__setitem__, layout, whole)
    return whole, give_back


def _drop_spares(layout: "PoolLayout") -> None:
    """Before a new pool is made: free the spares it will not reuse, where the KV budget counted them as free
    (its own layout's, too small; on accelerators, other layouts' on its devices)."""
    accel = {d for d in layout.devices if d.type != "cpu"}
    for other in list(_SPARE):
        if other == layout or accel & set(other.devices):
            del _SPARE[other]


def _bytes_on(device: torch.device, pools) -> int:
    return sum(t.numel() * t.element_size() for whole in pools for pair in whole for t in pair if t.device == device)


def spare_bytes(device: torch.device) -> int:
    """Bytes on `device` of the spare pools no cache holds: free to the KV budget (see _drop_spares)."""
    return _bytes_on(device, _SPARE.values())


def live_pool_bytes(device: torch.device) -> int:
    """Bytes on `device` of the pools open caches hold."""
    return _bytes_on(device, [c._whole for c in list(_LIVE) if not c.closed])


_LIVE: "weakref.WeakSet[BatchKVCache]" = weakref.WeakSet()


@dataclass(frozen=True)
class PoolLayout:
    """What one layer's pool holds per token, and where: from the model (runner.pool_layout)."""

    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    devices: tuple[torch.device, ...]  # [layers] each layer's device
    in_place: bool = False  # the model's attention takes the pool itself (runner: attention.install hooked it)


class BatchKVCache(Cache):
    def __init__(self, layout: PoolLayout, ledger: KVLedger, staging_entries: int | None = None) -> None:
        """`staging_entries`: the most positions a gathered read can need (rows x the longest context); the read
        staging grows by doubling up to that and no further, so it never holds more than the KV budget's
        activation probe measured (runner.activation_peak)."""
        self.ledger = ledger
        self.staging_entries = staging_entries
        self.pool_tokens = ledger.token_capacity
        # one slot past the ledger's tokens: the trash slot (`trash`), no row's
        self._whole, self._give_back = _pool_tensors(self, layout, self.pool_tokens + SPARE_SLOTS)
        layers = [_PoolLayer(self, k[: self.pool_tokens], v[: self.pool_tokens]) for k, v in self._whole]
        _LIVE.add(self)
        self.keys_of: list[object] = []  # [rows] each row's ledger key
        self.offsets: list[int] = []  # [rows] where each row's range starts in the pool
        self.lengths: list[int] = []  # [rows] committed entries of running rows 0..n-1
        self._owned: set = set()  # keys this cache reserved itself (`admit`), released when their row leaves
        self._staging: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.plan: ForwardPlan | None = None
        self.paged: PagedKernel | None = None  # several rows read the pool in place with this (else: gathered)
        self.captured: dict = {}  # static_step.py's graphs over this pool (they hold its addresses), dropped on close
        if layout.in_place and all(PagedKernel.supports(d, layout.dtype, layout.head_dim) for d in layout.devices):
            self.paged = kernel()
        super().__init__(layers=layers)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def closed(self) -> bool:
        return not self._give_back.alive

    def close(self) -> None:
        """Hand the pool to the layout's spare now, not when the cache is collected (a caller, a traceback or a
        reference cycle may keep it alive): the next cache of this layout takes it. The cache is unusable after."""
        if self.closed:
            return
        for layer in self.layers:
            layer.keys = layer.values = None
        self._whole = []
        self._staging.clear()
        self.captured.clear()
        self.keys_of, self.offsets, self.lengths = [], [], []
        self._give_back()

    def staging(self, like: torch.Tensor, entries: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value read buffers of at least `entries` positions on `like`'s device, reused by every layer."""
        got = self._staging.get(like.device)
        if got is None or got[0].shape[0] < entries:
            size = max(entries, 2 * got[0].shape[0]) if got is not None else entries
            if self.staging_entries is not None:
                size = max(entries, min(size, self.staging_entries))
            got = tuple(like.new_empty((size, *like.shape[1:])) for _ in range(2))
            self._staging[like.device] = got
        return got[0][:entries], got[1][:entries]

    def read_rows(self, keys: torch.Tensor, values: torch.Tensor, plan: ForwardPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """What attention reads of one layer's pool `keys`/`values` where it is not read in place: one row's range
        as a view, several rows gathered into the read staging; [rows, kv_heads, kv_len, dim] each."""
        _, src = plan.on(keys.device)
        if src is None:
            view = lambda t: t[plan.first : plan.first + plan.kv_len].transpose(0, 1)[None]  # noqa: E731
            return view(keys), view(values)
        k, v = self.staging(keys, plan.rows * plan.kv_len)
        torch.index_select(keys, 0, src, out=k)
        torch.index_select(values, 0, src, out=v)
        shape = (plan.rows, plan.kv_len, *keys.shape[1:])
        return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)

    # ---- forwards --------------------------------------------------------
    @property
    def trash(self) -> int:
        """A pool slot no row owns (the last): a padded static step writes its padding tokens' keys and values
        there, and points its padding rows' reads at it (static_step.py)."""
        return self.pool_tokens

    def whole_pools(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) [pool_tokens + 1, kv_heads, head_dim]: the pool with its trash slot."""
        return [(k[: self.pool_tokens + SPARE_SLOTS], v[: self.pool_tokens + SPARE_SLOTS]) for k, v in self._whole]

    def begin_static(self, width: int) -> None:
        """The bookkeeping of a padded forward `width` tokens wide whose writes and reads a static step computes
        on the device itself (static_step.py): every row holds its tree's slots until `commit`."""
        assert self.rows >= 1
        self.plan = None
        for key, l in zip(self.keys_of, self.lengths):
            self.ledger.hold(key, l + width)

    def begin_forward(self, width: int, counts: list[int] | None = None, read_in_place: bool = False) -> ForwardPlan:
        """Plan the writes and reads of a forward `width` tokens wide for every running row.

        With `counts` the forward is ragged: row b sends only its first counts[b]
        tree tokens, packed row after row into one sequence. `read_in_place`: one row is read in place by the
        paged kernel too, not as a view (the decoder step's attention takes the kernel whenever it can).
        """
        n = self.rows
        sent = counts if counts is not None else [width] * n
        assert len(sent) == n and all(1 <= c <= width for c in sent)
        kv_len = max(self.lengths) + width
        starts = [o + l for o, l in zip(self.offsets, self.lengths)]  # [rows] first pool slot this forward writes
        dst = torch.cat([torch.arange(s, s + c) for s, c in zip(starts, sent)])  # [batch * tokens]
        src = read = None
        if (n > 1 or read_in_place) and self.paged is not None:
            starts = [0, *accumulate(sent[:-1])] if counts is not None else range(0, n * width, width)
            token = self.layers[0].keys.stride(0)  # elements per pool slot
            read = PoolRead(torch.tensor(self.offsets) * token,
                            torch.tensor([l + c for l, c in zip(self.lengths, sent)]), torch.tensor(starts),
                            torch.tensor(sent))
        elif n > 1:
            pos = torch.arange(kv_len)[None, :]  # [1, kv_len]
            last = torch.tensor([l + c - 1 for l, c in zip(self.lengths, sent)])[:, None]  # [rows, 1]
            src = (torch.tensor(self.offsets)[:, None] + torch.minimum(pos, last)).flatten()  # [rows * kv_len]
        batch, tokens = (1, sum(sent)) if counts is not None else (n, width)
        self.plan = ForwardPlan(batch, tokens, n, kv_len, counts is not None, dst, src, self.offsets[0], read,
                                self.paged if read is not None else None)
        for key, l, c in zip(self.keys_of, self.lengths, sent):
            self.ledger.hold(key, l + c)
        return self.plan

    @torch.inference_mode()
    def commit(self, keeps: list[list[int]]) -> None:
        """After a forward: row b keeps its tree rows keeps[b] (root first) as context."""
        assert len(keeps) == self.rows
        src, dst = [], []
        for off, l, k in zip(self.offsets, self.lengths, keeps):
            if k != list(range(len(k))):
                src += [off + l + r for r in k]
                dst += [off + l + i for i in range(len(k))]
        if dst:
            self._move(torch.tensor(src), torch.tensor(dst))
        self.lengths = [l + len(k) for l, k in zip(self.lengths, keeps)]
        for key, l in zip(self.keys_of, self.lengths):
            self.ledger.hold(key, l)
        self.plan = None

    def _move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Pool slots src -> dst in every layer (the gather reads before the scatter writes)."""
        on = {}
        for layer in self.layers:
            dev = layer.keys.device
            if dev not in on:
                on[dev] = (src.to(dev), dst.to(dev))
            s, d = on[dev]
            for t in (layer.keys, layer.values):
                t.index_copy_(0, d, t.index_select(0, s))

    @torch.inference_mode()
    def copy_range(self, src: int, dst: int, n: int) -> None:
        """Pool slots [src, src + n) -> [dst, dst + n) in every layer (ranges that do not overlap)."""
        for layer in self.layers:
            for t in (layer.keys, layer.values):
                t[dst : dst + n] = t[src : src + n]

    # ---- joining and leaving ---------------------------------------------
    def row_cache(self, key: object) -> KVCache:
        """A single-request cache over `key`'s reserved range: prefill writes the request's prompt in place."""
        off, size = self.ledger.offset(key), self.ledger.reserved_tokens(key)
        view = lambda t: t[off : off + size].transpose(0, 1)[None]  # noqa: E731 - [1, heads, size, dim]
        return KVCache.over([(view(l.keys), view(l.values)) for l in self.layers])

    def attach(self, key: object, length: int) -> int:
        """The request whose range is `key`'s reservation joins as a new last row, `length` entries committed."""
        self.keys_of.append(key)
        self.offsets.append(self.ledger.offset(key))
        self.lengths.append(length)
        self.ledger.hold(key, length)
        return self.rows - 1

    @torch.inference_mode()
    def admit(self, single: KVCache, headroom: int) -> int:
        """Reserve a range for a prefilled single-request cache, copy it in as a new last row; return its row.
        (The engine prefills into its rows' ranges instead: `row_cache`.)"""
        key = object()
        self.ledger.reserve(key, single.length + headroom)
        self._owned.add(key)
        mine = self.row_cache(key)
        for dst, theirs in zip(mine.layers, single.layers):
            if theirs.is_initialized:
                dst.keys[0, :, : single.length] = theirs.keys[0, :, : single.length]
                dst.values[0, :, : single.length] = theirs.values[0, :, : single.length]
        return self.attach(key, single.length)

    def release(self, row: int) -> int | None:
        """Free `row`; the last row moves into its place (bookkeeping only: no KV moves). Return the row that
        moved (now at `row`), or None."""
        key = self.keys_of[row]
        last = self.rows - 1
        for seq in (self.keys_of, self.offsets, self.lengths):
            seq[row] = seq[last]
            seq.pop()
        if key in self._owned:
            self._owned.discard(key)
            self.ledger.release(key)
        return last if row != last else None
