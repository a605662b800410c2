"""One legacy checkpoint folder -> one native transformers folder: config, weights, tokenizer, stop tokens.

The result is written to a temporary sibling and renamed into place at the end, so `dst` either does not
exist or holds a complete conversion. Every tensor the native model expects must be produced exactly
once; anything else in the source is an error, never silently dropped.
"""

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from lookahead.model.convert.checkpoint import ShardWriter, UnsupportedCheckpointError, stream
from lookahead.model.convert.families import FAMILIES, Family


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop_ids(family: Family, tokenizer) -> tuple[list[int], int | None]:
    """(eos ids, pad id) from the converted tokenizer, or the family's published ids without one."""
    if tokenizer is None:
        return list(family.arch.PUBLISHED_EOS), family.arch.PUBLISHED_PAD
    return [tokenizer.convert_tokens_to_ids(t) for t in family.tokenizer.EOS], tokenizer.pad_token_id


def expected_tensors(config) -> set[str]:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return set(model.state_dict())


def convert(family: str | Family, src: str | Path, dst: str | Path,
            progress: Callable[[str], None] = stderr_progress, max_shard_bytes: int = 2 << 30) -> Path:
    family = FAMILIES[family] if isinstance(family, str) else family
    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("model_type") != family.model_type:
        raise UnsupportedCheckpointError(
            f"{src / 'config.json'} has model_type={cfg.get('model_type')!r}; "
            f"{family.name} needs {family.model_type!r}")
    family.check(cfg)
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} exists and is not empty")

    tokenizer = family.tokenizer.build(src, model_max_length=cfg["seq_length"])
    eos, pad = stop_ids(family, tokenizer)
    config = family.arch.native_config(cfg, eos, pad)
    if max(eos) >= config.vocab_size:
        raise UnsupportedCheckpointError(f"eos ids {eos} do not fit vocab_size={config.vocab_size}")
    progress(f"{family.name}: {src} -> {family.native} in {dst}")

    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        writer = ShardWriter(tmp, max_shard_bytes)
        stream(src, writer, lambda name, t: family.arch.rename(name, t, cfg), progress)
        written = writer.close()
        expected = expected_tensors(config)
        if written != expected:
            raise UnsupportedCheckpointError(
                f"converted tensors differ from {family.native}'s: missing {sorted(expected - written)[:5]}, "
                f"unexpected {sorted(written - expected)[:5]}")
        if len(writer.dtypes) == 1:
            config.dtype = next(iter(writer.dtypes))
        config.architectures = [family.native]
        config.save_pretrained(tmp)
        GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=config.bos_token_id).save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        else:
            progress(f"no tokenizer file in {src}: converted the weights only")
        if dst.exists():
            dst.rmdir()  # empty, checked above
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"done: {writer.total_bytes / 1e9:.2f} GB in {len(writer.files)} shard(s)")
    return dst
