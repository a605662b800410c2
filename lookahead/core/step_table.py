"""What one decode step costs: measured whole-step milliseconds by rows, draft tokens in flight and layout.

A step's time is everything from planning it to committing its tokens:
planning, the forward, the acceptance walk, committing. The rows' proposals
are built before the plan, whatever it decides, so the table leaves them out
(the payoff check weighs them; payoff.py). On a GPU
the forward is asynchronous, but the step ends by reading its argmax back,
which waits for the device, so the wall clock around the whole step is its
host plus device time; it is never the time to launch a kernel.

The table is a grid per layout over (rows, drafts), drafts being the tokens
in flight beyond one root per row, read between grid points by bilinear
interpolation. `runner.seed_step_table` fills it at start-up by timing
forwards over a short grid up to `max_tokens_per_step`, several rows at
once, because one row's curve says nothing about sixteen. While serving,
every step's measured time moves the grid points around it toward what was
measured (a normalised least-mean-squares step), so the table follows the
machine, the context lengths and the host work that the start-up forwards
did not include. The drafts = 0 column is the plain step, which every layout
shares: a plain step refines it in all of them, so a drafting step is always
weighed against the same plain price.

Two rules keep the grid a cost curve, whatever order steps arrive in:
- A plain step scales the whole curve of the rows it touched (every draft
  column, every layout) by the factor it moved their plain price. Plain
  steps are most of what a loaded engine runs; without this, a machine that
  slows down (or contexts that grow) raises the plain price while the
  drafting points keep their start-up values, until drafts look cheaper than
  none.
- Along the drafts axis a row's curve never falls: after a drafting step,
  each point is at least the one before it, so no draft is priced below a
  plain step.

Pure Python; no torch.
"""

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

LAYOUTS = ("padded", "packed", "split")  # see planner.layouts_of


def bracket(grid: tuple[int, ...], x: float) -> list[tuple[int, float]]:
    """Grid indices around x with their linear weights (extrapolating past either end)."""
    if len(grid) == 1:
        return [(0, 1.0)]
    i = min(max(bisect.bisect_right(grid, x) - 1, 0), len(grid) - 2)
    t = (x - grid[i]) / (grid[i + 1] - grid[i])
    return [(i, 1.0 - t), (i + 1, t)]


