"""A batch-invariant bf16 GEMM in Triton: the exact linear that reads each weight about once at any row count.

The GPU's exact linear today (`fast_linear.FixedRowsLinear`) calls cuBLAS with one fixed shape, 128 rows, so
that a row's sum order never depends on the call: a step of 32 rows x 16 tokens is then four calls, and
reads every weight four times (a Qwen2-7B step: ~4 x 3.2 ms on an H200). A GEMM library picks its kernel and
its split of K from the shape, so a wider call may give other bits; this kernel fixes both instead:

- one tile shape (BM x BN x BK) for every call, whatever M; a row's output is made by the same instructions
  over its own row of x at any position of any call (what FixedRowsLinear relies on in cuBLAS too);
- K is split into a fixed number of parts per weight (`splits`, from the weight's shape and the GPU's SM
  count, never from M), added in split order by a second kernel: a small-M call still fills the GPU (as
  cuBLAS's split-K does) and the order of every sum stays fixed;
- tiles are walked GROUP m-tiles per n-tile, so the programs that run at once share a weight tile in L2:
  at 512 rows the weight is read about once, not four times.

fp32 accumulation, the bias added in fp32, one rounding to the output's dtype. On the CPU it runs under
Triton's interpreter (TRITON_INTERPRET=1) for the tests, which prove the algorithm: the GPU's own bits and
speed are the GPU check's (section P, `gemm`). Off by default: `LOOKAHEAD_EXACT_GEMM=triton` makes it the
exact path on CUDA (fast_linear.exact_path), until a GPU has shown it the same bits at every row count.
"""

import os
from functools import cache

import torch

from lookahead.model import tree_attention

ENV = "LOOKAHEAD_EXACT_GEMM"
BM, BN, BK, GROUP = 64, 128, 64, 8  # the one tile shape of every call, and m-tiles walked per n-tile
FOLD_BLOCK = 1024
NUM_WARPS, NUM_STAGES = 4, 3
CPU_SMS = 8  # what the interpreter plans splits for (any constant: the CPU's own runs do not use this path)


def wanted() -> bool:
    return os.environ.get(ENV, "") == "triton"


def usable(device: torch.device) -> bool:
    """Compiled on CUDA; interpreted on the CPU when TRITON_INTERPRET=1 (as tree_attention's kernel)."""
    return tree_attention.usable(device)


# The row count is never specialised (at 1, or a multiple of 16, Triton would compile other code): a row's bits
# come from one kernel at every row count. The weight's own sizes may be.
STEP_VARYING = ["M"], ["M"]


def make_kernels(jit) -> tuple:
    """(gemm, fold) from the Triton source, with `jit` (triton.jit, or JITFunction for triton_build)."""
    from lookahead.model import triton_gemm_kernel as src

    return tuple(jit(f, do_not_specialize=v) for f, v in zip((src.gemm, src.fold), STEP_VARYING))


@cache
def _kernels(interpret: bool):
    import triton

    return make_kernels(triton.jit)


def splits(n: int, k: int, sms: int) -> tuple[int, int]:
    """(K a split covers, a multiple of BK; the number of splits) for an [n, k] weight on a GPU of `sms` SMs:
    enough programs at one m-tile to fill the GPU twice over, each split at least four BK steps. A property of
    the weight and the device, so the same for every call."""
    tiles_n, steps = -(-n // BN), -(-k // BK)
    want = max(1, min(-(-2 * sms // tiles_n), steps // 4))
    ks = -(-steps // want) * BK
    return ks, -(-k // ks)


class TritonLinear:
    """The exact linear for one module's weight (fast_linear.exact_path's interface: `__call__`, `mm`)."""

    def __init__(self, mod: torch.nn.Linear) -> None:
        w = mod.weight
        sms = torch.cuda.get_device_properties(w.device).multi_processor_count if w.device.type == "cuda" \
            else CPU_SMS
        self.ks, self.splits = splits(w.shape[0], w.shape[1], sms)
        self.bias = None if mod.bias is None else mod.bias.detach().float().contiguous()  # [out] fp32

    def mm(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype."""
        w = mod.weight
        x = x.contiguous()
        M, K = x.shape
        N = w.shape[0]
        interpret = tree_attention.interpreting()
        out = tree_attention.output_for(x, (M, N))
        if M == 0:
            return out.to(x.dtype)
        split = self.splits > 1
        part = x.new_empty((self.splits, M, N) if split else (1,), dtype=torch.float32)
        bias = self.bias if self.bias is not None else part  # (a pointer the kernel does not read)
        first, fold = _kernels(interpret)
        first[(-(-M // BM) * -(-N // BN), self.splits)](
            x, w, bias, out, part, M, N, K, self.ks, x.stride(0), w.stride(0), out.stride(0),
            BM=BM, BN=BN, BK=BK, GROUP=GROUP, SPLIT=split, HAS_BIAS=self.bias is not None, WIDEN=interpret,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES, enable_fp_fusion=tree_attention.FP_FUSION)
        if split:
            fold[(-(-M * N // FOLD_BLOCK),)](part, bias, out, M, N, self.splits, out.stride(0), BLOCK=FOLD_BLOCK,
                                             HAS_BIAS=self.bias is not None, num_warps=NUM_WARPS,
                                             enable_fp_fusion=tree_attention.FP_FUSION)
        return out.to(x.dtype)

    def __call__(self, x: torch.Tensor, mod: torch.nn.Linear) -> torch.Tensor:
        y = self.mm(x.reshape(-1, x.shape[-1]), mod)
        return y.reshape(*x.shape[:-1], y.shape[1])
