"""Prompt files: the shipped sets are complete and well-formed; a bad file is refused naming the file and line."""

import json
import subprocess
import sys

import pytest

from loadtest.prompt_sets import PROMPTS_DIR, SETS, PromptFileError, prompt_path, read_prompts


@pytest.mark.parametrize("name,lines", [("humaneval", 164), ("mtbench", 80), ("narrativeqa", 500),
                                        ("debian_faq_zh", 146)])
def test_the_shipped_sets_are_in_the_repository(name, lines):
    rows = read_prompts(prompt_path(name))
    assert len(rows) == lines
    assert all(isinstance(r["id"], str) and r["prompt"] for r in rows)
    assert len({r["id"] for r in rows}) == lines  # ids are unique: bench and sweep records key on them


def test_every_shipped_set_has_its_source_and_licence():
    sources = (PROMPTS_DIR / "SOURCES.md").read_text(encoding="utf-8")
    assert set(SETS) == {p.stem for p in PROMPTS_DIR.glob("*.jsonl")}
    for name in SETS:
        row = next(line for line in sources.splitlines() if line.startswith(f"| {name}.jsonl"))
        assert any(lic in row for lic in ("MIT", "Apache-2.0", "Debian FAQ licence")), row


def test_limit_reads_only_the_first_rows():
    assert [r["id"] for r in read_prompts(prompt_path("mtbench"), 3)] == ["mtbench/81", "mtbench/82", "mtbench/83"]


def test_skip_reads_a_held_out_slice(tmp_path):
    """`benchmarks.bench --skip 16 --limit 16`: the 16 prompts after the first 16 (which the planner was tuned on)."""
    assert [r["id"] for r in read_prompts(prompt_path("mtbench"), 2, skip=16)] == ["mtbench/97", "mtbench/98"]
    small = tmp_path / "two.jsonl"
    small.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert read_prompts(small, skip=1) == [{"prompt": "b"}]
    with pytest.raises(PromptFileError, match="all skipped"):
        read_prompts(small, 4, skip=2)


def test_the_bench_refuses_a_negative_skip(capsys):
    from benchmarks import bench

    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--skip", "-1"])
    assert e.value.code != 0 and "--skip -1: must be >= 0" in capsys.readouterr().err


BAD = [
    ("empty", b"", "no prompts"),
    ("blank lines only", b"\n  \n", "no prompts"),
    ("not JSON", b'{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON"),
    ("not an object", b'{"prompt": "a"}\n["prompt"]\n', "line 2: a JSON list"),
    ("no prompt", b'{"prompt": "a"}\n\n{"id": "x"}\n', "line 3: no \"prompt\""),
    ("prompt not a string", b'{"prompt": 7}\n', "line 1: no \"prompt\""),
    ("not UTF-8", b'{"prompt": "\xff"}\n', "not UTF-8"),
]


@pytest.mark.parametrize("name,content,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_names_itself_and_the_line(tmp_path, name, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    with pytest.raises(PromptFileError, match=str(path)) as e:
        read_prompts(path)
    assert message in str(e.value)


def test_a_missing_file_or_a_directory_is_named(tmp_path):
    with pytest.raises(PromptFileError, match="not found"):
        read_prompts(tmp_path / "absent.jsonl")
    with pytest.raises(PromptFileError, match="is a directory"):
        read_prompts(tmp_path)


def test_the_bench_refuses_a_bad_file_before_loading_a_model(tmp_path, capsys, monkeypatch):
    from benchmarks import bench

    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    with pytest.raises(SystemExit) as e:
        bench.main(["--prompts", str(tmp_path / "absent.jsonl")])
    assert e.value.code != 0
    assert f"prompt file {tmp_path / 'absent.jsonl'}: not found" in capsys.readouterr().err


def test_the_sweep_refuses_a_bad_file_before_starting_anything(tmp_path, capsys):
    from loadtest import sweep

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit) as e:  # no server at --url, no --config: a check after start-up would hang
        sweep.main(["--prompts", str(empty), "--url", "http://127.0.0.1:9", "--ready-timeout", "600",
                    "--out", str(tmp_path / "out")])
    assert e.value.code != 0
    assert f"prompt file {empty}: no prompts" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_locust_stops_at_once_on_a_bad_file(tmp_path):
    """Before: every user's task raised on the missing file, in a loop that spun a core until -t ran out."""
    from loadtest.sweep import LOCUSTFILE

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"id": "no prompt here"}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "1", "-r", "1",
                           "-t", "300s", "--host", "http://127.0.0.1:9", "--prompts", str(bad)],
                          capture_output=True, text=True, timeout=120)  # a bound on a hang, not a speed check
    assert proc.returncode != 0
    assert f"prompt file {bad}, line 2: no \"prompt\"" in proc.stderr
