"""Convert a legacy checkpoint on first load, into the model cache; later loads reuse the conversion.

The cache entry is keyed by a fingerprint of the source (its config, and the names, sizes and times of its
weight and tokenizer files) and of the converter's output format, so a changed checkpoint or a converter
fix converts again, and an unchanged one never does.
"""

import hashlib
import logging
from pathlib import Path

from lookahead.model.convert.checkpoint import weight_files
from lookahead.model.convert.converter import convert
from lookahead.model.convert.families import detect

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the converter's output changes
_SOURCE_FILES = ("*.json", "*.safetensors", "*.bin", "*.tiktoken", "*.model")


def fingerprint(src: Path) -> str:
    h = hashlib.sha256(f"lookahead-convert-{FORMAT_VERSION}".encode())
    h.update((src / "config.json").read_bytes())
    for path in sorted({p for pattern in _SOURCE_FILES for p in src.glob(pattern)}):
        stat = path.stat()
        h.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def has_weights(src: Path) -> bool:
    try:
        return all(path.is_file() for path in weight_files(src))
    except FileNotFoundError:
        return False


def hub_folder(repo_id: str) -> Path | None:
    """The local snapshot of a Hugging Face repo holding a legacy checkpoint, fetched if needed; else None.

    A repo already in the local cache costs no network call."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download, try_to_load_from_cache

        config = try_to_load_from_cache(repo_id, "config.json")
        if not isinstance(config, str):
            config = hf_hub_download(repo_id, "config.json")
    except Exception:  # not a repo id, or offline and not cached: leave it to from_pretrained
        return None
    folder = Path(config).parent
    if detect(folder) is None:
        return None
    if has_weights(folder):
        return folder
    return Path(snapshot_download(repo_id, allow_patterns=list(_SOURCE_FILES)))


def converted_folder(spec: str, cache_root: Path) -> Path | None:
    """The native folder for `spec` when it names a legacy checkpoint (folder or hub id); None otherwise."""
    path = Path(spec).expanduser()
    if path.is_dir():
        src = path
    elif spec.count("/") == 1 and not path.exists():
        src = hub_folder(spec)
    else:
        return None
    family = detect(src) if src is not None else None
    if family is None:
        return None
    target = cache_root / family.name / fingerprint(src)
    if (target / "config.json").is_file():
        return target
    log.warning("%s is a legacy %s checkpoint: converting it once into %s", spec, family.name, target)
    try:
        convert(family, src, target, progress=log.warning)
    except OSError:
        if (target / "config.json").is_file():  # another process finished the same conversion first
            return target
        raise
    return target
