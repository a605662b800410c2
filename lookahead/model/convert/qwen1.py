"""Qwen(1) (`model_type: qwen`, `QWenLMHeadModel`) -> transformers' native `Qwen2ForCausalLM`.

Qwen(1) is Qwen2's architecture under other names, with three traps:
- `attn.c_attn` is q, k and v fused row-wise, `[q | k | v]`, with bias;
- the MLP is `c_proj(w1(x) * silu(w2(x)))`: `w2` is the gate and `w1` the up projection, and the config's
  `intermediate_size` counts both halves, so Qwen2's is half of it;
- past the trained `seq_length`, Qwen(1) switches on dynamic NTK rotary scaling and logn attention
  scaling, which no native architecture has. Below it both are inactive, so the converted model is
  exact there, and its context is capped at `seq_length`.
`lm_head` is not tied to the embedding, and the padded vocabulary is kept as it is.
"""

import logging
import re

import torch
from transformers import Qwen2Config

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError

log = logging.getLogger(__name__)

MODEL_TYPE = "qwen"
# Qwen(1)'s published special ids: <|endoftext|>, <|im_end|>. The tokenizer's, when present, win.
PUBLISHED_EOS = [151643, 151645]
PUBLISHED_PAD = 151643

_RENAMES = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_RENAMES = {
    "ln_1.weight": "input_layernorm.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
    "attn.c_proj.weight": "self_attn.o_proj.weight",
    "mlp.w2.weight": "mlp.gate_proj.weight",
    "mlp.w1.weight": "mlp.up_proj.weight",
    "mlp.c_proj.weight": "mlp.down_proj.weight",
}
_LAYER = re.compile(r"transformer\.h\.(\d+)\.(.+)")


def check(cfg: dict) -> None:
    if cfg.get("quantization_config"):
        raise UnsupportedCheckpointError(
            f"quantized Qwen checkpoint (quantization_config={cfg['quantization_config'].get('quant_method')!r}) "
            f"cannot be converted exactly; use the floating-point checkpoint")
    if cfg.get("rotary_pct", 1.0) != 1.0:
        raise UnsupportedCheckpointError(f"rotary_pct={cfg['rotary_pct']}: only full-width rotary (1.0) maps to Qwen2")
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg.get("kv_channels", head_dim) != head_dim:
        raise UnsupportedCheckpointError(f"kv_channels={cfg['kv_channels']} differs from hidden_size/heads={head_dim}")
    if not cfg.get("no_bias", True):
        raise UnsupportedCheckpointError("no_bias=false: Qwen2 has no bias on c_proj, w1 or w2")


def native_config(cfg: dict, eos: list[int], pad: int | None) -> Qwen2Config:
    seq_length = cfg["seq_length"]
    log.warning("Qwen(1): context capped at seq_length=%d (max_position_embeddings=%d in the source): its dynamic "
                "NTK and logn attention scaling past that have no native equivalent", seq_length,
                cfg.get("max_position_embeddings", seq_length))
    return Qwen2Config(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"] // 2,
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_attention_heads"],
        max_position_embeddings=seq_length,
        rms_norm_eps=cfg["layer_norm_epsilon"],
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rotary_emb_base", 10000))},
        tie_word_embeddings=False,
        use_sliding_window=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def rename(name: str, tensor: torch.Tensor, cfg: dict) -> list[tuple[str, torch.Tensor]]:
    if name in _RENAMES:
        return [(_RENAMES[name], tensor)]
    m = _LAYER.fullmatch(name)
    if m is None:
        if name.endswith("rotary_emb.inv_freq"):  # recomputed from rotary_emb_base
            return []
        raise UnsupportedCheckpointError(f"unexpected tensor {name!r} in a Qwen(1) checkpoint")
    prefix, rest = f"model.layers.{m.group(1)}", m.group(2)
    if rest in _LAYER_RENAMES:
        return [(f"{prefix}.{_LAYER_RENAMES[rest]}", tensor)]
    if rest in ("attn.c_attn.weight", "attn.c_attn.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = tensor.split(cfg["hidden_size"], dim=0)  # rows [q | k | v], each heads * head_dim
        return [(f"{prefix}.self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    if rest.endswith("rotary_emb.inv_freq"):
        return []
    raise UnsupportedCheckpointError(f"unexpected tensor {name!r} in a Qwen(1) checkpoint")
