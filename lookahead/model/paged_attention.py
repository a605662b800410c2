"""Attention that reads every row's keys and values in place from the batch cache's pool (CPU).

The batch cache keeps each request's KV in a range of one token-major pool
(`batch_cache.py`). Batched SDPA wants one `[rows, kv_heads, kv_len, dim]`
tensor, which rows at arbitrary offsets are not, so without this the cache
gathers them into a staging buffer every layer: a read and a write of
everything attention then reads again. This kernel takes each row's offset
and length instead, the way a paged-attention kernel takes a block table, and
reads the pool once.

`paged_attention.cpp`: a task is a row's KV heads (all of them when there
are rows enough for every thread, one each when few), each head's query
group packed as the rows of one small matrix; float32, vectorized. Each
query's output is a function of its own visible keys alone (fixed-order dot
products, normaliser and weighted sum; a masked key adds an exact zero), so
it is also the CPU's exact attention: a token gets the same bits alone, in a
tree, or in a batch (`attention.py`). It reads any
`[rows, kv_heads, len, dim]` view as well (`view_read`), which is how exact
forwards over a single row or a `KVCache` take it too.

Built and loaded by `native.py` (on first use, about a second). Where it
cannot be (no compiler, `LOOKAHEAD_NATIVE=0`), or the layer is not on the
CPU, the cache gathers as before. On CUDA the same role belongs to a paged
kernel (FlashAttention's `block_table`, FlexAttention); not built here.
"""

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from lookahead.model import native

_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class _Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "bases", "kv_lens", "starts", "counts", "mask")]
    _fields_ += [(n, ctypes.c_int64) for n in ("mask_row", "mask_slot", "rows", "heads", "kv_heads", "dim")]
    _fields_ += [("scale", ctypes.c_double), ("tok_stride", ctypes.c_int64), ("head_stride", ctypes.c_int64)]


@dataclass
class PoolRead:
    """What one forward's attention reads, row by row (all int64 on the CPU).

    Row b's key j of KV head h is element bases[b] + j * tok_stride + h * head_stride of the keys (and of the
    values, laid out alike), for j < kv_lens[b]. Its queries are tokens
    starts[b] .. starts[b] + counts[b] - 1 of the forward's queries packed as [tokens, heads, dim],
    and its s-th query sees key j where mask[b, 0, s, j]."""

    bases: torch.Tensor  # [rows]
    kv_lens: torch.Tensor  # [rows] committed entries + this forward's tokens of the row
    starts: torch.Tensor  # [rows]
    counts: torch.Tensor  # [rows]


class PagedKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.la_paged_attention
        self._fn.argtypes = [ctypes.POINTER(_Args), ctypes.c_int]
        self._fn.restype = ctypes.c_int

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return device.type == "cpu" and dtype in _DTYPES and head_dim % 8 == 0

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, read: PoolRead,
               mask: torch.Tensor, scale: float) -> torch.Tensor:
        """query [tokens, heads, dim]; keys/values: the pool [pool_tokens, kv_heads, dim], or a view
        [rows, kv_heads, len, dim]; mask bool [rows, 1, width, kv_len]. Returns [tokens, heads, dim] in the
        query's dtype."""
        assert keys.stride() == values.stride() and keys.dtype == values.dtype == query.dtype and keys.stride(-1) == 1
        assert mask.dtype == torch.bool and all(t.dtype == torch.int64 for t in (read.bases, read.kv_lens, read.starts,
                                                                                  read.counts))
        tok_stride = keys.stride(0) if keys.dim() == 3 else keys.stride(2)  # KV heads: dim 1 either way
        q = query.contiguous()
        m = mask if mask.stride(-1) == 1 else mask.contiguous()
        out = torch.empty_like(q)
        ptrs = [t.data_ptr() for t in (q, keys, values, out, read.bases, read.kv_lens, read.starts, read.counts, m)]
        args = _Args(*ptrs, m.stride(0), m.stride(2), read.bases.shape[0], q.shape[1], keys.shape[1], q.shape[2],
                     float(scale), tok_stride, keys.stride(1))
        if self._fn(ctypes.byref(args), _DTYPES[q.dtype]) != 0:
            raise ValueError(f"paged attention refused its arguments (dim {q.shape[2]}, heads {q.shape[1]}/{keys.shape[1]})")
        return out


def view_read(keys: torch.Tensor, starts: list[int], counts: list[int]) -> PoolRead:
    """Rows of a [rows, kv_heads, len, dim] view: row b reads all `len` keys (its mask hides what is not its own)."""
    rows, length = keys.shape[0], keys.shape[2]
    return PoolRead(torch.arange(rows) * keys.stride(0), torch.full((rows,), length), torch.tensor(starts),
                    torch.tensor(counts))


@cache
def kernel() -> PagedKernel | None:
    """The compiled kernel, or None where it cannot be had."""
    lib = native.load("paged_attention")
    return PagedKernel(lib) if lib is not None else None
