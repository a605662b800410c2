"""load_model() on a legacy checkpoint folder converts it once into the model cache, then reuses it."""

import json

import pytest

from lookahead.model import models
from lookahead.model.convert.cache import converted_folder, fingerprint

from tests.lookahead.model.convert.legacy_checkpoints import legacy_chatglm3, legacy_qwen1


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("family, build, native", [("qwen1", legacy_qwen1, "Qwen2ForCausalLM"),
                                                    ("chatglm3", legacy_chatglm3, "GlmForCausalLM")])
def test_legacy_folder_loads_natively_through_the_cache(tmp_path, cache, family, build, native):
    build(tmp_path / "src", "bin-sharded")
    lm = models.load_model(str(tmp_path / "src"), dtype="float32", device="cpu")
    assert type(lm.model).__name__ == native
    assert lm.path == str(cache / "converted" / family / fingerprint(tmp_path / "src"))
    gen = json.loads((models.Path(lm.path) / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) <= set(lm.eos_token_ids)  # the family's stop tokens reach the engine
    stamp = next((cache / "converted" / family).glob("*/model.safetensors")).stat().st_mtime_ns
    assert models.resolve_path(str(tmp_path / "src")) == lm.path  # second load: no re-conversion
    assert next((cache / "converted" / family).glob("*/model.safetensors")).stat().st_mtime_ns == stamp


def test_a_changed_checkpoint_converts_again(tmp_path, cache):
    legacy_qwen1(tmp_path / "src")
    first = converted_folder(str(tmp_path / "src"), cache)
    legacy_qwen1(tmp_path / "src", seed=1, seq_length=256)
    assert converted_folder(str(tmp_path / "src"), cache) != first


def test_native_and_non_folder_specs_pass_through(tmp_path, cache):
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert converted_folder(str(tmp_path / "native"), cache) is None
    assert converted_folder("not-a-folder", cache) is None
    assert not cache.exists()


def test_a_hub_id_already_in_the_hf_cache_converts_without_network(tmp_path, cache, monkeypatch):
    """`Qwen/Qwen-14B-Chat` itself works as a spec: its cached snapshot is found and converted offline."""
    import huggingface_hub

    hub = tmp_path / "hub"
    snapshot = hub / "models--Qwen--Qwen-Tiny-Chat" / "snapshots" / "0123abcd"
    legacy_qwen1(snapshot)
    (hub / "models--Qwen--Qwen-Tiny-Chat" / "refs").mkdir()
    (hub / "models--Qwen--Qwen-Tiny-Chat" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", None)  # any network call would fail loudly
    monkeypatch.setattr(huggingface_hub, "snapshot_download", None)
    assert converted_folder("Qwen/Qwen-Tiny-Chat", cache) == cache / "qwen1" / fingerprint(snapshot)
