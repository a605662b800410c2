"""Cheaper matmuls for the runner's CPU forwards.

`F.linear` with a few rows takes MKL's matrix-vector path, which uses the
memory bandwidth badly; `W @ x.T` (one row duplicated when alone) streams
each weight once and is the fastest for one or two rows; beyond that a
weight pre-packed once into oneDNN's blocked layout
(`mkldnn._reorder_linear_weight`, what Inductor's freezing pass uses) keeps
the per-token cost of a tree close to that of one token. That flat curve is
what lets a draft tree pay for itself on a CPU (measured: docs/benchmarks.md,
"Kernel measurements").

Packing copies every linear weight once (for SmolLM2-135M fp32, ~540 MB), so
it is done only for fp32 weights that fit comfortably in free memory;
otherwise the `W @ x.T` / `F.linear` paths remain. Results differ from
`F.linear` only in float rounding order, as any batched verification forward
does; the losslessness tests cover it.

Used as a context manager around the runner's own forwards, so plain
`model.generate` (the baseline) keeps the stock path.

Exact linears (half-precision models; the runner's `exact`; `exact_path`
picks one per module). oneDNN's
bf16 GEMM accumulates in fp32 in an order that depends on the row count, so
now and then a row's bf16 output differs by one step between a one-token
forward and a tree. Where the native kernel builds (`exact_linear.py`), it
multiplies the half-precision weight as it is, each output summed in one
fixed order. Otherwise `Float64Linear` keeps a float64 copy of each weight
and multiplies in float64: a product of two bf16 (or fp16) numbers is exact
there, and their sum is exact too while the products span less than about
2^37, so whatever order the GEMM adds them in for a given row count, the
float64 result, and so its bf16 rounding, is the same; beyond that span the
orders differ at 2^-53 of the largest product, far below a bf16 step.
(An fp32 copy summed in blocks of 128 held on an AMD EPYC and split at 17
rows on an Intel Xeon, whose oneDNN picks another kernel: a reduction order
is a property of the machine, so the fallback does not rely on one.) It
costs four times the half-precision weight in memory and a float64 GEMM.
Checked bitwise for 1 to 40 rows in `tests/lookahead/model/test_exact.py`. On a
GPU, `FixedRowsLinear` calls the stock GEMM with one fixed shape instead (or, with
LOOKAHEAD_EXACT_GEMM=triton, triton_gemm.py's fixed-tile kernel, which reads each weight once at any rows).
"""

import logging
import time
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from lookahead.model import exact_linear, triton_gemm
from lookahead.model.kv_memory import host_available_bytes

log = logging.getLogger(__name__)

ROWS_VIA_WX = 2  # without packed weights, up to this many rows take W @ x.T (with them: measured, `_rows_via_wx`)
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
    via_wx = mod._lookahead_rows_via_wx  # ROWS_VIA_WX, or timed where the weights are packed
    if rows == 1 and via_wx >= 1:
        y = (w @ torch.cat((flat, flat)).t()).t()[:1]
    elif rows <= via_wx or packed is None and rows <= 16:
        y = (w @ flat.t()).t()
    elif packed is not None:
        return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "").reshape(*x.shape[:-1], w.shape[0])
    else:
        y = F.linear(flat, w)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], w.shape[0])


EXACT_GPU_ROWS = 128  # rows per GEMM call of the exact path on a GPU (why this many: `FixedRowsLinear`)


def exact_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] half-precision weight -> [in, out] float64: what the fallback `Float64Linear` multiplies."""
    return weight.detach().double().t().contiguous()


class NativeLinear:
    """CPU: `exact_linear.cpp` on the half-precision weight as it is."""

    def __init__(self, mod: torch.nn.Linear) -> None:
        self.bias = None if mod.bias is None else mod.bias.detach().float().contiguous()  # [out] float32

    def __call__(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        return exact_linear.kernel()(x, mod.weight, self.bias)

    def mm(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        """x [rows, in] contiguous in the weight's dtype -> [rows, out]."""
        return exact_linear.kernel().mm(x, mod.weight, self.bias)


class Float64Linear:
    """CPU without the native kernel: a float64 copy, exact sums (see the module docstring)."""

    def __init__(self, mod: torch.nn.Linear) -> None:
        self.weight = exact_weight(mod.weight)  # [in, out] float64

    def __call__(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        y = x.reshape(-1, x.shape[-1]).double() @ self.weight  # [rows, out]
        if mod.bias is not None:
            y = y + mod.bias.double()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.weight.shape[1])

    mm = __call__


