"""The offline replay of the fleet bench: two replicas, routing and the fleet memory, on recorded outputs."""

import json
import random

import pytest

from benchmarks.fleet_replay import RECORDED, midrun, repeated, replay
from benchmarks.plan_replay import table_of


def workload(passages: int, rounds: int, repeats: int = 1, seed: int = 0) -> list[dict]:
    """Hand-made rows: each passage's prompt is its own random text plus a question number; every (passage,
    question) has one random answer, sent `repeats` times within its round (answers repeat across users)."""
    rng = random.Random(seed)
    text = {p: [rng.randrange(1000, 30000) for _ in range(40)] for p in range(passages)}
    answer = {(p, q): [rng.randrange(1000, 30000) for _ in range(24)] for p in range(passages) for q in range(rounds)}
    rows = [{"id": f"{p}/{q}", "passage": p, "prompt_ids": text[p] + [q + 1], "out": answer[p, q]}
            for q in range(rounds) for p in range(passages)]
    return repeated(rows, repeats)


def test_every_recorded_token_is_emitted_once_per_request():
    rows = workload(4, 3)
    for routing in ("pow2", "affinity"):
        for shared in (False, True):
            f = replay(rows, routing, shared, table_of("gpu"))
            assert sorted(d.request for d in f.done) == list(range(len(rows)))
            assert [d.tokens for d in sorted(f.done, key=lambda d: d.request)] == [len(r["out"]) for r in rows]


def test_affinity_keeps_a_passage_on_one_replica_and_pow2_spreads_it():
    # 1 client: load is always balanced, so affinity sends every question home; pow2 alternates ties.
    rows = workload(3, 4)
    for routing, homes in (("affinity", 1), ("pow2", 2)):
        f = replay(rows, routing, False, table_of("gpu"), clients=1)
        by_passage = {}
        for d in f.done:
            by_passage.setdefault(rows[d.request]["passage"], set()).add(d.replica)
        assert {len(s) for s in by_passage.values()} == {homes}


def test_a_repeated_answer_is_drafted_on_the_other_replica_only_with_the_fleet_memory():
    # Each answer asked twice; pow2 with 1 client alternates, so the repeat lands on the other replica.
    rows = workload(3, 2, repeats=2)
    own = replay(rows, "pow2", False, table_of("gpu"), clients=1, lag=0)
    fleet = replay(rows, "pow2", True, table_of("gpu"), clients=1, lag=0)
    assert own.tokens_per_step < 1.1  # random answers: nothing to draft but the repeats, which it never saw
    assert fleet.tokens_per_step > 1.5 * own.tokens_per_step


def test_a_newcomer_drafts_from_the_snapshot():
    # 8 distinct requests, then the same 8 three times: the replacement comes after the first 8 (a quarter), so
    # its first requests repeat answers written before it started, which only the snapshot gives it.
    first = workload(4, 2)
    rows = first * 4
    m = midrun(rows, table_of("gpu"), warm_calibration=False, first_n=4)
    assert m.newcomer > 2 and m.survivor_requests > 0
    cold = midrun(rows, table_of("gpu"), warm_calibration=False, first_n=4, snapshot=False)
    assert cold.newcomer < 0.6 * m.newcomer


@pytest.mark.skipif(not RECORDED.exists(), reason="no recorded outputs")
def test_the_recorded_workloads_are_the_benchs():
    recorded = json.loads(RECORDED.read_text())
    assert {name: len(rows) for name, rows in recorded.items()} == {"first8": 40, "next16": 80}
    first8 = recorded["first8"]
    assert [r["passage"] for r in first8[:8]] == sorted({r["passage"] for r in first8})  # interleaved rounds
    assert all(1 <= len(r["out"]) <= 48 and r["prompt_ids"] for rows in recorded.values() for r in rows)


def test_the_budget_bounds_the_drafts_a_flat_table_takes():
    from lookahead.config import LookaheadConfig

    rows = workload(2, 3, repeats=2)  # repeats: long drafts from the memory, where the budget binds
    wide = replay(rows, "affinity", True, table_of("flat"), clients=1, lag=0, la=LookaheadConfig(decoding_length=64))
    narrow = replay(rows, "affinity", True, table_of("flat"), clients=1, lag=0, la=LookaheadConfig(decoding_length=2))
    assert narrow.tokens_per_step <= 3 + 1e-9  # at most 2 drafts and the model's own token a step
    assert wide.tokens_per_step > narrow.tokens_per_step