@dataclass
class StepTable:
    rows: tuple[int, ...]  # grid of running rows, ascending
    drafts: tuple[int, ...]  # grid of draft tokens in flight, ascending, from 0 (a plain step)
    ms: dict[str, list[list[float]]]  # layout -> [len(rows)][len(drafts)] whole-step ms
    rate: float = 0.2  # how far one step's measurement moves the grid toward it
    observed: int = field(default=0)  # steps measured while serving
    # How far off the table's price of a step has been, relative to the time measured (decayed mean): drafts
    # must promise more than this over a plain step, or the planner would chase its own noise.
    error: float = 0.05

    def __post_init__(self) -> None:
        assert self.drafts[0] == 0, "the grid starts at the plain step"
        for layout, grid in self.ms.items():
            assert len(grid) == len(self.rows) and all(len(r) == len(self.drafts) for r in grid), layout
            assert all(v > 0 and math.isfinite(v) for r in grid for v in r), f"{layout}: every point is measured"

    @classmethod
    def from_function(cls, rows, drafts, fn: Callable[[str, int, int], float], layouts=LAYOUTS) -> "StepTable":
        """A table from a price function fn(layout, rows, drafts), for tests and for the start-up seed."""
        rows, drafts = tuple(rows), tuple(drafts)
        return cls(rows, drafts, {lay: [[fn(lay, r, d) for d in drafts] for r in rows] for lay in layouts})

    @classmethod
    def flat(cls) -> "StepTable":
        """Every step costs the same whatever it verifies, and stays so: PIA's implicit assumption (drafts are
        free). For a fixed budget, and for tests that need the planner out of the way."""
        table = cls.from_function((1, 4096), (0, 4096), lambda *_: 1.0)
        table.rate = table.error = 0.0
        return table

    def __call__(self, layout: str, rows: int, drafts: int) -> float:
        """Whole-step ms of `rows` running rows verifying `drafts` draft tokens in `layout`."""
        grid, at = self.ms[layout], bracket(self.rows, rows)
        return max(sum(wd * sum(wr * grid[i][j] for i, wr in at) for j, wd in bracket(self.drafts, drafts)), 1e-6)

    def at_rows(self, rows: int) -> "RowPrices":
        """The table at one row count, for pricing many steps of it (the planner's greedy loop)."""
        return RowPrices(self, rows)

    def least_marginal(self, layouts: tuple[str, ...], rows: int, max_drafts: int) -> float:
        """The least ms one more draft token adds to a step of `rows` rows, anywhere from 0 to `max_drafts`
        in flight, in any of `layouts`. At a fixed row count the price is linear between grid points (and
        past the last one), so it is the least slope of the drafts grid's intervals below `max_drafts`."""
        least = math.inf
        for layout in layouts:
            if layout not in self.ms:
                continue
            col = [self(layout, rows, d) for d in self.drafts]
            for j in range(len(self.drafts) - 1):
                if self.drafts[j] >= max_drafts:
                    break
                least = min(least, (col[j + 1] - col[j]) / (self.drafts[j + 1] - self.drafts[j]))
        return least if math.isfinite(least) else 0.0

    def observe(self, layout: str, rows: int, drafts: int, ms: float) -> None:
        """Refine the grid with one measured step."""
        corners = [(i, j, wr * wd) for i, wr in bracket(self.rows, rows) for j, wd in bracket(self.drafts, drafts)]
        norm = sum(w * w for *_, w in corners)
        if norm <= 0 or not math.isfinite(ms) or ms <= 0:
            return
        err = ms - self(layout, rows, drafts)
        if self.rate:
            self.error += (abs(err) / ms - self.error) * 0.05
        if drafts == 0:  # the plain price moves, and with it the rows' whole curves, in every layout
            for grid in self.ms.values():
                for i, j, w in corners:
                    old = grid[i][j]
                    scale = max(old + self.rate * err * w / norm, 1e-3) / old
                    grid[i] = [v * scale for v in grid[i]]
        elif layout in self.ms:
            grid = self.ms[layout]
            for i, j, w in corners:
                grid[i][j] = max(grid[i][j] + self.rate * err * w / norm, 1e-3)
            for i in {i for i, _, _ in corners}:  # never cheaper with more drafts in flight
                for j in range(1, len(self.drafts)):
                    grid[i][j] = max(grid[i][j], grid[i][j - 1])
        self.observed += 1

    def summary(self) -> dict[str, dict[int, dict[int, float]]]:
        """{layout: {rows: {drafts: ms}}}, for logs and the bench report."""
        return {lay: {r: {d: round(v, 2) for d, v in zip(self.drafts, row)} for r, row in zip(self.rows, grid)}
                for lay, grid in self.ms.items()}


class RowPrices:
    """A table's prices at one row count, (layout, drafts) -> ms: its columns interpolated over rows once, then
    read along the drafts axis. The same sums as `StepTable.__call__`, in the same order: the same floats."""

    def __init__(self, table: StepTable, rows: int) -> None:
        self.drafts = table.drafts
        at = bracket(table.rows, rows)
        self.columns = {lay: [sum(wr * grid[i][j] for i, wr in at) for j in range(len(table.drafts))]
                        for lay, grid in table.ms.items()}  # layout -> [len(drafts)] ms at `rows`

    def __call__(self, layout: str, drafts: int) -> float:
        col = self.columns[layout]
        return max(sum(wd * col[j] for j, wd in bracket(self.drafts, drafts)), 1e-6)
