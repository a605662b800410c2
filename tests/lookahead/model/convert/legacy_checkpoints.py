"""Tiny random checkpoints in the legacy Qwen(1) and ChatGLM3 formats, written the ways they ship."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.lookahead.model.convert.vocab_files import write_qwen_tiktoken, write_sentencepiece

QWEN1_SPECIALS = 208
CHATGLM3_SPECIALS = 9


def qwen1_config(vocab_size: int, **overrides) -> dict:
    return {"model_type": "qwen", "architectures": ["QWenLMHeadModel"],
            "auto_map": {"AutoModelForCausalLM": "modeling_qwen.QWenLMHeadModel"},
            "vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "kv_channels": 8, "intermediate_size": 128, "layer_norm_epsilon": 1e-6, "rotary_emb_base": 5000,
            "rotary_pct": 1.0, "seq_length": 512, "max_position_embeddings": 8192, "use_dynamic_ntk": True,
            "use_logn_attn": True, "no_bias": True, "tie_word_embeddings": False, "bf16": False, "fp32": True,
            **overrides}


def chatglm3_config(vocab_size: int, **overrides) -> dict:
    return {"model_type": "chatglm", "architectures": ["ChatGLMModel"],
            "auto_map": {"AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration"},
            "padded_vocab_size": vocab_size, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4,
            "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 48,
            "seq_length": 512, "layernorm_epsilon": 1e-5, "rope_ratio": 3, "rmsnorm": True, "add_bias_linear": False,
            "add_qkv_bias": True, "post_layer_norm": True, "apply_residual_connection_post_layernorm": False,
            "original_rope": True, "quantization_bit": 0, "pre_seq_len": None, "prefix_projection": False,
            "eos_token_id": 2, "pad_token_id": 0, **overrides}


def _shapes(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    if family == "qwen1":
        H, V, I2 = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"] // 2
        shapes = {"transformer.wte.weight": (V, H), "transformer.ln_f.weight": (H,), "lm_head.weight": (V, H)}
        for i in range(cfg["num_hidden_layers"]):
            p = f"transformer.h.{i}."
            shapes |= {p + "ln_1.weight": (H,), p + "attn.c_attn.weight": (3 * H, H), p + "attn.c_attn.bias": (3 * H,),
                       p + "attn.c_proj.weight": (H, H), p + "ln_2.weight": (H,), p + "mlp.w1.weight": (I2, H),
                       p + "mlp.w2.weight": (I2, H), p + "mlp.c_proj.weight": (H, I2)}
        return shapes
    H, V, F, hd = cfg["hidden_size"], cfg["padded_vocab_size"], cfg["ffn_hidden_size"], cfg["kv_channels"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["multi_query_group_num"]) * hd
    shapes = {"transformer.embedding.word_embeddings.weight": (V, H), "transformer.rotary_pos_emb.inv_freq": (hd // 4,),
              "transformer.encoder.final_layernorm.weight": (H,), "transformer.output_layer.weight": (V, H)}
    for i in range(cfg["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "self_attention.query_key_value.weight": (qkv, H),
                   p + "self_attention.query_key_value.bias": (qkv,), p + "self_attention.dense.weight": (H, H),
                   p + "post_attention_layernorm.weight": (H,), p + "mlp.dense_h_to_4h.weight": (2 * F, H),
                   p + "mlp.dense_4h_to_h.weight": (H, F)}
    return shapes


def random_state(family: str, cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights; norms away from 1 and biases away from 0, so a misplaced tensor changes the logits."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in _shapes(family, cfg).items():
        if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            state[name] = 1 + 0.2 * torch.randn(shape, generator=g)
        elif "wte" in name or "word_embeddings" in name:
            state[name] = torch.randn(shape, generator=g)
        elif "lm_head" in name or "output_layer" in name:
            # A sharp head makes greedy text repeat, as real text does, so lookahead drafts get accepted.
            state[name] = 2.0 * torch.randn(shape, generator=g)
        else:
            state[name] = 0.2 * torch.randn(shape, generator=g)
    return state


def write_checkpoint(folder: Path, cfg: dict, state: dict[str, torch.Tensor], fmt: str) -> Path:
    """fmt: `safetensors` (one file), `safetensors-sharded` or `bin-sharded` (3 shards and an index)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if fmt == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
        return folder
    names = list(state)
    shards = [names[i::3] for i in range(3)]  # interleaved: a layer's tensors land in different shards
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        if fmt == "safetensors-sharded":
            filename = f"model-{i:05d}-of-00003.safetensors"
            save_file({n: state[n] for n in shard}, str(folder / filename))
        else:
            filename = f"pytorch_model-{i:05d}-of-00003.bin"
            torch.save({n: state[n] for n in shard}, folder / filename)
        weight_map |= dict.fromkeys(shard, filename)
    index = "model.safetensors.index.json" if fmt == "safetensors-sharded" else "pytorch_model.bin.index.json"
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _padded(n: int) -> int:
    return (n + 63) // 64 * 64


def legacy_qwen1(folder: Path, fmt: str = "safetensors", seed: int = 0, **overrides) -> tuple[dict, dict]:
    """A tiny Qwen(1) checkpoint with a synthetic `qwen.tiktoken`; returns (config, legacy state)."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = write_qwen_tiktoken(folder)
    cfg = qwen1_config(_padded(len(ranks) + QWEN1_SPECIALS), **overrides)
    state = random_state("qwen1", cfg, seed)
    write_checkpoint(folder, cfg, state, fmt)
    return cfg, state


def legacy_chatglm3(folder: Path, fmt: str = "safetensors", seed: int = 0, **overrides) -> tuple[dict, dict]:
    """A tiny ChatGLM3 checkpoint with a trained SentencePiece `tokenizer.model`; returns (config, legacy state)."""
    folder.mkdir(parents=True, exist_ok=True)
    pieces = write_sentencepiece(folder)
    cfg = chatglm3_config(_padded(pieces + CHATGLM3_SPECIALS), **overrides)
    state = random_state("chatglm3", cfg, seed)
    write_checkpoint(folder, cfg, state, fmt)
    return cfg, state
