"""The legacy families the converter knows, and how to recognise one from its `config.json`."""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from lookahead.model.convert import chatglm3

from lookahead.model.convert import chatglm3_tokenizer

from lookahead.model.convert import qwen1

from lookahead.model.convert import qwen1_tokenizer


@dataclass(frozen=True)
class Family:
    name: str  # the converter's CLI name
    arch: ModuleType  # check / native_config / rename, MODEL_TYPE, PUBLISHED_EOS, PUBLISHED_PAD
    tokenizer: ModuleType  # build, EOS
    native: str  # the transformers class the checkpoint becomes

    @property
    def model_type(self) -> str:
        return self.arch.MODEL_TYPE

    @property
    def check(self) -> Callable[[dict], None]:
        return self.arch.check


FAMILIES = {
    "qwen1": Family("qwen1", qwen1, qwen1_tokenizer, "Qwen2ForCausalLM"),
    "chatglm3": Family("chatglm3", chatglm3, chatglm3_tokenizer, "GlmForCausalLM"),
}


def detect(src: Path) -> Family | None:
    """The legacy family of the checkpoint folder `src`, or None (not a folder, or not a legacy model)."""
    config = src / "config.json"
    if not config.is_file():
        return None
    model_type = json.loads(config.read_text()).get("model_type")
    return next((f for f in FAMILIES.values() if f.model_type == model_type), None)
