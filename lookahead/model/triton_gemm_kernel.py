"""The Triton source of triton_gemm.py's kernels, undecorated: `triton_gemm._kernels` jits them on first use
(compiled on CUDA, interpreted on the CPU). Imported only where Triton is."""

import triton.language as tl


def gemm(X, W, B, OUT, PART, M, N, K, KS, sx, sw, so,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr,
         HAS_BIAS: tl.constexpr, WIDEN: tl.constexpr):
    """One program: a BM x BN tile of x @ W.T over one split of K (KS of it, a multiple of BK), fp32 sums in K
    order. Tiles are taken GROUP m-tiles at a time per n-tile, so the programs that run together share W's
    tiles in L2 and each weight is read from memory about once whatever M is. SPLIT: the tile's sum goes to
    PART [splits, M, N] for `fold`; otherwise it is written out (+ bias), the same bits `fold` makes of one."""
    pid, s = tl.program_id(0), tl.program_id(1)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    size = tl.minimum(tiles_m - first_m, GROUP)
    tm = first_m + (pid % per_group) % size
    tn = (pid % per_group) // size
    rm = tm * BM + tl.arange(0, BM)
    rn = tn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(s * KS, tl.minimum(K, s * KS + KS), BK):
        kk = k0 + rk
        a = tl.load(X + rm[:, None] * sx + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(W + rn[None, :] * sw + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        if WIDEN:  # (the interpreter's dot misreads bf16; widened, the products are the same exact values)
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # [BM, BK] x [BK, BN], fp32 accumulation
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT:
        tl.store(PART + s * M * N + rm[:, None] * N + rn[None, :], acc, mask=keep)
    else:
        if HAS_BIAS:
            acc = acc + tl.load(B + rn, mask=rn < N, other=0.0)[None, :]
        tl.store(OUT + rm[:, None] * so + rn[None, :], acc.to(OUT.dtype.element_ty), mask=keep)


def fold(PART, B, OUT, M, N, S, so, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The splits' sums added in split order, + bias, written out."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, S):
        acc += tl.load(PART + s * M * N + i, mask=live, other=0.0)
    n = i % N
    if HAS_BIAS:
        acc = acc + tl.load(B + n, mask=live, other=0.0)
    tl.store(OUT + (i // N) * so + n, acc.to(OUT.dtype.element_ty), mask=live)
