"""Converted tiny legacy checkpoints, shared by the tests of this folder (converting takes ~0.2 s each)."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from lookahead.model.convert import convert

from tests.lookahead.model.convert.legacy_checkpoints import legacy_chatglm3, legacy_qwen1

BUILDERS = {"qwen1": legacy_qwen1, "chatglm3": legacy_chatglm3}


@dataclass
class Converted:
    family: str
    src: Path  # the legacy checkpoint folder
    dst: Path  # its native conversion
    cfg: dict  # the legacy config.json
    state: dict  # the legacy state dict, legacy tensor names


def make_converted(root: Path, family: str, fmt: str = "safetensors", **overrides) -> Converted:
    src = root / f"{family}-{fmt}"
    cfg, state = BUILDERS[family](src, fmt, **overrides)
    dst = convert(family, src, root / f"{family}-{fmt}-native", progress=lambda message: None)
    return Converted(family, src, dst, cfg, state)


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> dict[str, Converted]:
    root = tmp_path_factory.mktemp("converted")
    return {family: make_converted(root, family) for family in BUILDERS}
