"""Qwen(1) -> Qwen2ForCausalLM: the same logits as Qwen(1)'s own architecture, and its limits stated."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead.model.convert import UnsupportedCheckpointError, convert, qwen1

from tests.lookahead.model.convert.conftest import make_converted
from tests.lookahead.model.convert.legacy_reference import qwen1_forward


def logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids[None]).logits[0]


def random_ids(cfg, n=48, seed=1):
    return torch.randint(0, cfg["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fmt", ["safetensors", "bin-sharded"])
def test_logits_equal_the_legacy_reference(tmp_path, fmt, converted):
    c = converted["qwen1"] if fmt == "safetensors" else make_converted(tmp_path, "qwen1", fmt)
    ids = random_ids(c.cfg)
    want = qwen1_forward(c.state, c.cfg, ids)
    got = logits(c.dst, ids)
    assert (got - want).abs().max() < 1e-4
    assert want.std() > 1  # logits far from flat: a misplaced tensor could not hide under the tolerance


def test_a_swapped_gate_is_caught_by_the_reference(tmp_path, monkeypatch, converted):
    """The oracle has teeth: mapping w1 (up) as the gate, the classic mistake, moves the logits far."""
    c = converted["qwen1"]
    renames = {**qwen1._LAYER_RENAMES, "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w2.weight": "mlp.up_proj.weight"}
    monkeypatch.setattr(qwen1, "_LAYER_RENAMES", renames)
    wrong = convert("qwen1", c.src, tmp_path / "wrong", progress=lambda m: None)
    ids = random_ids(c.cfg)
    assert (logits(wrong, ids) - qwen1_forward(c.state, c.cfg, ids)).abs().max() > 1


def test_native_config_keeps_the_pitfalls(converted):
    c = converted["qwen1"]
    cfg = json.loads((c.dst / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["intermediate_size"] == c.cfg["intermediate_size"] // 2
    assert cfg["vocab_size"] == c.cfg["vocab_size"]  # the padded vocab, not the tokenizer's
    assert cfg["tie_word_embeddings"] is False
    assert cfg["rope_parameters"]["rope_theta"] == c.cfg["rotary_emb_base"]
    assert "auto_map" not in cfg  # nothing left pointing at remote code


def test_context_is_capped_at_seq_length_and_said(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        c = make_converted(tmp_path, "qwen1", seq_length=300, max_position_embeddings=8192)
    assert json.loads((c.dst / "config.json").read_text())["max_position_embeddings"] == 300
    assert "seq_length=300" in caplog.text and "dynamic NTK" in caplog.text


@pytest.mark.parametrize("override, message", [
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantized"),
    ({"rotary_pct": 0.5}, "rotary_pct"),
    ({"no_bias": False}, "no_bias"),
])
def test_unconvertible_configs_are_refused_by_name(tmp_path, override, message):
    with pytest.raises(UnsupportedCheckpointError, match=message):
        make_converted(tmp_path, "qwen1", **override)
    assert not list(tmp_path.glob("*native*"))  # nothing half-written left behind
