"""Exact tree attention over the KV pool in place, in fp32, as a Triton kernel: the GPU's exact path without float64.

Exact here means what exactness.md means: a token's output is the same bits alone, in a batch, or as a
draft in a tree, as the plain step that would decode it. Batch invariance comes from one program per
(row, KV head, tile of BM queries) with every tile shape a constant, so a query's arithmetic never
depends on what shares the call. Tree invariance needs more: a draft's ancestors sit at tree slots with
siblings masked between them, where plain decoding has the same keys at consecutive positions, and a
block-parallel reduction groups them differently. So each query reads its keys at **virtual positions**
(exactness.md, "What exact fp32 attention on a GPU needs"):

    p < L (the row's committed length)    slot offset + p                         (every query alike)
    p = L + t, t <= the query's depth     slot offset + L + path[query, t]        (its ancestor at depth t)
    past that                             masked

Blocks of BN virtual positions from 0 then hold the same keys, in the same places, for a draft in a tree
and for that token decoded plainly; blocks past a query's last position are all masked and are exact
no-ops of the online softmax (the max unchanged, a rescale by exp(0) = 1, a sum of exact zeros). Scores
are fp32 sums over the head dimension of one fixed shape ([BM, BN, DP] products, reduced over DP), so a
(query, key) pair's score is made the same way in every block.

The walk is split into chunks of CHUNK virtual positions, one program each, and a second kernel folds the
chunks' states (max, sum, weighted values) in chunk order (flash-decoding's split: without it one row at a
2k context is 4 programs for a Qwen2-7B layer, on a GPU of 132 SMs). The chunk edges are fixed virtual
positions, the same in a tree and plainly, and a chunk a query does not reach folds as an exact no-op, so
the fixed split keeps every bit; CHUNK is a constant of the code for that reason, not a tuning of the call.
Its size trades the split's parallelism at few rows against its partial states' traffic at many (at 32
rows x 16 tokens, 2k: ~67 MB a layer at 256); the GPU check's section P times 128, 256, 512 and no split.

On CUDA the kernel is compiled by Triton; on the CPU it runs under Triton's interpreter
(`TRITON_INTERPRET=1`), which is how the tests prove the algorithm's invariance without a GPU. What the
interpreter cannot show is the GPU's own rounding and speed: the GPU check's section P measures both.
Off by default until it has (`LOOKAHEAD_TREE_ATTENTION=triton` turns it on for the static step).
"""

import os
from functools import cache

import torch

ENV = "LOOKAHEAD_TREE_ATTENTION"
# Queries and virtual key positions a program takes at once, and its warps: constants, for invariance. Sized by
# what ptxas makes of them for sm_90 (triton_build; tests/lookahead/model/test_triton_build.py): at head dim 128,
# 8 x 16 on 4 warps needs 255 registers a thread and spills; 8 x 8 on 8 warps needs 167 and spills nothing, at the
# same 8 resident warps an SM.
BM, BN, NUM_WARPS = 8, 8, 8
CHUNK = 256  # virtual positions a program walks (32 blocks); a constant too: chunk edges fix the fold's order
BQ, FOLD_WARPS = 16, 4  # (token, head) pairs a program of the chunks' fold takes, and its warps
FP_FUSION = True  # mul + add contracted to FMA: chosen here, as Triton 3.10 flips its default (3.9 fuses)
INT32 = 2**31  # the kernel's offsets are 32-bit: every index into q, the pool and the partials stays below


def wanted() -> bool:
    return os.environ.get(ENV, "") == "triton"


