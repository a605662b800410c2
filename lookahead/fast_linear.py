"""Cheaper matmuls for the runner's CPU forwards.

Measured on the 2-core EPYC (AVX-512, MKL + oneDNN) with fp32 SmolLM2-135M,
cold weights streamed from DRAM as in a real forward (30 layers' q/k/v/o and
MLP weights, without the lm_head):

| rows          | 1  | 2  | 4  | 8  | 16 | 32 | 700 |
|---------------|----|----|----|----|----|----|-----|
| `F.linear`    | 35 | 52 | 47 | 50 | 50 | -  | 883 |
| `W @ x.T`     | 15 | 14 | 21 | 33 | 41 | 59 | -   |
| oneDNN packed | 20 | 23 | 16 | 21 | 27 | 44 | 774 |

(ms per forward's worth of matmuls.) `F.linear` with a few rows takes MKL's
matrix-vector path, which uses the memory bandwidth badly; `W @ x.T` (one row
duplicated when alone) streams each weight once and is the fastest for one
or two rows; beyond that a weight pre-packed once into oneDNN's blocked
layout (`mkldnn._reorder_linear_weight`, what Inductor's freezing pass uses)
keeps the per-token cost low: a 16-token tree verifies at under 2x the
matmul cost of a single token, against ~3x with `W @ x.T`. That flat curve is
what lets a draft tree pay for itself on a CPU.

Packing copies every linear weight once (for SmolLM2-135M fp32, ~540 MB), so
it is done only for fp32 weights that fit comfortably in free memory;
otherwise the `W @ x.T` / `F.linear` paths remain. Results differ from
`F.linear` only in float rounding order, as any batched verification forward
does; the losslessness tests cover it.

Used as a context manager around the runner's own forwards, so plain
`model.generate` (the baseline) keeps the stock path.

Exact linears (half-precision models on CPU; the runner's `exact`). oneDNN's
bf16 GEMM accumulates in fp32 in an order that depends on the row count, so
now and then a row's bf16 output differs by one step between a one-token
forward and a tree. Where the native kernel builds (`exact_linear.py`), it
multiplies the half-precision weight as it is, each output summed in one
fixed order. Otherwise `_exact_linear` keeps a float64 copy of each weight
and multiplies in float64: a product of two bf16 (or fp16) numbers is exact
there, and their sum is exact too while the products span less than about
2^37, so whatever order the GEMM adds them in for a given row count, the
float64 result, and so its bf16 rounding, is the same; beyond that span the
orders differ at 2^-53 of the largest product, far below a bf16 step.
(An fp32 copy summed in blocks of 128 held on an AMD EPYC and split at 17
rows on an Intel Xeon, whose oneDNN picks another kernel: a reduction order
is a property of the machine, so the fallback does not rely on one.) It
costs four times the half-precision weight in memory and a float64 GEMM.
Checked bitwise for 1 to 40 rows in `tests/lookahead/test_exact.py`.
"""

import logging
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from . import exact_linear
from .kv_memory import host_available_bytes

log = logging.getLogger(__name__)

ROWS_VIA_WX = 2  # up to this many rows W @ x.T wins; above it the packed weight (or F.linear) does
PACK_HINT = 16  # oneDNN's expected row count; measured insensitive between 2 and 32
PACK_DTYPES = (torch.float32,)  # bf16 packing needs AVX512-BF16 to pay; not measured
PACK_MEMORY_SHARE = 0.5  # pack only if the copies take at most this share of available memory


def _packed_supported() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018 - resolving the op is the check
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def _fast_linear(x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
    w, bias = mod.weight, mod.bias
    flat = x.reshape(-1, x.shape[-1]).contiguous()  # [rows, in]
    rows = flat.shape[0]
    packed = getattr(mod, "_lookahead_packed", None)
    if rows == 1:
        y = (w @ torch.cat((flat, flat)).t()).t()[:1]
    elif rows <= ROWS_VIA_WX or packed is None and rows <= 16:
        y = (w @ flat.t()).t()
    elif packed is not None:
        return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "").reshape(*x.shape[:-1], w.shape[0])
    else:
        y = F.linear(flat, w)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], w.shape[0])


def exact_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] half-precision weight -> [in, out] float64: what the fallback `_exact_linear` multiplies."""
    return weight.detach().double().t().contiguous()


def _exact_linear(x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
    weight = mod._lookahead_exact  # [in, out] float64, or None: the native kernel
    if weight is None:
        return exact_linear.kernel()(x, mod.weight, mod._lookahead_bias)
    y = x.reshape(-1, x.shape[-1]).double() @ weight  # [rows, out], exact sums (see the module docstring)
    if mod.bias is not None:
        y = y + mod.bias.double()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[1])


class FastLinears:
    """Installs the fast path on every nn.Linear of a model, active only inside `active()`; with `exact`, the
    exact path instead (half-precision weights on CPU)."""

    def __init__(self, model: torch.nn.Module, enabled: bool, pack: bool | None = None, exact: bool = False) -> None:
        self.on = False
        self.packed = False
        self.exact = exact
        linears = [mod for mod in model.modules() if type(mod) is torch.nn.Linear]
        if exact:
            native = exact_linear.kernel()
            for mod in linears:
                if native is not None and native.supports(mod.weight):
                    mod._lookahead_exact = None
                    mod._lookahead_bias = None if mod.bias is None else mod.bias.detach().float().contiguous()
                else:
                    mod._lookahead_exact = exact_weight(mod.weight)
                mod.forward = types.MethodType(self._make_forward(), mod)
            return
        if not enabled:
            return
        if pack is None:
            pack = self._should_pack(linears)
        if pack:
            for mod in linears:
                mod._lookahead_packed = torch.ops.mkldnn._reorder_linear_weight(mod.weight.detach(), PACK_HINT)
            self.packed = True
        for mod in linears:
            mod.forward = types.MethodType(self._make_forward(), mod)

    @staticmethod
    def _should_pack(linears: list[torch.nn.Linear]) -> bool:
        if not linears or not _packed_supported():
            return False
        if any(m.weight.device.type != "cpu" or m.weight.dtype not in PACK_DTYPES for m in linears):
            return False
        need = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        if need > PACK_MEMORY_SHARE * host_available_bytes():
            log.info("not packing linear weights for oneDNN: %.0f MB would exceed half the free memory", need / 2**20)
            return False
        log.info("packed linear weights for oneDNN (%.0f MB of copies)", need / 2**20)
        return True

    def _make_forward(self):
        switch = self

        def forward(mod: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
            if switch.on:
                return _exact_linear(x, mod) if switch.exact else _fast_linear(x, mod)
            return F.linear(x, mod.weight, mod.bias)

        return forward

    @contextmanager
    def active(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False
