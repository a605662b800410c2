"""The step planner: how many draft tokens each running row verifies this step, and in which layout.

In: per row, its draft candidates' estimated acceptance probabilities (tree
order, so any prefix is a valid tree), and the measured step-time table.
Out: a `StepPlan`.

A row whose drafts are accepted with probabilities p_1..p_k emits, in
expectation, 1 + p_1 + ... + p_k tokens (the accepted path plus the model's
bonus token). The plan maximises the batch's expected tokens per
millisecond, expected tokens / table(layout, rows, drafts), against a plain
step of the same rows. Nothing else decides: on a device where extra tokens
are nearly free (a GPU below its compute roof) a likely row drafts deeply;
where every token costs a step (a compute-bound CPU batch) nobody drafts.

- Ragged forwards (each row sends only its own tokens): the linear layers
  cost by the tokens in flight wherever they sit, so drafts are bought
  greedily, the most likely next draft of any row first, and the prefix of
  that greedy order with the best rate wins (possibly empty: a plain step).
- Padded forwards (every row sends the widest tree): one width for the
  batch, the one with the best rate.
- Rows with a fixed budget (lookahead's `adaptive` off) verify their whole
  tree; the others plan around them. Nothing exceeds `max_tokens`.

Pure Python; no torch.
"""

import heapq
from collections.abc import Callable
from dataclasses import dataclass

Price = Callable[[str, int, int], float]  # (layout, rows, drafts) -> whole-step ms: a StepTable


@dataclass
class RowDrafts:
    probs: list[float]  # [drafts] calibrated P(draft on the accepted path), tree order
    fixed: bool = False  # verify every draft (no planning for this row)


@dataclass
class StepPlan:
    counts: list[int]  # [rows] draft tokens each row verifies (0: a plain step for that row)
    layout: str  # "padded" | "packed" | "split" (planner.layout_of)
    inflight: int  # draft tokens the forward computes: the counts' sum, or rows x (width - 1) when padded
    expected: float  # expected tokens the step emits
    ms: float  # the table's price of the step

    @property
    def width(self) -> int:
        """The widest row's tree, root included: what each row sends in a padded forward."""
        return 1 + max(self.counts, default=0)


def split_attention(rows: int, drafting: int) -> bool:
    """Does a ragged forward attend row by row rather than in the padded layout? Yes when at most a quarter
    of the rows carry drafts: then one call for every root plus one per drafting row costs less than padding
    every row to the widest tree (SmolLM2 at ~650 tokens of context, 1 of 16 rows drafting 8: 110 ms split,
    175 ms padded; from half the rows drafting up, the per-row calls cost more than the padding they avoid)."""
    return 0 < drafting and 4 * drafting <= rows


def layout_of(rows: int, drafting: int, ragged: bool) -> str:
    if not ragged:
        return "padded"
    return "split" if split_attention(rows, drafting) else "packed"


def _gain(probs: list[float], k: int) -> float:
    return 1.0 + sum(probs[:k])


def plan_step(rows: list[RowDrafts], price: Price, max_tokens: int, ragged: bool) -> StepPlan:
    n = len(rows)
    assert 0 < n <= max_tokens, "every row sends at least its root"
    counts = [len(r.probs) if r.fixed else 0 for r in rows]
    while n + sum(counts) > max_tokens:  # fixed budgets over the cap: trim the widest
        counts[counts.index(max(counts))] -= 1
    if ragged:
        return _ragged(rows, counts, price, max_tokens)
    return _padded(rows, counts, price, max_tokens)


def _plan(rows: list[RowDrafts], counts: list[int], price: Price, ragged: bool) -> StepPlan:
    n, drafting = len(rows), sum(c > 0 for c in counts)
    layout = layout_of(n, drafting, ragged)
    expected = sum(_gain(r.probs, c) for r, c in zip(rows, counts))
    inflight = n * max(counts) if layout == "padded" else sum(counts)
    return StepPlan(list(counts), layout, inflight, expected, price(layout, n, inflight))


def _ragged(rows: list[RowDrafts], counts: list[int], price: Price, max_tokens: int) -> StepPlan:
    n = len(rows)
    best = _plan(rows, counts, price, True)
    heap = [(-r.probs[0], b) for b, r in enumerate(rows) if not r.fixed and r.probs]
    heapq.heapify(heap)
    while heap and n + sum(counts) < max_tokens:
        _, b = heapq.heappop(heap)
        counts[b] += 1
        if counts[b] < len(rows[b].probs):
            heapq.heappush(heap, (-rows[b].probs[counts[b]], b))
        plan = _plan(rows, counts, price, True)
        if plan.expected * best.ms > best.expected * plan.ms:  # a better rate
            best = plan
    return best


def _padded(rows: list[RowDrafts], counts: list[int], price: Price, max_tokens: int) -> StepPlan:
    n = len(rows)
    fixed_width = max(counts, default=0)
    adaptive = [b for b, r in enumerate(rows) if not r.fixed]
    widest = max((len(rows[b].probs) for b in adaptive), default=0)
    best = None
    for k in range(fixed_width, max(widest, fixed_width) + 1):  # k: drafts per row, the width less its root
        if n * (1 + k) > max_tokens:
            break
        trial = list(counts)
        for b in adaptive:
            trial[b] = min(len(rows[b].probs), k)
        plan = _plan(rows, trial, price, False)
        if best is None or plan.expected * best.ms > best.expected * plan.ms:
            best = plan
    if best is None:  # even the fixed rows' width does not fit: as wide as the cap allows
        k = max(0, max_tokens // n - 1)
        best = _plan(rows, [min(c, k) for c in counts], price, False)
    return best
