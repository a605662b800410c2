"""How a batch's attention can read its rows' keys out of one KV pool, timed per decode step on this machine.

The batch cache keeps every request's KV in its own range of one pool (lookahead/model/batch_cache.py). Batched
SDPA wants `[rows, kv_heads, kv_len, head_dim]`; rows at arbitrary offsets of a pool are not one strided view.
Four ways, SmolLM2-135M's shape (30 layers, 3 KV heads of 64, 9 query heads), fp32, keys and values:

- slots:          the old per-row slot layout `[rows, heads, capacity, dim]`, a plain view (the floor; rows x
                  the longest in memory)
- gather-index:   token-major pool `[tokens, heads, dim]`, `index_select` into a reused staging buffer (chosen)
- gather-heads:   head-major pool `[heads, tokens, dim]`, `index_select` on the token dim
- per-row:        one SDPA call per row over a view of its own range (no copy, one call per row and layer)

    python benchmarks/kv_pool_read.py
"""

import time

import torch
import torch.nn.functional as F

LAYERS, KV_HEADS, DIM, GROUPS = 30, 3, 64, 3


def ms_per_step(fn, rounds: int = 20) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - t0) / rounds * 1e3


def main() -> None:
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; ms per decode step, {LAYERS} layers")
    print("| rows | kv_len | queries/row | slots | gather-index | gather-heads | per-row |")
    print("|---|---|---|---|---|---|---|")
    for rows, kv, width in [(1, 2000, 1), (4, 400, 4), (16, 200, 1), (16, 400, 1), (16, 400, 4)]:
        cap = kv + 64
        pool_tokens = rows * (cap + 3) + 64
        offsets = torch.arange(rows) * (cap + 3)
        index = (offsets[:, None] + torch.arange(kv)[None]).flatten()  # [rows * kv_len]
        slots = torch.randn(rows, KV_HEADS, cap, DIM)
        token_major = torch.randn(pool_tokens, KV_HEADS, DIM)
        head_major = torch.randn(KV_HEADS, pool_tokens, DIM)
        staging_t = torch.empty(rows * kv, KV_HEADS, DIM)
        staging_h = torch.empty(KV_HEADS, rows * kv, DIM)
        q = torch.randn(rows, KV_HEADS, GROUPS * width, DIM)  # query heads packed onto their KV head
        mask = torch.ones(rows, 1, GROUPS * width, kv, dtype=torch.bool)

        def slot_view():
            for _ in range(LAYERS):
                k = slots[:, :, :kv]
                F.scaled_dot_product_attention(q, k, k, attn_mask=mask)

        def gather(pool, dim, staging, as_batch):
            """Keys and values gathered along the pool's token dim `dim`, then one batched SDPA, per layer."""
            def run():
                for _ in range(LAYERS):
                    for _kv in range(2):
                        torch.index_select(pool, dim, index, out=staging)
                    k = as_batch(staging)
                    F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
            return run

        gather_index = gather(token_major, 0, staging_t, lambda s: s.view(rows, kv, KV_HEADS, DIM).transpose(1, 2))
        gather_heads = gather(head_major, 1, staging_h, lambda s: s.view(KV_HEADS, rows, kv, DIM).transpose(0, 1))

        def per_row():
            for _ in range(LAYERS):
                for b in range(rows):
                    k = token_major[offsets[b] : offsets[b] + kv].transpose(0, 1)[None]
                    F.scaled_dot_product_attention(q[b : b + 1], k, k, attn_mask=mask[b : b + 1])

        times = [ms_per_step(f) for f in (slot_view, gather_index, gather_heads, per_row)]
        print(f"| {rows} | {kv} | {width} | " + " | ".join(f"{t:.1f}" for t in times) + " |")


if __name__ == "__main__":
    main()
