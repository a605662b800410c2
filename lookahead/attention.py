"""Tree attention without copying the KV cache for grouped-query models.

Stock SDPA in transformers handles grouped-query attention (several query
heads per key/value head) in one of two ways: a single query token is packed
onto the KV heads, but a multi-token query with a mask gets `repeat_kv`, which
copies every layer's whole K and V `groups` times per forward. For a tree
verification at 2,000 tokens of context that copy dominates the forward.

`packed_tree_sdpa` packs a multi-token query the same way a single token is
packed: the query heads of one KV group become extra query rows of that KV
head (`[b, kv_heads, groups * q, d]`), and the row's mask is repeated per
group. Same arithmetic, no KV copy. It is registered as an attention
implementation that falls back to stock SDPA whenever it is not a runner's
tree forward, so `model.generate` (the baseline) runs exactly the stock path.
"""

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "lookahead_sdpa"


def packed_tree_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)
    switch = getattr(module, "_lookahead_switch", None)
    q_len = query.shape[2]
    if (
        switch is None
        or not switch.on
        or groups == 1
        or q_len == 1
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, _, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    packed_q = query.reshape(b, kv_heads, groups * q_len, d)  # query head h belongs to KV head h // groups
    mask = attention_mask.expand(b, 1, q_len, kv_len)[:, :, None].expand(b, 1, groups, q_len, kv_len)
    out = F.scaled_dot_product_attention(packed_q, key, value, attn_mask=mask.reshape(b, 1, groups * q_len, kv_len),
                                         scale=scaling)
    return out.reshape(b, heads, q_len, d).transpose(1, 2).contiguous(), None  # [b, q, heads, d]


def install(model: torch.nn.Module, switch) -> bool:
    """Route a stock-SDPA model's attention through `packed_tree_sdpa`; False when it uses something else."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, packed_tree_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    for mod in model.modules():
        if hasattr(mod, "num_key_value_groups"):
            mod._lookahead_switch = switch
    for cfg in {id(c): c for c in _configs(model)}.values():
        cfg._attn_implementation = NAME
    return True


def _configs(model):
    yield model.config
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa":
            yield cfg
