"""The step planner on hand-written tables: what it drafts follows from the table and the probabilities alone."""

import random
import subprocess
import sys

import pytest

from lookahead.core.planner import RowDrafts, break_even, layouts_of, plan_step
from lookahead.core.step_table import StepTable

ROWS = (1, 2, 4, 8, 16, 32)
DRAFTS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def gpu_table() -> StepTable:
    """A GPU's roofline: a step reads the weights once (10 ms) and each row's KV cache (0.05 ms a row), and
    computes 10/64 ms a token; memory-bound below the roof, so one row's first 64 tokens cost the same, and
    compute-bound past it (32 rows at 2,048 tokens in flight take 320 ms)."""
    return StepTable.from_function(ROWS, DRAFTS, lambda _, rows, drafts: max(10 + 0.05 * rows, (rows + drafts) * 10 / 64))


def likely(n: int, p: float = 0.6, depth: int = 63) -> list[RowDrafts]:
    """n rows, each a chain of drafts accepted with probability p given its parent's acceptance."""
    return [RowDrafts([p ** (k + 1) for k in range(depth)]) for _ in range(n)]


def test_a_likely_row_alone_drafts_deep_on_a_gpu():
    plan = plan_step(likely(1), gpu_table(), 2048, ragged=True)
    assert plan.counts[0] >= 16
    assert plan.layout == "packed" and plan.inflight == plan.counts[0]


def test_a_gpu_batch_of_32_drafts_a_few_per_row():
    plan = plan_step(likely(32), gpu_table(), 2048, ragged=True)
    assert 0 < max(plan.counts) <= 4
    assert plan.expected > 32  # it still drafts: below the roof extra tokens are nearly free


def test_when_every_extra_token_costs_a_whole_step_nobody_drafts():
    dear = StepTable.from_function(ROWS, DRAFTS, lambda _, rows, drafts: 10.0 * (rows + drafts))
    for n in (1, 4, 32):
        plan = plan_step(likely(n, p=0.9), dear, 2048, ragged=True)
        assert plan.counts == [0] * n and plan.inflight == 0


def test_drafts_are_bought_where_they_are_likely_and_within_the_cap():
    rows = [RowDrafts([0.9, 0.8, 0.05]), RowDrafts([0.02]), RowDrafts([0.7, 0.6])]
    modest = StepTable.from_function(ROWS, DRAFTS, lambda _, r, d: 10 + 1.5 * d)
    assert plan_step(rows, modest, 256, ragged=True).counts == [2, 0, 2]
    assert sum(plan_step(likely(3, 0.99), StepTable.flat(), 7, ragged=True).counts) == 4  # 3 roots + 4 drafts = cap


def test_a_fixed_row_keeps_its_whole_tree_and_the_others_plan_around_it():
    rows = [RowDrafts([0.01] * 5, fixed=True), RowDrafts([0.01] * 5)]
    plan = plan_step(rows, StepTable.from_function(ROWS, DRAFTS, lambda _, r, d: 10 + d), 256, ragged=True)
    assert plan.counts == [5, 0]


def test_a_padded_batch_shares_one_width_priced_for_every_row():
    rows = [RowDrafts([0.9] * 7), RowDrafts([0.1] * 2)]
    plan = plan_step(rows, StepTable.flat(), 256, ragged=False)
    assert plan.layout == "padded" and plan.width == 8 and plan.counts == [7, 2]
    assert plan.inflight == 2 * 7  # both rows compute the widest tree
    assert plan_step(likely(8, 0.99), StepTable.flat(), 16, ragged=False).width == 2  # 8 rows x 2 = the cap


def test_few_drafting_rows_may_attend_row_by_row():
    assert layouts_of(16, 4, ragged=True) == ("split", "packed")
    assert layouts_of(16, 5, ragged=True) == ("packed",)
    assert layouts_of(16, 0, ragged=True) == ("packed",)
    assert layouts_of(16, 1, ragged=False) == ("padded",)


def test_where_both_may_run_the_layout_is_the_one_the_table_prices_lower():
    """Seen on a learned CPU table: 16 rows, one drafting, split 214 ms against packed 194 ms."""
    rows = [RowDrafts([0.9, 0.8])] + [RowDrafts([])] * 15

    def table(split_ms: float) -> StepTable:
        return StepTable.from_function(ROWS, DRAFTS, lambda lay, r, d: 100 + d + (split_ms if lay == "split" else 0))

    assert plan_step(rows, table(+20), 256, ragged=True).layout == "packed"
    assert plan_step(rows, table(-20), 256, ragged=True).layout == "split"
    assert plan_step(rows, StepTable.flat(), 256, ragged=True).layout == "split"  # a tie: as the rule had it
    many = plan_step(likely(16, 0.99), table(-50), 256, ragged=True)
    assert many.layout == "packed" and min(many.counts) > 0  # every row drafting: split may not run, however cheap