class FixedRowsLinear:
    """GPU: the stock GEMM, always called with `rows` rows (the last call padded with zeros).

    A GEMM library picks its kernel, tile shape and split of the reduction from the problem's shape, and a row's
    sum order follows from those; every row of a call runs the same instructions over its own row of x. So with
    the shape fixed, a token's output depends on its own row alone, whichever position it holds and whatever
    shares the call. 128 rows: a bf16 GEMM of 128 rows reads each weight byte once for 128 multiply-adds, under
    the compute-to-bandwidth ratio of current data-centre GPUs (H100: ~990 TFLOP/s over 3.35 TB/s, ~295 FLOP
    per byte), so a decode step that pads 1-17 rows up to 128 still costs what reading the weights costs. Past
    128 rows the weights are read once per 128."""

    def __init__(self, rows: int = EXACT_GPU_ROWS) -> None:
        self.rows = rows

    def __call__(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [n, in]
        n = flat.shape[0]
        pad = -n % self.rows
        if pad:
            flat = torch.cat((flat, flat.new_zeros(pad, flat.shape[1])))
        y = torch.cat([F.linear(chunk, mod.weight, mod.bias) for chunk in flat.split(self.rows)])  # [n + pad, out]
        return y[:n].reshape(*x.shape[:-1], y.shape[1])

    def mm(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        """x [rows, in]: one call when it already has the fixed row count (a step padded to it)."""
        return F.linear(x, mod.weight, mod.bias) if x.shape[0] == self.rows else self(x, mod)


def exact_path(mod: torch.nn.Linear):
    """The batch-invariant linear for this module's weight: native on CPU where it builds, float64 on CPU
    otherwise, fixed-shape GEMMs on a GPU; triton_gemm.py's kernel where LOOKAHEAD_EXACT_GEMM=triton asks for it
    and Triton runs (compiled on CUDA; on the CPU only under its interpreter, for the tests)."""
    if triton_gemm.wanted() and triton_gemm.usable(mod.weight.device):
        return triton_gemm.TritonLinear(mod)
    if mod.weight.device.type != "cpu":
        return FixedRowsLinear()
    native = exact_linear.kernel()
    return NativeLinear(mod) if native is not None and native.supports(mod.weight) else Float64Linear(mod)


def _exact_linear(x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
    return mod._lookahead_exact(x, mod)


def _rows_via_wx(linears: list[torch.nn.Linear], passes: int = 3) -> int:
    """Up to how many rows (0, 1 or 2) `W @ x.T` beats the packed weight on this machine: `_fast_linear` itself,
    timed both ways over every linear once per pass, as a forward streams them. Which wins at one or two rows is
    a property of the CPU and its BLAS, so it is measured, not assumed (docs/benchmarks.md, "Kernel
    measurements"). Leaves each module's `_lookahead_rows_via_wx` at the answer."""
    def best(rows: int, via_wx: int) -> float:
        for m in linears:
            m._lookahead_rows_via_wx = via_wx
        xs = {m.in_features: torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears}
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            for m in linears:
                _fast_linear(xs[m.in_features], m)
            times.append(time.perf_counter() - t0)
        return min(times)

    with torch.inference_mode():
        via_wx = 0
        for rows in (1, 2):
            if best(rows, via_wx=rows) >= best(rows, via_wx=0):
                break
            via_wx = rows
    for m in linears:
        m._lookahead_rows_via_wx = via_wx
    log.info("linears: W @ x.T for up to %d rows, the packed weight beyond (timed)", via_wx)
    return via_wx


class FastLinears:
    """Installs the fast path on every nn.Linear of a model, active only inside `active()`; with `exact`, the
    exact path instead (half-precision weights; `exact_path`)."""

    def __init__(self, model: torch.nn.Module, enabled: bool, pack: bool | None = None, exact: bool = False,
                 extra: tuple[torch.nn.Linear, ...] = (), unpacked: tuple[torch.nn.Linear, ...] = ()) -> None:
        """`extra`: linears outside the model that get the same paths (the decoder step's fused weights);
        `unpacked`: the model's linears those replace in decode steps, not packed (prefill's rows do not need it)."""
        self.on = False
        self.packed = False
        self.exact = exact
        self.enabled = enabled and not exact
        skip = {id(m) for m in unpacked}
        linears = [mod for mod in model.modules() if type(mod) is torch.nn.Linear] + list(extra)
        self.linears = linears
        for mod in linears:  # an exact runner's stock-kernel forwards (prefill) take _fast_linear too
            mod._lookahead_rows_via_wx = ROWS_VIA_WX
        if exact:
            for mod in linears:
                mod._lookahead_exact = exact_path(mod)
                mod.forward = types.MethodType(self._make_forward(), mod)
            return
        if not enabled:
            return
        to_pack = [mod for mod in linears if id(mod) not in skip]
        if pack is None:
            pack = self._should_pack(to_pack)
        if pack:
            for mod in to_pack:
                mod._lookahead_packed = torch.ops.mkldnn._reorder_linear_weight(mod.weight.detach(), PACK_HINT)
            self.packed = True
            _rows_via_wx(to_pack)
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

    def linear2d(self, x: torch.Tensor, mod: torch.nn.Linear, exact: bool, lone: bool = False) -> torch.Tensor:
        """x [rows, in] contiguous -> [rows, out]: the path `active()` gives `mod` (`exact`: the exact one, on an
        exact instance), in the fewest dispatched ops: the decoder step's linears (decoder_step.py). `lone`: x is
        one row and a padding row, the pair `_fast_linear` makes of a lone row itself (the same path, the same
        bits)."""
        if exact and self.exact:
            return mod._lookahead_exact.mm(x, mod)
        if not self.enabled:
            return F.linear(x, mod.weight, mod.bias)
        rows, via_wx = 1 if lone else x.shape[0], mod._lookahead_rows_via_wx
        if lone and via_wx >= 1:
            return self._via_wx(x, mod)
        packed = getattr(mod, "_lookahead_packed", None)
        if rows == 1 and via_wx >= 1 or rows > via_wx and packed is None and rows > 16:
            return _fast_linear(x, mod)
        if rows > via_wx and packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, mod.bias, "none", [], "")
        return self._via_wx(x, mod)

    @staticmethod
    def _via_wx(x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        """`W @ x.T` as _fast_linear computes it (the same bits), made row-major again: the next linear's `x.T`
        must be a transposed view for BLAS's fast path (a column-major x took 4x as long in SmolLM2's down
        projection)."""
        y = torch.mm(mod.weight, x.t()).t()
        return y.contiguous() if mod.bias is None else y + mod.bias  # (the sum is row-major already)

    @contextmanager
    def active(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False
