# attention: is query 0's output bitwise the same with q_len 1 and q_len k, and with padded kv lengths?
import torch, torch.nn.functional as F
torch.manual_seed(0)
H, D = 9, 64
for dt in (torch.bfloat16, torch.float32):
    for kv in (37, 300, 700):
        K = torch.randn(1, H, kv + 64, D).to(dt); V = torch.randn(1, H, kv + 64, D).to(dt)
        Q = torch.randn(1, H, 64, D).to(dt)
        def sdpa(q_len, pad):
            L = kv + pad
            mask = torch.zeros(q_len, L, dtype=torch.bool); mask[:, :kv] = True
            for i in range(1, q_len):
                if kv - 1 + i < L: mask[i, kv - 1 + i] = True
            return F.scaled_dot_product_attention(Q[:, :, :q_len], K[:, :, :L], V[:, :, :L], attn_mask=mask)[0, :, 0]
        def math(q_len, pad):
            L = kv + pad
            mask = torch.zeros(q_len, L, dtype=torch.bool); mask[:, :kv] = True
            s = (Q[:, :, :q_len].float() @ K[:, :, :L].float().transpose(-1, -2)) / D ** 0.5
            s = s.masked_fill(~mask, float("-inf")).softmax(-1)
            return (s @ V[:, :, :L].float()).to(dt)[0, :, 0]
        for name, f in (("sdpa", sdpa), ("math fp32", math)):
            ref = f(1, 0)
            bad = [(q, p) for q in (1, 2, 5, 16, 33) for p in (0, 1, 16, 64) if not torch.equal(f(q, p), ref)]
            print(dt, kv, name, "differs at (q_len, pad):", bad[:8], len(bad))
