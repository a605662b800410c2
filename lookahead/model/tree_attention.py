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

On CUDA the kernel is compiled by Triton; on the CPU it runs under Triton's interpreter
(`TRITON_INTERPRET=1`), which is how the tests prove the algorithm's invariance without a GPU. What the
interpreter cannot show is the GPU's own rounding and speed: the GPU check's section P measures both.
Off by default until it has (`LOOKAHEAD_TREE_ATTENTION=triton` turns it on for the static step).
"""

import os
from functools import cache

import torch

ENV = "LOOKAHEAD_TREE_ATTENTION"
BM, BN = 8, 16  # queries and virtual key positions a program takes at once: constants, for invariance
NUM_WARPS = 4


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


def usable(device: torch.device) -> bool:
    """Can the kernel run on `device`: compiled on CUDA, interpreted on the CPU when TRITON_INTERPRET=1."""
    return available() and (device.type == "cuda" or device.type == "cpu" and interpreting())


@cache
def _kernel(interpret: bool):
    """The jitted kernel, made on first use in each mode (Triton decides at decoration whether it interprets)."""
    import triton

    from lookahead.model.tree_attention_kernel import tree_attention

    return triton.jit(tree_attention)


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
           scale: float) -> torch.Tensor:
    """q [rows * width, heads, dim] (row-major tokens); keys/values the pool [slots, kv_heads, dim]; per row
    `offsets`, `lengths` (its committed tokens), `kv_walk` (virtual positions to walk: length + the step's
    width, or anything covering every query's last); per token `depths` [rows * width] (-1: it attends no tree
    position, as padding must, since its path may point past what the row wrote) and `paths`
    [rows * width, width]. Returns [rows * width, heads, dim] in q's dtype."""
    T, H, D = q.shape
    assert q.stride(2) == 1 and keys.stride(2) == 1 and keys.stride() == values.stride()
    kvh = keys.shape[1]
    groups = H // kvh
    out = torch.empty_like(q)
    grid = (rows, kvh, -(-(width * groups) // BM))
    dp = 1 << (D - 1).bit_length()
    _kernel(interpreting())[grid](
        q, keys, values, out, offsets, lengths, depths, paths, kv_walk,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), out.stride(0), out.stride(1),
        width, groups, scale, D=D, DP=dp, BM=BM, BN=BN, num_warps=NUM_WARPS)
    return out