@cache
def available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or no backend: the float64 path stays
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def output_for(like: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The buffer a Triton kernel writes its output of `shape` into, in `like`'s dtype; fp32 under the
    interpreter, which rounds a downcast toward zero where the GPU rounds to nearest: the caller then rounds it
    with `.to(like.dtype)`, as the GPU would (a no-op on the GPU)."""
    return like.new_empty(shape, dtype=torch.float32 if interpreting() else like.dtype)


def usable(device: torch.device) -> bool:
    """Can the kernel run on `device`: compiled on CUDA, interpreted on the CPU when TRITON_INTERPRET=1."""
    return available() and (device.type == "cuda" or device.type == "cpu" and interpreting())


# Arguments that vary from step to step (the bucket's width, the walk's chunks) are not specialised: Triton would
# otherwise compile another kernel for a value of 1 or a multiple of 16, and a plain step (width 1) would run
# other code than a tree step, whose bits it must match. What Triton may specialise is fixed by the model.
STEP_VARYING = ["W", "NCH"], ["TH", "W", "NCH"]


def make_kernels(jit) -> tuple:
    """(walk, fold) from the Triton source, with `jit` (triton.jit, or JITFunction for triton_build)."""
    from lookahead.model import tree_attention_kernel as src

    return tuple(jit(f, do_not_specialize=v) for f, v in zip((src.tree_attention, src.combine), STEP_VARYING))


@cache
def _kernels(interpret: bool):
    """The jitted kernels, made on first use in each mode (Triton decides at decoration whether it interprets)."""
    import triton

    return make_kernels(triton.jit)


def ancestor_paths(anc: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[rows, width, width] int64: path[b, w, t] = the tree index of token w's ancestor at depth t (itself at its
    own depth; 0 past it), from the ancestry `anc` [rows, width, width] bool and `depths` [rows, width]. Made on
    the device from shapes alone (a graph replays it)."""
    W = anc.shape[-1]
    at_depth = depths[:, None, None, :] == torch.arange(W, device=anc.device)[None, None, :, None]  # [R, 1, t, j]
    hit = anc[:, :, None, :] & at_depth  # [R, w, t, j]: j is w's ancestor at depth t
    return (hit.long() * torch.arange(W, device=anc.device)).sum(-1)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
           depths: torch.Tensor, paths: torch.Tensor, kv_walk: torch.Tensor, rows: int, width: int,
           scale: float, max_walk: int, chunk: int | None = None) -> torch.Tensor:
    """q [rows * width, heads, dim] (row-major tokens); keys/values the pool [slots, kv_heads, dim]; per row
    `offsets`, `lengths` (its committed tokens), `kv_walk` (virtual positions to walk: length + the step's
    width, or anything covering every query's last), at most `max_walk` (a bound known on the host: the
    bucket's positions, so the launch reads nothing back); per token `depths` [rows * width] (-1: it attends no
    tree position, as padding must, since its path may point past what the row wrote) and `paths`
    [rows * width, width]. Returns [rows * width, heads, dim] in q's dtype.

    The walk is split into chunks of `chunk` virtual positions, one program each (flash-decoding's split, so
    one row at a long context still fills the GPU), and the chunks' states are folded in chunk order by
    `combine`. Chunk edges sit at fixed virtual positions and a chunk a query does not reach folds as an exact
    no-op, so a query's bits do not depend on how many chunks the call has, nor on whether it has one (then the
    first kernel writes the output itself). `chunk` must be the same for every step of a model (a multiple of
    BN; None: CHUNK, read at the call, so a test may shrink it for a whole engine)."""
    chunk = CHUNK if chunk is None else chunk
    T, H, D = q.shape
    assert q.stride(2) == 1 and keys.stride(2) == 1 and keys.stride() == values.stride() and chunk % BN == 0
    assert max(keys.numel(), q.numel()) < INT32, "a pool layer past kv_memory.POOL_LAYER_ELEMENTS: the ledger caps it"
    kvh = keys.shape[1]
    groups = H // kvh
    out = output_for(q, q.shape)
    chunks = max(1, -(-max_walk // chunk))
    split = chunks > 1
    dp = 1 << (D - 1).bit_length()
    part = q.new_empty((T, H, chunks, dp) if split else (1,), dtype=torch.float32)  # each chunk's sum of P V
    part_ml = q.new_empty((T, H, chunks, 2) if split else (1,), dtype=torch.float32)  # and its (max, sum of P)
    assert T * H * chunks * dp < INT32
    first, fold = _kernels(interpreting())
    first[(rows, kvh, -(-(width * groups) // BM) * chunks)](
        q, keys, values, out, part, part_ml, offsets, lengths, depths, paths, kv_walk,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), out.stride(0), out.stride(1),
        width, groups, H, chunks, scale, D=D, DP=dp, BM=BM, BN=BN, CH=chunk, SPLIT=split, num_warps=NUM_WARPS,
        enable_fp_fusion=FP_FUSION)
    if split:
        fold[(-(-T * H // BQ),)](out, part, part_ml, kv_walk, out.stride(0), out.stride(1), T * H, H, width, chunks,
                                  D=D, DP=dp, CH=chunk, BQ=BQ, num_warps=FOLD_WARPS,
                                  enable_fp_fusion=FP_FUSION)
    return out.to(q.dtype)
