"""The Triton source of tree_attention.py's kernel, undecorated: `tree_attention._kernel` jits it on first use
(compiled on CUDA, interpreted on the CPU; Triton decides at decoration). Imported only where Triton is."""

import triton.language as tl


def tree_attention(Q, KP, VP, OUT, OFF, LEN, DEP, PATH, NKV,
                   sq_t, sq_h, sk_p, sk_h, so_t, so_h, W, GROUPS, scale,
                   D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    b, g, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = tile * BM + tl.arange(0, BM)  # [BM] query = (token w, head in group) of this row and KV head
    valid = m < W * GROUPS
    w = tl.where(valid, m // GROUPS, 0)
    t = b * W + w  # [BM] token
    h = g * GROUPS + m % GROUPS  # [BM] query head
    d = tl.arange(0, DP)
    dm = d < D
    qmask = valid[:, None] & dm[None, :]
    q = tl.load(Q + t[:, None] * sq_t + h[:, None] * sq_h + d[None, :], mask=qmask, other=0.0).to(tl.float32)
    off, L, n = tl.load(OFF + b), tl.load(LEN + b), tl.load(NKV + b)
    dep = tl.load(DEP + t, mask=valid, other=0)  # [BM]
    mx = tl.full([BM], -1e30, tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DP], tl.float32)
    for j0 in range(0, n, BN):
        p = j0 + tl.arange(0, BN)
        rel = p[None, :] - L  # [1, BN]
        ctx = rel < 0
        ok = valid[:, None] & (ctx | (rel <= dep[:, None]))  # [BM, BN] may attend
        step = tl.minimum(tl.maximum(rel, 0), W - 1)
        anc = tl.load(PATH + t[:, None] * W + step, mask=ok & (rel >= 0), other=0)  # [BM, BN]
        slot = tl.where(ctx, off + p[None, :], off + L + anc)
        at = slot[:, :, None] * sk_p + g * sk_h + d[None, None, :]  # [BM, BN, DP]
        lm = ok[:, :, None] & dm[None, None, :]
        k = tl.load(KP + at, mask=lm, other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(q[:, None, :] * k, axis=2) * scale, float("-inf"))  # [BM, BN]
        new = tl.maximum(mx, tl.max(s, axis=1))
        alpha = tl.exp(mx - new)
        pr = tl.where(ok, tl.exp(s - new[:, None]), 0.0)
        l = l * alpha + tl.sum(pr, axis=1)
        v = tl.load(VP + at, mask=lm, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * v, axis=1)
        mx = new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # (a query that attends nothing: padding, 0)
    tl.store(OUT + t[:, None] * so_t + h[:, None] * so_h + d[None, :], out.to(OUT.dtype.element_ty), mask=qmask)
