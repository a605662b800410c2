"""ChatGLM3 (`model_type: chatglm`, `ChatGLMForConditionalGeneration`) -> transformers' native `GlmForCausalLM`.

ChatGLM3 is GLM-4's layer stack, so the mapping is mostly renames:
- `self_attention.query_key_value` rows are `[q (heads * head_dim) | k (groups * head_dim) | v (groups *
  head_dim)]` with bias, where `groups` is `multi_query_group_num` (grouped-query attention);
- `mlp.dense_h_to_4h` is `[gate | up]` already, exactly Glm's `gate_up_proj`;
- rotary covers the first half of each head, on interleaved pairs, with base `10000 * rope_ratio`:
  `partial_rotary_factor=0.5`, which is what Glm does natively;
- Glm's default `rms_norm_eps` differs, so ChatGLM3's `layernorm_epsilon` (1e-5) is written explicitly.
P-tuning checkpoints (`pre_seq_len`, a `prefix_encoder`) prepend learned key/value prefixes that Glm has no
place for, and quantized ones (`quantization_bit`) hold int weights: both are refused.
"""

import re

import torch
from transformers import GlmConfig

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError

MODEL_TYPE = "chatglm"
# ChatGLM3's published ids: </s>, <|user|>, <|observation|>; pad is <unk>. The tokenizer's, when present, win.
PUBLISHED_EOS = [2, 64795, 64797]
PUBLISHED_PAD = 0

_RENAMES = {
    "transformer.embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "transformer.encoder.final_layernorm.weight": "model.norm.weight",
    "transformer.output_layer.weight": "lm_head.weight",
}
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.dense.weight": "self_attn.o_proj.weight",
    "mlp.dense_h_to_4h.weight": "mlp.gate_up_proj.weight",
    "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight",
}
_LAYER = re.compile(r"transformer\.encoder\.layers\.(\d+)\.(.+)")
# Layouts ChatGLM3 never ships and Glm cannot express: (config key, the only value Glm matches).
_FIXED = [("add_bias_linear", False), ("rmsnorm", True), ("post_layer_norm", True),
          ("apply_residual_connection_post_layernorm", False), ("original_rope", True)]


def head_dim(cfg: dict) -> int:
    return cfg.get("kv_channels") or cfg["hidden_size"] // cfg["num_attention_heads"]


def groups(cfg: dict) -> int:
    return cfg["multi_query_group_num"] if cfg.get("multi_query_attention") else cfg["num_attention_heads"]


def check(cfg: dict) -> None:
    if cfg.get("pre_seq_len"):
        raise UnsupportedCheckpointError(
            f"P-tuning checkpoint (pre_seq_len={cfg['pre_seq_len']}): its learned prefix has no native "
            f"equivalent; convert the base ChatGLM3 checkpoint")
    if cfg.get("quantization_bit"):
        raise UnsupportedCheckpointError(
            f"quantized ChatGLM3 checkpoint (quantization_bit={cfg['quantization_bit']}) cannot be converted "
            f"exactly; convert the floating-point checkpoint")
    for key, value in _FIXED:
        if cfg.get(key, value) != value:
            raise UnsupportedCheckpointError(f"{key}={cfg[key]!r}: Glm only matches {key}={value!r}")


def native_config(cfg: dict, eos: list[int], pad: int | None) -> GlmConfig:
    return GlmConfig(
        vocab_size=cfg["padded_vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["ffn_hidden_size"],
        num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=groups(cfg),
        head_dim=head_dim(cfg),
        max_position_embeddings=cfg["seq_length"],
        rms_norm_eps=cfg.get("layernorm_epsilon", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0 * cfg.get("rope_ratio", 1),
                         "partial_rotary_factor": 0.5},
        attention_bias=cfg.get("add_qkv_bias", False),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def rename(name: str, tensor: torch.Tensor, cfg: dict) -> list[tuple[str, torch.Tensor]]:
    if name in _RENAMES:
        return [(_RENAMES[name], tensor)]
    if name.startswith("transformer.prefix_encoder."):
        raise UnsupportedCheckpointError(f"P-tuning checkpoint ({name!r}): convert the base ChatGLM3 checkpoint")
    if name == "transformer.rotary_pos_emb.inv_freq":  # unused by ChatGLM3 itself: it recomputes with rope_ratio
        return []
    m = _LAYER.fullmatch(name)
    if m is None:
        raise UnsupportedCheckpointError(f"unexpected tensor {name!r} in a ChatGLM3 checkpoint")
    prefix, rest = f"model.layers.{m.group(1)}", m.group(2)
    if rest in _LAYER_RENAMES:
        return [(f"{prefix}.{_LAYER_RENAMES[rest]}", tensor)]
    if rest in ("self_attention.query_key_value.weight", "self_attention.query_key_value.bias"):
        kind = rest.rsplit(".", 1)[1]
        q_rows, kv_rows = cfg["num_attention_heads"] * head_dim(cfg), groups(cfg) * head_dim(cfg)
        q, k, v = tensor.split([q_rows, kv_rows, kv_rows], dim=0)
        return [(f"{prefix}.self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    raise UnsupportedCheckpointError(f"unexpected tensor {name!r} in a ChatGLM3 checkpoint")
