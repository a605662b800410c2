"""A half-precision linear whose outputs do not depend on the row count (CPU; `exact_linear.cpp`).

Exact forwards (`runner.exact`) need every token's logits bitwise the same
whether it is verified alone or inside a tree or a batch. oneDNN's bf16 GEMM
sums in an order that depends on the row count; the fallback in
`fast_linear` keeps an fp32 copy of every weight and sums fixed blocks with
fp32 matmuls, which is exact but reads twice the bytes and misses the CPU's
bf16 dot-product instructions. This kernel reads the bf16 (or fp16) weight
as it is: each output is one vector accumulator running over the inputs in
order (the CPU's bf16 dot products where it has them, AVX512-BF16; widened
fused multiply-adds otherwise), reduced in one fixed order, plus the bias
in float32, rounded once to the dtype.
"""

import ctypes
from functools import cache

import torch

from lookahead.model import native

_DTYPES = {torch.bfloat16: 1, torch.float16: 2}


class _Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w", "bias", "y")] + [(n, ctypes.c_int64) for n in "MNK"]


class ExactLinear:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.la_exact_linear
        self._fn.argtypes = [ctypes.POINTER(_Args), ctypes.c_int]
        self._fn.restype = ctypes.c_int

    @staticmethod
    def supports(weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dtype in _DTYPES and weight.is_contiguous()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in], weight [out, in] (contiguous), bias [out] float32 or None -> [..., out] in x's dtype."""
        flat = x.reshape(-1, x.shape[-1]).to(weight.dtype).contiguous()  # [rows, in]
        y = flat.new_empty((flat.shape[0], weight.shape[0]))
        args = _Args(flat.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                     flat.shape[0], weight.shape[0], weight.shape[1])
        if self._fn(ctypes.byref(args), _DTYPES[weight.dtype]) != 0:
            raise ValueError(f"exact linear has no path for {weight.dtype}")
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def mm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] contiguous, in the weight's dtype -> [rows, out]: the call above with no reshaping."""
        y = x.new_empty((x.shape[0], weight.shape[0]))
        args = _Args(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                     x.shape[0], weight.shape[0], weight.shape[1])
        if self._fn(ctypes.byref(args), _DTYPES[weight.dtype]) != 0:
            raise ValueError(f"exact linear has no path for {weight.dtype}")
        return y


@cache
def kernel() -> ExactLinear | None:
    lib = native.load("exact_linear")
    return ExactLinear(lib) if lib is not None else None