def test_the_algorithm_core_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import lookahead.core.trie, lookahead.core.ngram_index, lookahead.core.draft, lookahead.core.verify, lookahead.core.planner, "
            "lookahead.core.step_table, lookahead.engine.scheduler, lookahead.core.trie_store, loadtest.prompt_sets\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_drafts_must_beat_a_plain_step_by_the_tables_own_error():
    table = StepTable.from_function(ROWS, DRAFTS, lambda _, r, d: 10 + d)  # one draft: +10%, for 0.15 tokens
    rows = [RowDrafts([0.15])]
    assert plan_step(rows, table, 64, ragged=True).counts == [1]  # 1.15 tokens / 11 ms beats 1 / 10 ms
    assert plan_step(rows, table, 64, ragged=True, margin=0.1).counts == [0]  # not by the table's 10%
    assert plan_step(rows, table, 64, ragged=False, margin=0.1).counts == [0]
    assert plan_step([RowDrafts([0.9])], table, 64, ragged=False, margin=0.1).counts == [1]


def random_table(rng: random.Random) -> StepTable:
    """A cost curve per layout: a plain price per row, then a random non-decreasing price per draft token."""
    plain = {r: rng.uniform(5, 30) * r ** rng.uniform(0.2, 1.0) for r in ROWS}
    scale = rng.choice([0.01, 0.1, 0.5, 1.0, 3.0])
    slopes = {(lay, r, j): scale * rng.uniform(0.5, 2.0) for lay in ("packed", "split")
              for r in ROWS for j in range(len(DRAFTS))}

    def price(lay, r, d):
        lay = "packed" if lay == "padded" else lay
        cost, prev = plain[r], 0
        for j, g in enumerate(DRAFTS[1:]):
            cost += slopes[lay, r, j] * (min(d, g) - prev)
            if d <= g:
                break
            prev = g
        return cost

    return StepTable.from_function(ROWS, DRAFTS, price)


def test_no_plan_takes_a_draft_below_break_even_so_pruning_there_changes_nothing():
    rng = random.Random(0)
    pruned_some = 0
    for trial in range(300):
        table = random_table(rng)
        n = rng.choice([1, 2, 3, 4, 8, 16, 32])
        rows = [RowDrafts(sorted((rng.random() ** 2 for _ in range(rng.randrange(0, 20))), reverse=True))
                for _ in range(n)]  # best first, as hier trees come
        cap = rng.choice([n + 8, 64, 256])
        floor = break_even(table, n, cap)
        cut = [RowDrafts([p for p in r.probs if p >= floor]) for r in rows]
        pruned = sum(len(r.probs) for r in rows) > sum(len(r.probs) for r in cut)
        for margin in (0.0, 0.05):
            full_plan, cut_plan = plan_step(rows, table, cap, True, margin), plan_step(cut, table, cap, True, margin)
            assert full_plan.counts == cut_plan.counts and full_plan.layout == cut_plan.layout, trial
        pruned_some += pruned and full_plan.inflight > 0
    assert pruned_some > 100  # tested where it prunes some drafts and the plan still takes others


def test_break_even_is_near_zero_on_a_gpu_and_past_one_where_a_token_costs_a_step():
    assert break_even(gpu_table(), 1, 2048) == 0.0  # the first 64 tokens of one row are free
    assert break_even(gpu_table(), 32, 2048) < 0.2
    dear = StepTable.from_function(ROWS, DRAFTS, lambda _, rows, drafts: 10.0 * (rows + drafts))
    assert break_even(dear, 16, 256) == pytest.approx(1.0)  # a draft would have to be certain just to break even


def test_the_walk_along_one_row_count_plans_what_pricing_each_step_anew_plans():
    # the greedy loop reads the table at its row count once and walks its drafts axis (planner._Walk)
    rng = random.Random(7)
    table = StepTable.from_function((1, 4, 16, 64), (0, 8, 64, 512),
                                    lambda lay, r, d: 3.0 + 0.2 * r + (0.011 if lay == "split" else 0.009) * d
                                    + (0.4 if lay == "split" else 0.0) + 0.002 * d * d / (r + 1))
    anew = lambda lay, r, d: table(lay, r, d)  # noqa: E731 - no at_rows: every price read from the grid
    for _ in range(200):
        n = rng.choice([1, 2, 3, 5, 8, 16, 17, 40, 64, 70])
        rows = [RowDrafts(sorted((rng.random() for _ in range(rng.randrange(0, 12))), reverse=True),
                          fixed=rng.random() < 0.1) for _ in range(n)]
        cap = rng.choice([n, n + 3, 2 * n, 8 * n, 600])
        a = plan_step([RowDrafts(list(r.probs), r.fixed) for r in rows], table, cap, True, 0.05)
        b = plan_step([RowDrafts(list(r.probs), r.fixed) for r in rows], anew, cap, True, 0.05)
        assert (a.counts, a.layout, a.ms, a.expected) == (b.counts, b.layout, b.ms, b.expected)
