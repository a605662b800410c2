"""The CLI end to end: a legacy folder becomes one that transformers loads with no remote code."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from lookahead.model.convert import UnsupportedCheckpointError, convert
from lookahead.model.convert.__main__ import main

from tests.lookahead.model.convert.legacy_checkpoints import legacy_qwen1


def test_cli_converts_with_progress_and_loads_without_remote_code(tmp_path, capsys):
    legacy_qwen1(tmp_path / "src", "safetensors-sharded")
    assert main(["qwen1", str(tmp_path / "src"), str(tmp_path / "dst")]) == 0
    err = capsys.readouterr().err
    assert "[1/3] model-00001-of-00003.safetensors" in err and "[3/3]" in err and "done:" in err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "dst", trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(tmp_path / "dst", trust_remote_code=False)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tok("hello")["input_ids"]
    assert json.loads((tmp_path / "dst" / "generation_config.json").read_text())["eos_token_id"] == \
        tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert not list(tmp_path.glob("dst.tmp*"))


def test_cli_reports_errors_in_one_line(tmp_path, capsys):
    legacy_qwen1(tmp_path / "src", quantization_config={"quant_method": "gptq"})
    assert main(["qwen1", str(tmp_path / "src"), str(tmp_path / "dst")]) == 2
    assert capsys.readouterr().err.startswith("error: quantized Qwen checkpoint")


def test_wrong_family_and_busy_destination_are_refused(tmp_path):
    legacy_qwen1(tmp_path / "src")
    with pytest.raises(UnsupportedCheckpointError, match="model_type='qwen'; chatglm3 needs 'chatglm'"):
        convert("chatglm3", tmp_path / "src", tmp_path / "dst")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        convert("qwen1", tmp_path / "src", tmp_path / "dst")


def test_a_missing_tensor_is_an_error_not_a_random_init(tmp_path):
    cfg, state = legacy_qwen1(tmp_path / "src")
    from safetensors.torch import save_file

    del state["transformer.h.1.mlp.w2.weight"]
    save_file(state, str(tmp_path / "src" / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpointError, match="missing \\['model.layers.1.mlp.gate_proj.weight'\\]"):
        convert("qwen1", tmp_path / "src", tmp_path / "dst", progress=lambda m: None)
    assert not (tmp_path / "dst").exists()
