"""The concurrency bench's levels: arms alternate, rounds come in pairs up to a minimum time, outputs are checked."""

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from benchmarks import bench_engine
from benchmarks.bench_engine import run_levels
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner
from lookahead.engine.scheduler import SchedulerConfig

from tests.lookahead.engine.test_lossless_architectures import hf_greedy
from tests.lookahead.tiny_models import tiny

PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 2, 7], [3, 4, 3, 4, 8, 8, 8, 1], [2, 9, 2, 9, 2, 9, 2]]


def levels(min_seconds=0.0, repeats=1, references=None, warmup=0):
    model = tiny("llama")
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(decoding_length=8, branch_length=4), table=StepTable.flat())
    refs = references or [hf_greedy(model, p, 12) for p in PROMPTS]
    reported = []
    out = run_levels(dec, PROMPTS, refs, [1, 3], StopCriteria(12), SchedulerConfig(max_batch_size=3), reported.append,
                     repeats=repeats, min_seconds=min_seconds, warmup=warmup)
    assert out == reported
    return out


def test_each_level_compares_both_arms_with_generate():
    out = levels(repeats=2)
    assert [l["concurrency"] for l in out] == [1, 3]
    assert all(l["identical"] and l["repeats"] == 2 for l in out)
    assert all(l["ratio"] == l["on_tok_s"] / l["off_tok_s"] for l in out)
    assert all([r["arm"] for r in l["runs"]] == ["on", "off", "off", "on"] for l in out)  # the arms alternate


def test_a_wrong_reference_is_reported_as_different():
    assert not any(l["identical"] for l in levels(references=[[0] * 12] * len(PROMPTS)))


def test_a_short_level_gets_more_rounds_in_pairs():
    out = levels(min_seconds=0.5)  # a tiny model's level takes well under 0.5 s: rounds are added
    for l in out:
        assert l["repeats"] % 2 == 0 and l["repeats"] >= 2
        assert l["on"]["prompt_tokens"] == l["repeats"] * sum(map(len, PROMPTS))  # every round ran every prompt
        tokens = l["repeats"] * 12 * len(PROMPTS)
        assert min(tokens / l["on_tok_s"], tokens / l["off_tok_s"]) >= 0.5  # each arm's pooled runs took 0.5 s


def test_a_warmup_serves_both_arms_before_any_level_and_is_not_counted(monkeypatch):
    served = []
    real = bench_engine.run_level
    monkeypatch.setattr(bench_engine, "run_level", lambda dec, prompts, n, *a: served.append((len(prompts), n))
                        or real(dec, prompts, n, *a))
    out = levels(warmup=2)
    assert served[:2] == [(2, 2), (2, 2)]  # two prompts, two at a time, once per arm
    assert served[2:] == [(3, 1), (3, 1), (3, 3), (3, 3)]  # then each level: one round of both arms
    assert all(l["repeats"] == 1 and len(l["runs"]) == 2 for l in out)


def test_each_arm_reports_where_its_time_went():
    for level in levels():
        for arm in ("on", "off"):
            t = level[arm]["times"]
            wall = 12 * len(PROMPTS) / level[f"{arm}_tok_s"]  # one round of every prompt, 12 tokens each
            phases = sum(t[p + "_s"] for p in ("prefill", "plan", "forward", "accept", "commit"))
            assert 0 < phases <= wall and t["prefill_s"] > 0 and t["forward_s"] > 0
            assert set(t["by_rows"]) <= set(range(1, level["concurrency"] + 1))
            # every decode step advanced each of its rows once: row-steps are the requests' own steps
            row_steps = sum(r * v["steps"] for r, v in t["by_rows"].items())
            assert row_steps == level[arm]["row_steps"]
            assert 1 <= t["mean_rows"] <= level["concurrency"]
            # ...and each decode step is of one kind: drafting, plain by the planner, or held by the payoff check
            assert sum(level[arm]["decode_steps"].values()) == sum(v["steps"] for v in t["by_rows"].values())
        assert level["off"]["decode_steps"]["drafting"] == 0


def test_the_full_batch_split_counts_only_steps_that_ran_with_every_row():
    for level in levels(repeats=2):
        n, full = level["concurrency"], level["full_batch"]
        for arm in ("on", "off"):
            by_rows = level[arm]["times"]["by_rows"]
            # every token a request got came from some decode step: the split is of those tokens
            assert sum(v["tokens"] for v in by_rows.values()) == level["repeats"] * 12 * len(PROMPTS)
            assert full[f"{arm}_steps"] == by_rows[n]["steps"]
            assert full[f"{arm}_tok_s"] == by_rows[n]["tokens"] / by_rows[n]["s"]
            wall = level["repeats"] * 12 * len(PROMPTS) / level[f"{arm}_tok_s"]
            assert abs(full[f"{arm}_share"] - by_rows[n]["s"] / wall) < 1e-9
        assert full["ratio"] == full["on_tok_s"] / full["off_tok_s"]


def test_a_level_stopped_between_steps_reports_what_finished_and_counts_the_rest():
    model = tiny("llama")
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(decoding_length=8, branch_length=4), table=StepTable.flat())
    sched, stop = SchedulerConfig(max_batch_size=3), StopCriteria(12)
    whole = bench_engine.run_level(dec, PROMPTS, 1, stop, dec.config, sched)
    assert not whole.truncated and whole.indices() == [0, 1, 2]
    asked = []
    # one at a time: the first prompt's steps, then the deadline falls while the second runs
    cut = bench_engine.run_level(dec, PROMPTS, 1, stop, dec.config, sched,
                                 stop_when=lambda: asked.append(1) or sum(asked) > whole.outputs[0].stats.steps + 2)
    assert cut.truncated and cut.indices() == [0]
    assert cut.outputs[0].tokens == whole.outputs[0].tokens
    assert 0 < cut.unfinished_tokens < 12 and cut.tokens == 12 + cut.unfinished_tokens
    never = bench_engine.run_level(dec, PROMPTS, 3, stop, dec.config, sched, stop_when=lambda: True)
    assert never.truncated and never.outputs == [] and never.tokens == 0
