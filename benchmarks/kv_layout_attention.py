"""Attention read cost per layer of three KV layouts for one decode step (1 query per row), SmolLM2 shapes
(kv_heads 3, groups 3, head_dim 64): one batched call over [rows, heads, ctx, dim] (the slot layout), one call per row
over its range of a head-major pool (the kv-pool branch), and a gather from shuffled 16-token blocks (a paged cache
read through SDPA). Run: .venv/bin/python benchmarks/kv_layout_attention.py"""
import torch, time, torch.nn.functional as F, warnings
warnings.filterwarnings("ignore")
torch.set_num_threads(2)
torch.manual_seed(0)
kvh, g, d = 3, 3, 64
def timeit(f):
    for _ in range(3): f()
    best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(10): f()
        best = min(best, (time.perf_counter() - t) / 10 * 1e3)
    return best
def run(rows, L, block=16):
    q = torch.randn(rows, kvh, g, d)
    K = torch.randn(rows, kvh, L, d); V = torch.randn(rows, kvh, L, d)
    stride = L + 37
    pk = torch.randn(1, kvh, rows * stride, d); pv = torch.randn(1, kvh, rows * stride, d)   # head-major range pool
    tk = torch.randn(rows * stride, kvh, d); tv = torch.randn(rows * stride, kvh, d)         # token-major range pool
    per = (L + block - 1) // block
    nb = rows * per
    bk = torch.randn(nb + 8, kvh, block, d); bv = torch.randn(nb + 8, kvh, block, d)
    table = torch.randperm(nb + 8)[:nb].view(rows, -1)
    def batched():
        return F.scaled_dot_product_attention(q, K, V)
    def loop_headmajor():
        return torch.cat([F.scaled_dot_product_attention(q[b:b+1], pk[:, :, b*stride:b*stride+L], pv[:, :, b*stride:b*stride+L]) for b in range(rows)])
    def loop_tokenmajor():
        return torch.cat([F.scaled_dot_product_attention(q[b:b+1], tk[b*stride:b*stride+L].transpose(0, 1)[None], tv[b*stride:b*stride+L].transpose(0, 1)[None]) for b in range(rows)])
    def gather_blocks():
        k = bk[table].transpose(1, 2).reshape(rows, kvh, -1, d)[:, :, :L]
        v = bv[table].transpose(1, 2).reshape(rows, kvh, -1, d)[:, :, :L]
        return F.scaled_dot_product_attention(q, k, v)
    out = {f.__name__: timeit(f) for f in (batched, loop_headmajor, loop_tokenmajor, gather_blocks)}
    print(f"rows {rows:3d} ctx {L:5d} | " + "  ".join(f"{k} {v:7.3f}" for k, v in out.items()) + "  (ms per layer)", flush=True)
for rows, L in ((1, 700), (4, 700), (16, 700), (16, 2000), (32, 2000)):
    run(rows, L)
