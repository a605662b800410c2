import json
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LOOKAHEAD_DATA_DIR", REPO.parent / "shared" / "data"))


def load_prompts(name: str, limit: int | None = None) -> list[dict]:
    rows = [json.loads(line) for line in open(DATA / f"{name}.jsonl", encoding="utf-8")]
    return rows[:limit] if limit else rows


@pytest.fixture(autouse=True)
def _fixed_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def smollm2():
    from lookahead.models import load_model

    return load_model("smollm2-135m-instruct")
