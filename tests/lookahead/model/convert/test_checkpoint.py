"""Source shards are found in index order and read whole; output shards are cut at the size bound."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lookahead.model.convert.checkpoint import ShardWriter, UnsupportedCheckpointError, stream, weight_files


def test_index_order_and_safetensors_preferred(tmp_path):
    torch.save({"a": torch.ones(1)}, tmp_path / "pytorch_model-00002-of-00002.bin")
    torch.save({"b": torch.ones(1)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {"a": "pytorch_model-00002-of-00002.bin", "b": "pytorch_model-00001-of-00002.bin"}}))
    assert [p.name for p in weight_files(tmp_path)] == ["pytorch_model-00002-of-00002.bin",
                                                         "pytorch_model-00001-of-00002.bin"]
    save_file({"a": torch.ones(1)}, str(tmp_path / "model.safetensors"))
    assert [p.name for p in weight_files(tmp_path)] == ["model.safetensors"]


def test_no_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors or pytorch_model\\*.bin"):
        weight_files(tmp_path)


def test_output_shards_are_cut_at_the_bound_and_indexed(tmp_path):
    writer = ShardWriter(tmp_path, max_shard_bytes=100)
    for i in range(5):
        writer.add(f"t{i}", torch.full((10,), float(i)))  # 40 bytes each: two per shard
    assert writer.close() == {f"t{i}" for i in range(5)}
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001.safetensors", "model-00002.safetensors",
                                                         "model-00003.safetensors"]
    assert index["metadata"]["total_size"] == 200
    assert load_file(str(tmp_path / index["weight_map"]["t4"]))["t4"].tolist() == [4.0] * 10


def test_one_shard_is_a_plain_model_safetensors(tmp_path):
    writer = ShardWriter(tmp_path)
    writer.add("w", torch.zeros(2, 2)[:, 0])  # a strided view is written as its own contiguous tensor
    writer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_int_weights_are_refused_as_quantized(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"transformer.h.0.attn.c_attn.qweight": torch.zeros(4, dtype=torch.int32)}, src / "pytorch_model.bin")
    (tmp_path / "dst").mkdir()
    with pytest.raises(UnsupportedCheckpointError, match="int32: a quantized checkpoint"):
        stream(src, ShardWriter(tmp_path / "dst"), lambda name, t: [(name, t)], progress=lambda m: None)
