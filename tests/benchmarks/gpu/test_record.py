"""The GPU check's bookkeeping: one budget split into caps, sections saved whole after every item."""

import json
import time

import pytest

from benchmarks.gpu.record import Deadline, RunBudget, SectionRecord, Throttle

CAPS = {"A": 10, "B": 30, "C": 60}


def test_caps_scale_to_fit_the_budget_less_start_up():
    b = RunBudget(CAPS, budget_s=200, startup_s=20, order="ABC")
    assert b.scale == pytest.approx(180 / 100)
    assert b.caps == pytest.approx({"A": 18, "B": 54, "C": 108})
    assert b.deadline("A").left == pytest.approx(18, abs=0.5)


def test_only_the_sections_asked_for_share_the_budget():
    b = RunBudget(CAPS, budget_s=100, startup_s=10, order="CA")
    assert b.caps == pytest.approx({"C": 90 * 60 / 70, "A": 90 * 10 / 70})


def test_a_section_never_takes_the_time_of_the_ones_after_it():
    b = RunBudget(CAPS, budget_s=110, startup_s=10, order="ABC")
    b.end -= 50  # as if earlier sections had overrun by 50 s
    assert b.deadline("A").left == pytest.approx(0, abs=0.5)  # A keeps only what B and C do not need
    assert b.deadline("B").left == pytest.approx(0, abs=0.5)
    assert b.deadline("C").left == pytest.approx(50, abs=0.5)  # the last: its cap (60), but never past the run's end


def test_a_budget_with_nothing_left_or_an_unknown_section_is_refused():
    with pytest.raises(ValueError, match="--budget-s 20 leaves nothing"):
        RunBudget(CAPS, budget_s=20, startup_s=25, order="ABC")
    with pytest.raises(ValueError, match="no such section: Z"):
        RunBudget(CAPS, budget_s=200, startup_s=10, order="AZ")


def test_a_share_is_that_part_of_what_is_left():
    d = Deadline.after(100)
    assert d.share(0.25).left == pytest.approx(25, abs=0.5)
    assert not d.passed and Deadline(time.monotonic() - 1).passed


def test_every_put_rewrites_the_whole_file_and_leaves_no_temporary(tmp_path):
    rec = SectionRecord(tmp_path / "X_x.json", "X x", Deadline.after(60), {"smoke": True})
    rec.put(("bf16", "levels", "1"), {"prompts": 1})
    rec.put(("bf16", "levels", "1"), {"prompts": 2})
    rec.put(("fp32",), {"exact": False})
    got = json.loads((tmp_path / "X_x.json").read_text())
    assert got["status"] == "running" and got["result"] == {"bf16": {"levels": {"1": {"prompts": 2}}},
                                                            "fp32": {"exact": False}}
    assert [p.name for p in tmp_path.iterdir()] == ["X_x.json"]


def test_a_section_stopped_by_a_deadline_ends_truncated_and_a_failed_one_says_why(tmp_path):
    rec = SectionRecord(tmp_path / "a.json", "a", Deadline.after(60), {})
    assert not rec.over() and not rec.over(Deadline.after(10))
    rec.finish()
    assert json.loads((tmp_path / "a.json").read_text())["status"] == "done"
    rec = SectionRecord(tmp_path / "b.json", "b", Deadline.after(60), {})
    assert rec.stop_when(Deadline(time.monotonic() - 1))()
    rec.finish()
    assert json.loads((tmp_path / "b.json").read_text())["status"] == "truncated"
    rec = SectionRecord(tmp_path / "c.json", "c", Deadline.after(60), {})
    rec.finish("Traceback: boom")
    got = json.loads((tmp_path / "c.json").read_text())
    assert got["status"] == "failed" and got["error"] == "Traceback: boom"


def test_a_throttle_calls_at_most_once_a_period():
    calls = []
    t = Throttle(lambda: calls.append(1), seconds=3600)
    for _ in range(5):
        t()
    assert calls == [1]


def test_a_section_whose_process_dies_keeps_its_items_and_says_how_it_died(tmp_path):
    import sys

    from benchmarks.gpu.record import run_isolated

    path = tmp_path / "P_profile.json"
    crash = ("import json, os, sys; p = sys.argv[1]; json.dump({'section': 'P profile', 'status': 'running', "
             "'seconds': 1, 'cap_s': 9, 'machine': {}, 'result': {'item': 1}, 'error': None}, open(p, 'w')); "
             "os._exit(134)")
    assert run_isolated([sys.executable, "-c", crash, str(path)], path, "P profile", 60) == "failed"
    record = json.loads(path.read_text())
    assert record["result"] == {"item": 1} and "exit status 134" in record["error"]
    hang = tmp_path / "C_timing.json"  # writes nothing, past its timeout: SIGTERM, then a record of it
    assert run_isolated([sys.executable, "-c", "import time; time.sleep(60)"], hang, "C timing", 1) == "failed"
    assert "SIGTERM" in json.loads(hang.read_text())["error"]
