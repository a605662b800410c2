"""The offline replay of the engine's drafting on recorded greedy outputs: what planning alone predicts."""

import json

import pytest

from benchmarks.plan_replay import RECORDED, replay, table_of
from lookahead.core.step_table import StepTable


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def cpu_like() -> StepTable:
    """A plain step dearer with every row, and every draft token 1 ms: drafts pay only where likely."""
    return StepTable.from_function((1, 4, 16, 64), (0, 8, 64, 256), lambda _, r, d: 20 + 4 * r + 1.0 * d)


@pytest.mark.parametrize("name", ["humaneval", "narrativeqa"])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_pruning_at_break_even_changes_no_step(recorded, name, rows):
    records = recorded[name][:6]
    pruned = replay(records, rows, cpu_like(), prune=True)
    full = replay(records, rows, cpu_like(), prune=False)
    assert pruned.plans == full.plans and pruned.tokens == full.tokens
    assert pruned.drafts > 0  # it drafted: the floor cut only what no plan took
    assert pruned.built < full.built  # and it did cut


def test_drafts_are_taken_where_they_are_nearly_free(recorded):
    r = replay(recorded["humaneval"][:6], 1, table_of("gpu"))
    assert r.tokens / r.row_steps > 2 and r.ratio > 1.5


def test_nothing_is_drafted_where_every_token_costs_a_step(recorded):
    for rows in (1, 16):
        r = replay(recorded["narrativeqa"][:4], rows, table_of("dear"))
        assert r.drafts == 0 and r.ratio == pytest.approx(1.0)
        assert r.built <= 8 * r.row_steps  # past the shadow's rows nothing was built


def test_the_flat_table_prices_every_step_alike_so_drafts_are_taken(recorded):
    flat = table_of("flat")
    assert flat("packed", 1, 0) == flat("packed", 16, 512)  # a step costs the same, whatever it verifies
    r = replay(recorded["humaneval"][:4], 1, flat)
    assert r.drafts > 0 and r.tokens / r.row_steps > 1
