"""Reference forwards of the legacy architectures, in plain torch, from their published descriptions.

The oracle for the converter: written from Qwen(1)'s and ChatGLM3's modeling descriptions (not from the
transformers classes the converter targets), over a state dict with the legacy tensor names.
Both take token ids (T,) and return fp32 logits (T, vocab), causal attention, positions 0..T-1.
"""

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def attention(q, k, v):
    """q, k, v: (heads, T, head_dim) -> (T, heads * head_dim), causal softmax(q k^T / sqrt(head_dim)) v."""
    T, head_dim = q.shape[1], q.shape[2]
    scores = q @ k.transpose(1, 2) / head_dim**0.5  # (heads, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, -1)


def qwen1_forward(sd: dict, cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    H, n_heads, T = cfg["hidden_size"], cfg["num_attention_heads"], len(ids)
    hd, eps = H // n_heads, cfg["layer_norm_epsilon"]
    # Rotary over the whole head, halves rotated against each other (rotate_half), base rotary_emb_base.
    inv_freq = 1.0 / cfg["rotary_emb_base"] ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.outer(torch.arange(T).float(), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # (T, hd)

    def rope(t):  # (heads, T, hd)
        t1, t2 = t.chunk(2, -1)
        return t * cos + torch.cat([-t2, t1], -1) * sin

    x = sd["transformer.wte.weight"][ids]  # (T, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"transformer.h.{i}."
        h = rms_norm(x, sd[p + "ln_1.weight"], eps)
        qkv = h @ sd[p + "attn.c_attn.weight"].T + sd[p + "attn.c_attn.bias"]  # (T, 3H): [q | k | v]
        q, k, v = (t.view(T, n_heads, hd).transpose(0, 1) for t in qkv.split(H, -1))
        x = x + attention(rope(q), rope(k), v) @ sd[p + "attn.c_proj.weight"].T
        h = rms_norm(x, sd[p + "ln_2.weight"], eps)
        # Qwen(1)'s swiglu: silu on w2 (the gate), times w1 (up), then c_proj.
        a1, a2 = h @ sd[p + "mlp.w1.weight"].T, h @ sd[p + "mlp.w2.weight"].T
        x = x + (a1 * F.silu(a2)) @ sd[p + "mlp.c_proj.weight"].T
    return rms_norm(x, sd["transformer.ln_f.weight"], eps) @ sd["lm_head.weight"].T


def chatglm3_forward(sd: dict, cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    n_heads, T, eps = cfg["num_attention_heads"], len(ids), cfg["layernorm_epsilon"]
    hd = cfg["kv_channels"]
    groups = cfg["multi_query_group_num"] if cfg["multi_query_attention"] else n_heads
    # Rotary on the first half of each head only, rotating interleaved pairs (x0, x1), base 10000 * rope_ratio.
    rot = hd // 2
    theta = 1.0 / (10000 * cfg.get("rope_ratio", 1)) ** (torch.arange(0, rot, 2).float() / rot)
    angles = torch.outer(torch.arange(T).float(), theta)  # (T, rot/2)
    cos, sin = angles.cos(), angles.sin()

    def rope(t):  # (heads, T, hd)
        pairs, rest = t[..., :rot].unflatten(-1, (rot // 2, 2)), t[..., rot:]
        x0, x1 = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(-2)
        return torch.cat([rotated, rest], -1)

    x = sd["transformer.embedding.word_embeddings.weight"][ids]
    for i in range(cfg["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        h = rms_norm(x, sd[p + "input_layernorm.weight"], eps)
        qkv = h @ sd[p + "self_attention.query_key_value.weight"].T + sd[p + "self_attention.query_key_value.bias"]
        q, k, v = qkv.split([n_heads * hd, groups * hd, groups * hd], -1)
        q = q.view(T, n_heads, hd).transpose(0, 1)
        # Multi-query groups: each key/value head serves n_heads // groups consecutive query heads.
        k, v = (t.view(T, groups, hd).transpose(0, 1).repeat_interleave(n_heads // groups, 0) for t in (k, v))
        x = x + attention(rope(q), rope(k), v) @ sd[p + "self_attention.dense.weight"].T
        h = rms_norm(x, sd[p + "post_attention_layernorm.weight"], eps)
        gate, up = (h @ sd[p + "mlp.dense_h_to_4h.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ sd[p + "mlp.dense_4h_to_h.weight"].T
    x = rms_norm(x, sd["transformer.encoder.final_layernorm.weight"], eps)
    return x @ sd["transformer.output_layer.weight"].T
