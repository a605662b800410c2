"""Read a checkpoint's weights shard by shard, and write renamed tensors back out in bounded memory.

A *source shard* is one weight file of the legacy checkpoint (`*.safetensors` or `pytorch_model*.bin`);
an *output shard* is one safetensors file of the converted checkpoint. Output shards are cut at
`max_shard_bytes`, so memory stays bounded by one source shard (`.bin`, memory-mapped) or one output
shard (safetensors, read a tensor at a time), whatever the model's size.
"""

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


class UnsupportedCheckpointError(ValueError):
    """The checkpoint cannot be converted exactly (P-tuning prefix, quantized weights, unknown tensor...)."""


def weight_files(src: Path) -> list[Path]:
    """The source shards, in index order when there is an index; safetensors preferred over `.bin`."""
    for index, pattern in (("model.safetensors.index.json", "*.safetensors"),
                           ("pytorch_model.bin.index.json", "pytorch_model*.bin")):
        if (src / index).is_file():
            weight_map = json.loads((src / index).read_text())["weight_map"]
            return [src / name for name in dict.fromkeys(weight_map.values())]
        files = sorted(src.glob(pattern))
        if files:
            return files
    raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {src}")


def read_shard(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    try:  # mmap keeps a multi-GB shard out of RAM; files from before torch 1.6's zip format cannot be mapped
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        state = torch.load(path, map_location="cpu", weights_only=True)
    yield from state.items()
    del state


class ShardWriter:
    """Collects tensors and writes `model-0000N.safetensors` files plus an index (or one `model.safetensors`)."""

    def __init__(self, dst: Path, max_shard_bytes: int = 2 << 30):
        self.dst = dst
        self.max_shard_bytes = max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[str] = []
        self.weight_map: dict[str, str] = {}
        self.dtypes: set[torch.dtype] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.weight_map or name in self.pending:
            raise UnsupportedCheckpointError(f"tensor {name!r} is produced twice")
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()  # a split view of a fused tensor becomes its own storage
        self.pending_bytes += size
        self.total_bytes += size
        self.dtypes.add(tensor.dtype)

    def _flush(self) -> None:
        filename = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(self.dst / filename), metadata={"format": "pt"})
        self.files.append(filename)
        self.weight_map.update(dict.fromkeys(self.pending, filename))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> set[str]:
        """Write what is left, then the index; return the names written."""
        if self.pending or not self.files:
            self._flush()
        if len(self.files) == 1:
            os.replace(self.dst / self.files[0], self.dst / "model.safetensors")
        else:
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(self.weight_map.items()))}
            (self.dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return set(self.weight_map)


def stream(src: Path, writer: ShardWriter, rename: Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]],
           progress: Callable[[str], None]) -> None:
    """Feed every source tensor through `rename` into `writer`, one source shard at a time."""
    files = weight_files(src)
    for i, path in enumerate(files, start=1):
        progress(f"[{i}/{len(files)}] {path.name} ({path.stat().st_size / 1e9:.2f} GB)")
        for name, tensor in read_shard(path):
            if not tensor.is_floating_point():
                raise UnsupportedCheckpointError(
                    f"{path.name}: tensor {name!r} is {tensor.dtype}: a quantized checkpoint cannot be converted "
                    f"exactly; convert the original floating-point checkpoint instead")
            for new_name, new_tensor in rename(name, tensor):
                writer.add(new_name, new_tensor)
