"""The Triton source of tree_attention.py's kernels, undecorated: `tree_attention._kernels` jits them on first use
(compiled on CUDA, interpreted on the CPU; Triton decides at decoration). Imported only where Triton is."""

import triton.language as tl


def tree_attention(Q, KP, VP, OUT, PACC, PML, OFF, LEN, DEP, PATH, NKV,
                   sq_t, sq_h, sk_p, sk_h, so_t, so_h, W, GROUPS, H, NCH, scale,
                   D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CH: tl.constexpr,
                   SPLIT: tl.constexpr):
    """One program: row b, KV head g, a tile of BM queries, and one chunk c of CH virtual positions. SPLIT: the
    chunk's online-softmax state goes to PACC [T, H, NCH, DP] and PML [T, H, NCH, 2] (max, sum) for `combine`;
    otherwise (one chunk) the program writes the output itself, the same bits `combine` would make of it."""
    b, g, job = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tile, c = job // NCH, job % NCH
    m = tile * BM + tl.arange(0, BM)  # [BM] query = (token w, head in group) of this row and KV head
    valid = m < W * GROUPS
    w = tl.where(valid, m // GROUPS, 0)
    t = b * W + w  # [BM] token
    h = g * GROUPS + m % GROUPS  # [BM] query head
    d = tl.arange(0, DP)
    dm = d < D
    qmask = valid[:, None] & dm[None, :]
    q = tl.load(Q + t[:, None] * sq_t + h[:, None] * sq_h + d[None, :], mask=qmask, other=0.0).to(tl.float32)
    off, L, n = tl.load(OFF + b).to(tl.int32), tl.load(LEN + b).to(tl.int32), tl.load(NKV + b).to(tl.int32)
    dep = tl.load(DEP + t, mask=valid, other=0).to(tl.int32)  # [BM]
    mx = tl.full([BM], -1e30, tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DP], tl.float32)
    for j0 in range(c * CH, tl.minimum(n, c * CH + CH), BN):  # (a chunk past the row's walk: no block)
        p = j0 + tl.arange(0, BN)
        rel = p[None, :] - L  # [1, BN]
        ctx = rel < 0
        ok = valid[:, None] & (ctx | (rel <= dep[:, None]))  # [BM, BN] may attend
        step = tl.minimum(tl.maximum(rel, 0), W - 1)
        anc = tl.load(PATH + t[:, None] * W + step, mask=ok & (rel >= 0), other=0).to(tl.int32)  # [BM, BN]
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
    if SPLIT:  # (a chunk past the row's walk stores nothing: `combine` does not read it)
        part = (t * H + h) * NCH + c  # [BM]
        keep = valid & (c * CH + 0 * m < n)  # [BM]
        tl.store(PACC + part[:, None] * DP + d[None, :], acc, mask=keep[:, None])
        tl.store(PML + part * 2, mx, mask=keep)
        tl.store(PML + part * 2 + 1, l, mask=keep)
    else:
        out = acc / tl.where(l > 0, l, 1.0)[:, None]  # (a query that attends nothing: padding, 0)
        tl.store(OUT + t[:, None] * so_t + h[:, None] * so_h + d[None, :], out.to(OUT.dtype.element_ty), mask=qmask)


def combine(OUT, PACC, PML, NKV, so_t, so_h, TH, H, W, NCH, D: tl.constexpr, DP: tl.constexpr, CH: tl.constexpr,
            BQ: tl.constexpr):
    """One program a tile of BQ (token, head) pairs: each pair's chunk states folded in chunk order, up to the
    last chunk its row walks. The fold is the same whatever the number of chunks: a chunk the query does not
    reach, like one past its row's walk (loaded as the initial state), has max -1e30 and sum 0, so it rescales
    what came before by exp(0) = 1 and adds exact zeros."""
    th = tl.program_id(0) * BQ + tl.arange(0, BQ)  # [BQ] token * H + head
    live = th < TH
    t = th // H
    reach = tl.cdiv(tl.load(NKV + t // W, mask=live, other=0), CH)  # [BQ] chunks the pair's row walks
    d = tl.arange(0, DP)
    mx = tl.full([BQ], -1e30, tl.float32)
    l = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, DP], tl.float32)
    for c in range(0, tl.max(reach, axis=0)):
        part = th * NCH + c
        on = live & (c < reach)
        mc = tl.load(PML + part * 2, mask=on, other=-1e30)
        lc = tl.load(PML + part * 2 + 1, mask=on, other=0.0)
        ac = tl.load(PACC + part[:, None] * DP + d[None, :], mask=on[:, None], other=0.0)
        new = tl.maximum(mx, mc)
        a, e = tl.exp(mx - new), tl.exp(mc - new)
        acc = acc * a[:, None] + ac * e[:, None]
        l = l * a + lc * e
        mx = new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    at = t[:, None] * so_t + (th % H)[:, None] * so_h + d[None, :]
    tl.store(OUT + at, out.to(OUT.dtype.element_ty), mask=live[:, None] & (d < D)[None, :])
