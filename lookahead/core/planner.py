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
- Where a ragged step may attend row by row (few rows drafting; see
  `split_attention`), the table's cheaper of split and packed is the layout.
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
    layout: str  # "padded" | "packed" | "split": of those the step may run in (layouts_of), the one priced lowest
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
    every row to the widest tree; from half the rows drafting up, the per-row calls cost more than the padding they
    avoid (measured: docs/benchmarks.md)."""
    return 0 < drafting and 4 * drafting <= rows


def layouts_of(rows: int, drafting: int, ragged: bool) -> tuple[str, ...]:
    """The layouts a step of `rows` rows, `drafting` of them with drafts, can run in: padded when the model
    cannot take ragged forwards; else packed, and split too where `split_attention` allows it."""
    if not ragged:
        return ("padded",)
    return ("split", "packed") if split_attention(rows, drafting) else ("packed",)


def cheapest(price: Price, rows: int, drafting: int, inflight: int, ragged: bool) -> tuple[str, float]:
    """The layout the table prices lowest for this step, and that price (ties go to the first allowed)."""
    options = [(price(lay, rows, inflight), i, lay) for i, lay in enumerate(layouts_of(rows, drafting, ragged))]
    ms, _, layout = min(options)
    return layout, ms


def break_even(table, rows: int, max_tokens: int) -> float:
    """The calibrated probability below which no draft is in any ragged plan of `rows` adaptive rows
    (`table`: a StepTable). Nothing is lost by not proposing such drafts, only host work saved.

    A draft of probability p adds p tokens and at least m ms (the table's least marginal price of a
    draft token, over the layouts a ragged step may run in), so p / m < rows / plain (the plain rate)
    makes it cost more than it gives. Drafts are bought most likely first, so those below the floor
    form the tail of the greedy order; the best plan has a rate of at least the plain one, and the
    mediant of that rate and the tail's (p / m, below it) is below it, so dropping the tail would do
    better: the best plan holds none of them. Near 0 on a GPU (drafts nearly free); on a compute-bound
    CPU batch it can pass 1, and then no draft is built at all past the shadow's rows.
    """
    plain = table("packed", rows, 0)
    marginal = table.least_marginal(("packed", "split"), rows, max_tokens - rows)
    return max(0.0, rows * marginal / plain)


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
    expected = sum(_gain(r.probs, c) for r, c in zip(rows, counts))
    inflight = sum(counts) if ragged else n * max(counts)
    layout, ms = cheapest(price, n, drafting, inflight, ragged)
    return StepPlan(list(counts), layout, inflight, expected, ms)


def _ragged(rows: list[RowDrafts], counts: list[int], price: Price, max_tokens: int, margin: float) -> StepPlan:
    """Greedy, kept incremental: each bought draft adds its probability and one token to the step. Every step
    priced here has n rows, so a table is read at n once (`StepTable.at_rows`) and each price is one segment of
    its drafts axis, walked forward as the tokens in flight grow (the same floats as pricing each step anew)."""
    n = len(rows)
    at_rows = getattr(price, "at_rows", None)
    walk = _Walk(at_rows(n)) if at_rows is not None else None
    expected = sum(_gain(r.probs, c) for r, c in zip(rows, counts))
    drafting, inflight = sum(c > 0 for c in counts), sum(counts)
    best_rate = expected / cheapest(price, n, drafting, inflight, True)[1]
    best_rate *= margin  # the step as it stands (plain, or the fixed rows' trees) unless drafts beat it by that
    start, bought, best = list(counts), [], 0  # the plan: `start` and then the first `best` drafts bought
    heap = [(-r.probs[0], b) for b, r in enumerate(rows) if not r.fixed and r.probs]
    heapq.heapify(heap)
    while heap and n + inflight < max_tokens:
        neg, b = heapq.heappop(heap)
        drafting += counts[b] == 0
        counts[b] += 1
        inflight += 1
        expected -= neg
        bought.append(b)
        if counts[b] < len(rows[b].probs):
            heapq.heappush(heap, (-rows[b].probs[counts[b]], b))
        ms = walk.cheapest(inflight, split_attention(n, drafting)) if walk else \
            cheapest(price, n, drafting, inflight, True)[1]
        rate = expected / ms
        if rate > best_rate:
            best_rate, best = rate, len(bought)
    for b in bought[:best]:
        start[b] += 1
    return _plan(rows, start, price, True)


class _Walk:
    """A table's packed and split prices at one row count along a growing number of drafts in flight: what
    `cheapest` gives there, with the segment of the drafts grid carried from one call to the next."""

    def __init__(self, prices) -> None:
        self.grid = prices.drafts
        self.packed, self.split = prices.columns["packed"], prices.columns.get("split")
        self.i = 0

    def cheapest(self, drafts: int, split: bool) -> float:
        grid, i = self.grid, self.i
        if len(grid) == 1:
            return min(max(self.packed[0] * 1.0, 1e-6), max(self.split[0] * 1.0, 1e-6) if split else float("inf"))
        while i < len(grid) - 2 and grid[i + 1] <= drafts:  # (bracket's segment: drafts only grow)
            i += 1
        self.i = i
        t = (drafts - grid[i]) / (grid[i + 1] - grid[i])
        packed = max(0 + (1.0 - t) * self.packed[i] + t * self.packed[i + 1], 1e-6)
        if not split:
            return packed
        return min(max(0 + (1.0 - t) * self.split[i] + t * self.split[i + 1], 1e-6), packed)  # ties: split first


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
