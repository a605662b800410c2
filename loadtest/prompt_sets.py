"""Prompt files: the sets shipped in `benchmarks/prompts/`, and a reader that checks a file before a run uses it.

A prompt file is JSONL: one JSON object per non-blank line, each with a
string `prompt` (the shipped sets also carry `id` and `reference`; see
benchmarks/prompts/SOURCES.md). Benchmarks and load tests call
`read_prompts` before any load starts, so a missing, unreadable, empty or
malformed file stops them at once with a message that names the file and
the line, instead of failing every request of a long run.
"""

import json
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts"
SETS = ("humaneval", "mtbench", "narrativeqa", "debian_faq_zh")


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file (and the line)."""


def prompt_path(name: str) -> Path:
    """The shipped prompt set `name` (one of SETS)."""
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}; the shipped sets are {', '.join(SETS)}")
    return PROMPTS_DIR / f"{name}.jsonl"


def read_prompts(path: str | Path, limit: int | None = None, skip: int = 0) -> list[dict]:
    """Every row of a prompt file (the first `limit` after the first `skip`, if given), each checked to have a
    string `prompt`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"prompt file {path}: not found") from None
    except IsADirectoryError:
        raise PromptFileError(f"prompt file {path}: is a directory, not a JSONL file") from None
    except UnicodeDecodeError as e:
        raise PromptFileError(f"prompt file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise PromptFileError(f"prompt file {path}: cannot be read ({e.strerror or e})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"prompt file {path}, line {number}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise PromptFileError(f"prompt file {path}, line {number}: a JSON {type(row).__name__}, "
                                  "not an object with a \"prompt\" field")
        if not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise PromptFileError(f"prompt file {path}, line {number}: no \"prompt\" field with a non-empty string")
        rows.append(row)
        if limit and len(rows) >= skip + limit:
            break
    if not rows:
        raise PromptFileError(f"prompt file {path}: no prompts (the file is empty)")
    if len(rows) <= skip:
        raise PromptFileError(f"prompt file {path}: {len(rows)} prompts, all skipped (skip {skip})")
    return rows[skip:]
