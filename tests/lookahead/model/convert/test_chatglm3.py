"""ChatGLM3 -> GlmForCausalLM: the same logits as ChatGLM3's own architecture; P-tuning and quantized refused."""

import json

import pytest
import torch
from safetensors.torch import save_file

from lookahead.model.convert import UnsupportedCheckpointError, chatglm3, convert

from tests.lookahead.model.convert.conftest import make_converted
from tests.lookahead.model.convert.legacy_reference import chatglm3_forward
from tests.lookahead.model.convert.test_qwen1 import logits


def random_ids(cfg, n=48, seed=1):
    return torch.randint(0, cfg["padded_vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fmt", ["safetensors", "bin-sharded"])
def test_logits_equal_the_legacy_reference(tmp_path, fmt, converted):
    c = converted["chatglm3"] if fmt == "safetensors" else make_converted(tmp_path, "chatglm3", fmt)
    ids = random_ids(c.cfg)
    want = chatglm3_forward(c.state, c.cfg, ids)
    got = logits(c.dst, ids)
    assert (got - want).abs().max() < 1e-4
    assert want.std() > 1


def test_query_key_value_split_is_checked_by_the_reference(tmp_path, monkeypatch, converted):
    """The oracle has teeth: k and v swapped inside the fused projection moves the logits far."""
    c = converted["chatglm3"]
    real = chatglm3.rename

    def swap_kv(name, tensor, cfg):
        out = real(name, tensor, cfg)
        if "query_key_value" in name:
            (q, tq), (k, tk), (v, tv) = out
            return [(q, tq), (k, tv), (v, tk)]
        return out

    monkeypatch.setattr(chatglm3, "rename", swap_kv)
    wrong = convert("chatglm3", c.src, tmp_path / "wrong", progress=lambda m: None)
    ids = random_ids(c.cfg)
    assert (logits(wrong, ids) - chatglm3_forward(c.state, c.cfg, ids)).abs().max() > 1


def test_native_config_keeps_the_pitfalls(converted):
    c = converted["chatglm3"]
    cfg = json.loads((c.dst / "config.json").read_text())
    gen = json.loads((c.dst / "generation_config.json").read_text())
    n = 400  # pieces in the synthetic SentencePiece model; ChatGLM3's real one has 64789
    assert cfg["architectures"] == ["GlmForCausalLM"]
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["pad_token_id"] == 0
    assert cfg["rope_parameters"]["rope_theta"] == 10000 * c.cfg["rope_ratio"]
    assert cfg["rope_parameters"]["partial_rotary_factor"] == 0.5
    assert cfg["num_key_value_heads"] == c.cfg["multi_query_group_num"]
    # </s>, <|user|>, <|observation|>: [2, 64795, 64797] on the real vocab.
    assert cfg["eos_token_id"] == gen["eos_token_id"] == [2, n + 6, n + 8]


def test_published_stop_ids_without_a_tokenizer():
    from lookahead.model.convert.converter import stop_ids
    from lookahead.model.convert.families import FAMILIES

    assert stop_ids(FAMILIES["chatglm3"], None) == ([2, 64795, 64797], 0)
    assert stop_ids(FAMILIES["qwen1"], None) == ([151643, 151645], 151643)


@pytest.mark.parametrize("override, message", [
    ({"pre_seq_len": 128}, "P-tuning"),
    ({"quantization_bit": 4}, "quantized"),
    ({"add_bias_linear": True}, "add_bias_linear"),
])
def test_unconvertible_configs_are_refused_by_name(tmp_path, override, message):
    with pytest.raises(UnsupportedCheckpointError, match=message):
        make_converted(tmp_path, "chatglm3", **override)


def test_a_prefix_encoder_is_refused_even_without_pre_seq_len(tmp_path, converted):
    src = tmp_path / "ptuned"
    src.mkdir()
    for name in ("config.json", "tokenizer.model"):
        (src / name).write_bytes((converted["chatglm3"].src / name).read_bytes())
    state = dict(converted["chatglm3"].state)
    state["transformer.prefix_encoder.embedding.weight"] = torch.zeros(4, 32)
    save_file(state, str(src / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpointError, match="P-tuning"):
        convert("chatglm3", src, tmp_path / "out", progress=lambda m: None)
    assert not (tmp_path / "out").exists()
