"""The flagship shapes table: the shipped config.json files are the models the engine runs. The default's agrees
with the GGUF the server loads; the legacy ones go through their converters, whose layouts the linears show."""

from transformers import AutoConfig

from lookahead.model import flagships
from lookahead.model.flagships import FLAGSHIPS, Linear
from lookahead.model.models import alias_gguf

FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "tie_word_embeddings")


def test_the_default_models_config_is_the_shipped_ggufs():
    gguf = alias_gguf("smollm2-135m-instruct")
    loaded = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)  # (the metadata only: no weights)
    shipped = flagships.native("SmolLM2-135M")
    assert loaded.model_type == shipped.model_type
    assert {k: getattr(loaded, k) for k in FIELDS} == {k: getattr(shipped, k) for k in FIELDS}


def test_every_flagship_builds_on_the_meta_device_with_whole_heads():
    for name in FLAGSHIPS:
        shape = flagships.shape(name)
        assert shape.layers > 0 and shape.heads % shape.kv_heads == 0, name
        assert len(set(shape.linears)) == len(shape.linears) and shape.linears, name


def test_qwen14b_is_served_as_a_qwen2_layout_with_its_qkv_bias_and_halved_mlp():
    """Qwen(1) packs w1 and w2 into one intermediate_size (27,392) and has a bias on c_attn only."""
    assert flagships.source("Qwen-14B")["intermediate_size"] == 27392
    shape = flagships.shape("Qwen-14B")
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (40, 40, 128)
    assert Linear(5120, 5120, True) in shape.linears and Linear(5120, 5120, False) in shape.linears  # q, o
    assert Linear(13696, 5120, False) in shape.linears and Linear(5120, 13696, False) in shape.linears
    assert flagships.qwen2_layout("Qwen-14B")["intermediate_size"] == 13696


def test_chatglm3_keeps_its_two_kv_groups_and_fused_gate_up():
    shape = flagships.shape("ChatGLM3-6B")
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (28, 32, 2, 128)
    assert Linear(2 * 13696, 4096, False) in shape.linears and Linear(256, 4096, True) in shape.linears  # k_proj
    assert Linear(65024, 4096, False) in shape.linears  # the LM head
