"""Tiny randomly initialised decoders of the families users run: losslessness needs no trained weights."""

import torch
import transformers as tf

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

FAMILIES = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 8}),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {"sliding_window": None}),
    "glm": (tf.GlmConfig, tf.GlmForCausalLM, {"partial_rotary_factor": 0.5, "head_dim": 8, "pad_token_id": 0,
                                              "eos_token_id": 2, "bos_token_id": 1}),
}


def tiny(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = config_cls(**{**COMMON, **extra, **overrides})
    model = model_cls(cfg).eval()
    # Random weights barely prefer any token; a sharper head makes outputs repeat like real text does,
    # so drafts get accepted and the tree path is really exercised.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model
