"""Attention that reads every row's keys and values in place from the batch cache's pool (CPU).

The batch cache keeps each request's KV in a range of one token-major pool
(`batch_cache.py`). Batched SDPA wants one `[rows, kv_heads, kv_len, dim]`
tensor, which rows at arbitrary offsets are not, so without this the cache
gathers them into a staging buffer every layer: a read and a write of
everything attention then reads again. This kernel takes each row's offset
and length instead, the way a paged-attention kernel takes a block table, and
reads the pool once.

`paged_attention.cpp`: one task per (row, KV head), its query group packed
as the rows of one small matrix; float32 with vectorized blocks, or float64
throughout for exact attention (`attention.exact_sdpa`'s arithmetic: each
query's output is a function of its own keys and mask alone). OpenMP threads
from the process's own runtime: torch's libgomp, already loaded, serves it.

It is compiled on first use with the machine's C++ compiler (about a
second), into a per-user cache keyed by the source's hash, and loaded with
ctypes: no torch headers, no build step at install. Where there is no
compiler, or `LOOKAHEAD_PAGED_ATTENTION=0`, or the layer is not on the CPU,
`kernel()` is None and the cache gathers as before. On CUDA the same role
belongs to a paged kernel (FlashAttention's `block_table`, FlexAttention);
not built here.
"""

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("paged_attention.cpp")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ENV = "LOOKAHEAD_PAGED_ATTENTION"


class _Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "offsets", "kv_lens", "starts", "counts", "mask")]
    _fields_ += [(n, ctypes.c_int64) for n in ("mask_row", "mask_slot", "rows", "heads", "kv_heads", "dim")]
    _fields_ += [("scale", ctypes.c_double)]


@dataclass
class PoolRead:
    """What one forward's attention reads, row by row (all int64 on the CPU).

    Row b's key j is pool slot offsets[b] + j, for j < kv_lens[b]. Its queries are tokens
    starts[b] .. starts[b] + counts[b] - 1 of the forward's queries packed as [tokens, heads, dim],
    and its s-th query sees key j where mask[b, 0, s, j]."""

    offsets: torch.Tensor  # [rows]
    kv_lens: torch.Tensor  # [rows] committed entries + this forward's tokens of the row
    starts: torch.Tensor  # [rows]
    counts: torch.Tensor  # [rows]


class PagedKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.la_paged_attention
        self._fn.argtypes = [ctypes.POINTER(_Args), ctypes.c_int, ctypes.c_int]
        self._fn.restype = ctypes.c_int

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return device.type == "cpu" and dtype in _DTYPES and head_dim % 8 == 0

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, read: PoolRead,
               mask: torch.Tensor, scale: float, wide: bool) -> torch.Tensor:
        """query [tokens, heads, dim]; keys/values [pool_tokens, kv_heads, dim] (the pool); mask bool
        [rows, 1, width, kv_len]. Returns [tokens, heads, dim] in the query's dtype."""
        q = query.contiguous()
        m = mask if mask.stride(-1) == 1 else mask.contiguous()
        out = torch.empty_like(q)
        ptrs = [t.data_ptr() for t in (q, keys, values, out, read.offsets, read.kv_lens, read.starts, read.counts, m)]
        args = _Args(*ptrs, m.stride(0), m.stride(2), read.offsets.shape[0], q.shape[1], keys.shape[1], q.shape[2],
                     float(scale))
        if self._fn(ctypes.byref(args), _DTYPES[q.dtype], int(wide)) != 0:
            raise ValueError(f"paged attention refused its arguments (dim {q.shape[2]}, heads {q.shape[1]}/{keys.shape[1]})")
        return out


@cache
def kernel() -> PagedKernel | None:
    """The compiled kernel, or None where it cannot be had (it is then never asked for again)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        return PagedKernel(ctypes.CDLL(str(_build())))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("paged attention kernel unavailable (%s); the KV pool is gathered for attention instead", e)
        return None


def _build() -> Path:
    """Compile the source into the cache once per source and flags; a finished library is renamed into place, so
    processes building at once (replicas, test workers) never load a half-written one."""
    src = _SOURCE.read_bytes()
    # -march=native: the library suits this CPU only, so its flags are in the key too (a shared home directory)
    digest = hashlib.sha256(src + " ".join(_FLAGS).encode() + _cpu_flags()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lookahead-serve"
    lib = root / f"paged_attention-{digest}.so"
    if lib.exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        built = Path(tmp) / lib.name
        subprocess.run([cxx, *_FLAGS, "-o", str(built), str(_SOURCE)], check=True, capture_output=True, timeout=120)
        os.replace(built, lib)
    return lib


def _cpu_flags() -> bytes:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    return next((line for line in lines if line.startswith(("flags", "Features"))), "").encode()
