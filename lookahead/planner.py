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


def plan_step(rows: list[RowDrafts], price: Price, max_tokens: int, ragged: bool, margin: float = 0.0) -> StepPlan:
    """`margin`: how much more than a plain step's rate drafts must promise (the table's own measured error)."""
    n = len(rows)
    assert 0 < n <= max_tokens, "every row sends at least its root"
    counts = [len(r.probs) if r.fixed else 0 for r in rows]
    while n + sum(counts) > max_tokens:  # fixed budgets over the cap: trim the widest
        counts[counts.index(max(counts))] -= 1
    if ragged:
        return _ragged(rows, counts, price, max_tokens, 1.0 + margin)
    return _padded(rows, counts, price, max_tokens, 1.0 + margin)


def _plan(rows: list[RowDrafts], counts: list[int], price: Price, ragged: bool) -> StepPlan:
    n, drafting = len(rows), sum(c > 0 for c in counts)
    layout = layout_of(n, drafting, ragged)
    expected = sum(_gain(r.probs, c) for r, c in zip(rows, counts))
    inflight = n * max(counts) if layout == "padded" else sum(counts)
    return StepPlan(list(counts), layout, inflight, expected, price(layout, n, inflight))


def _ragged(rows: list[RowDrafts], counts: list[int], price: Price, max_tokens: int, margin: float) -> StepPlan:
    """Greedy, kept incremental: each bought draft adds its probability and one token to the step."""
    n = len(rows)
    expected = sum(_gain(r.probs, c) for r, c in zip(rows, counts))
    drafting, inflight = sum(c > 0 for c in counts), sum(counts)
    best_rate, best = expected / price(layout_of(n, drafting, True), n, inflight), list(counts)
    best_rate *= margin  # the step as it stands (plain, or the fixed rows' trees) unless drafts beat it by that
    heap = [(-r.probs[0], b) for b, r in enumerate(rows) if not r.fixed and r.probs]
    heapq.heapify(heap)
    while heap and n + inflight < max_tokens:
        neg, b = heapq.heappop(heap)
        drafting += counts[b] == 0
        counts[b] += 1
        inflight += 1
        expected -= neg
        if counts[b] < len(rows[b].probs):
            heapq.heappush(heap, (-rows[b].probs[counts[b]], b))
        rate = expected / price(layout_of(n, drafting, True), n, inflight)
        if rate > best_rate:
            best_rate, best = rate, list(counts)
    return _plan(rows, best, price, True)


def _padded(rows: list[RowDrafts], counts: list[int], price: Price, max_tokens: int, margin: float) -> StepPlan:
    n = len(rows)
    fixed_width = max(counts, default=0)
    if n * (1 + fixed_width) > max_tokens:  # even the fixed rows' width does not fit: as wide as the cap allows
        k = max(0, max_tokens // n - 1)
        return _plan(rows, [min(c, k) for c in counts], price, False)
    adaptive = [b for b, r in enumerate(rows) if not r.fixed]
    widest = max((len(rows[b].probs) for b in adaptive), default=0)
    base = best = _plan(rows, counts, price, False)
    for k in range(fixed_width + 1, widest + 1):  # k: drafts per row, the width less its root
        if n * (1 + k) > max_tokens:
            break
        plan = _plan(rows, [min(len(rows[b].probs), k) if not rows[b].fixed else counts[b] for b in range(n)],
                     price, False)
        if plan.expected * best.ms > best.expected * plan.ms:
            best = plan
    # wider than the fixed rows need only if it beats that by the margin
    return best if best.expected * base.ms > margin * base.expected * best.ms else base
