"""The step planner on hand-written tables: what it drafts follows from the table and the probabilities alone."""

import subprocess
import sys

from lookahead.planner import RowDrafts, layout_of, plan_step
from lookahead.step_table import StepTable

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


def test_few_drafting_rows_attend_row_by_row():
    assert layout_of(16, 4, ragged=True) == "split"
    assert layout_of(16, 5, ragged=True) == "packed"
    assert layout_of(16, 0, ragged=True) == "packed"
    assert layout_of(16, 1, ragged=False) == "padded"


def test_the_algorithm_core_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import lookahead.trie, lookahead.ngram_index, lookahead.draft, lookahead.verify, lookahead.planner, "
            "lookahead.step_table, lookahead.scheduler, lookahead.trie_store, lookahead.prompt_sets\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_drafts_must_beat_a_plain_step_by_the_tables_own_error():
    table = StepTable.from_function(ROWS, DRAFTS, lambda _, r, d: 10 + d)  # one draft: +10%, for 0.15 tokens
    rows = [RowDrafts([0.15])]
    assert plan_step(rows, table, 64, ragged=True).counts == [1]  # 1.15 tokens / 11 ms beats 1 / 10 ms
    assert plan_step(rows, table, 64, ragged=True, margin=0.1).counts == [0]  # not by the table's 10%
    assert plan_step(rows, table, 64, ragged=False, margin=0.1).counts == [0]
    assert plan_step([RowDrafts([0.9])], table, 64, ragged=False, margin=0.1).counts == [1]
