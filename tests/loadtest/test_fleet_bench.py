"""The fleet bench's workload and its mid-run figure: questions interleave across passages, and the newcomer's
tokens a step are set against the survivor's over the same stretch, not the survivor's whole run."""

import pytest

from loadtest.fleet_bench import app_args, matched, midrun_figures, workload
from loadtest.prompt_sets import prompt_path, read_prompts


def test_workload_interleaves_each_passages_questions():
    by_id = {r["id"]: r for r in read_prompts(prompt_path("narrativeqa"))}
    rows = workload(docs=3, questions=2, offset=1)
    passages = [by_id[r["id"]]["passage_id"] for r in rows]
    # every passage's first question, then every passage's second: a passage's prefix comes back `docs` requests on
    assert passages == [1, 2, 3, 1, 2, 3]
    assert len({r["id"] for r in rows}) == 6
    assert all(r["prompt"] == by_id[r["id"]]["prompt"] for r in rows)


def test_workload_refuses_what_the_set_lacks():
    with pytest.raises(SystemExit, match="narrativeqa has no"):
        workload(docs=2, questions=6, offset=0)


def _ld(completed, tokens, steps):
    return {"completed": completed, "new_tokens": tokens, "steps": steps}


def test_midrun_figures_take_the_survivors_same_stretch():
    start = {"s": _ld(10, 1000, 500), "n": _ld(0, 0, 0)}
    samples = [
        (1.0, {"s": _ld(12, 1100, 540), "n": _ld(5, 100, 60)}),
        (2.0, {"s": _ld(20, 1400, 700), "n": _ld(20, 400, 250)}),  # the newcomer's 20th request
        (3.0, {"s": _ld(30, 2000, 800), "n": _ld(30, 900, 300)}),
    ]
    fig = midrun_figures(samples, {"new": "n", "survivor": "s", "start": start, "replacement_s": 12.0})
    assert fig["new_replica_requests"] == 20
    assert fig["new_tokens_per_step"] == pytest.approx(400 / 250, abs=1e-3)
    assert fig["survivor_requests_same_stretch"] == 10
    assert fig["survivor_tokens_per_step_same_stretch"] == pytest.approx(400 / 200, abs=1e-3)
    assert fig["ratio"] == pytest.approx((400 / 250) / (400 / 200), abs=1e-3)


def test_midrun_figures_use_the_last_sample_when_the_newcomer_answered_fewer():
    start = {"s": _ld(0, 0, 0), "n": _ld(0, 0, 0)}
    samples = [(1.0, {"s": _ld(4, 300, 100), "n": _ld(3, 90, 60)})]
    fig = midrun_figures(samples, {"new": "n", "survivor": "s", "start": start, "replacement_s": 1.0})
    assert fig["new_replica_requests"] == 3
    assert fig["ratio"] == pytest.approx(1.5 / 3.0, abs=1e-3)


def test_workload_repeats_each_round_of_questions():
    by_id = {r["id"]: r for r in read_prompts(prompt_path("narrativeqa"))}
    rows = workload(docs=2, questions=2, offset=0, repeats=2)
    assert [by_id[r["id"]]["passage_id"] for r in rows] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [r["id"] for r in rows[:4]] == [rows[0]["id"], rows[1]["id"]] * 2
    assert rows[4]["id"] != rows[0]["id"]


def test_matched_figure_sets_the_newcomers_requests_against_the_same_requests_warm():
    # Rows 1 and 3 went to the newcomer; the warm run took other steps on the same rows, and rows 0 and 2 differ
    # wildly (the passages the newcomer did not take) without moving the figure.
    rec = lambda tokens, steps: {"tokens": tokens, "steps": steps}  # noqa: E731
    midrun = {"midrun": {"new_replica_rows": [1, 3]}, "records": [rec(48, 10), rec(40, 30), rec(48, 48), rec(20, 10)]}
    warm = {"records": [rec(48, 48), rec(40, 20), rec(48, 8), rec(20, 10)]}
    fig = matched(midrun, warm)
    assert fig["requests"] == 2
    assert fig["new_tokens_per_step"] == pytest.approx(60 / 40, abs=1e-3)
    assert fig["warm_tokens_per_step_same_requests"] == pytest.approx(60 / 30, abs=1e-3)
    assert fig["ratio"] == pytest.approx(0.75, abs=1e-3)


def test_app_args_validate_and_fix_the_budget_only_when_asked():
    from serve_app.config import AppConfig

    measured = AppConfig.model_validate(app_args("pow2", False, 48)).models[0]
    fixed = AppConfig.model_validate(app_args("prefix_affinity", True, 48, fixed_budget=16)).models[0]
    assert measured.lookahead.adaptive and not measured.lookahead.shared_memory and measured.routing == "pow2"
    assert not fixed.lookahead.adaptive and fixed.lookahead.decoding_length == 16 and fixed.lookahead.shared_memory
