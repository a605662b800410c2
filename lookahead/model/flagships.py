"""The models users run, by their checkpoints' own config.json (shipped in checkpoint_configs/): the one table of
shapes for whatever is sized or built at a real model's shape without its weights. triton_build compiles the
kernels at these shapes, the GPU check builds its random-weight models from them, and the KV arithmetic's tests
size pools and weights by them.

A legacy checkpoint's config (Qwen-14B-Chat, ChatGLM3-6B) goes through its family's converter, as serving
converts the checkpoint itself, so a shape here is the native model the engine runs. Linear layers are read off
the model built on the meta device (nothing allocated), not restated.
"""

import json
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

CONFIGS = Path(__file__).with_name("checkpoint_configs")
FLAGSHIPS = {  # name -> its checkpoint's config.json
    "SmolLM2-135M": "smollm2-135m-instruct.config.json",  # HuggingFaceTB/SmolLM2-135M-Instruct, the default
    "Qwen2-7B": "qwen2-7b-instruct.config.json",  # Qwen/Qwen2-7B-Instruct
    "Qwen-14B": "qwen-14b-chat.config.json",  # Qwen/Qwen-14B-Chat (legacy: converted)
    "ChatGLM3-6B": "chatglm3-6b.config.json",  # THUDM/chatglm3-6b (legacy: converted)
}


def source(name: str) -> dict:
    """The checkpoint's config.json as published."""
    return json.loads((CONFIGS / FLAGSHIPS[name]).read_text())


def native(name: str):
    """The transformers config of the model the engine runs: a legacy family's through its converter."""
    from transformers import AutoConfig

    from lookahead.model.convert.families import FAMILIES

    cfg = source(name)
    family = next((f for f in FAMILIES.values() if f.model_type == cfg["model_type"]), None)
    if family is None:
        return AutoConfig.for_model(**cfg)
    converter = logging.getLogger(family.arch.__name__)  # (its warnings are a conversion's: nothing is served here)
    level = converter.level
    converter.setLevel(logging.ERROR)
    try:
        return family.arch.native_config(cfg, list(family.arch.PUBLISHED_EOS), family.arch.PUBLISHED_PAD)
    finally:
        converter.setLevel(level)


@dataclass(frozen=True)
class Linear:
    """One distinct linear layer shape of a model: weight [out, in], and whether it adds a bias."""

    out_features: int
    in_features: int
    bias: bool


@dataclass(frozen=True)
class Shape:
    """What a model's shape gives the kernels."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    linears: tuple[Linear, ...]  # the distinct shapes of one decoder layer's linears and the LM head


@cache
def shape(name: str) -> Shape:
    """`name`'s shape, its linears read off the model with one layer, built on the meta device."""
    from transformers import AutoModelForCausalLM

    config = native(name)
    layers = config.num_hidden_layers
    config.num_hidden_layers = 1
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    seen = {Linear(m.out_features, m.in_features, m.bias is not None): None for m in model.modules()
            if isinstance(m, torch.nn.Linear)}
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Shape(layers, heads, config.num_key_value_heads, head_dim, tuple(seen))


def qwen2_layout(name: str) -> dict:
    """The Qwen2Config fields of `name`'s decoder (a Qwen2 layout: the GPU check's random-weight stand-ins)."""
    config = native(name)
    return {k: getattr(config, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "max_position_embeddings")}
