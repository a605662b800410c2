"""The measured step-time table: interpolation between grid points and refinement by measured steps."""

import pytest

from lookahead.core.step_table import StepTable


def table() -> StepTable:
    return StepTable.from_function((1, 4, 16), (0, 8, 64), lambda lay, r, d: 10 + r + d / 2)


def test_it_reads_its_grid_and_interpolates_between_points():
    t = table()
    assert t("packed", 4, 8) == pytest.approx(18)
    assert t("packed", 10, 36) == pytest.approx(10 + 10 + 18)  # bilinear: exact for a bilinear function


def test_measured_steps_pull_the_table_toward_what_the_machine_does():
    t = table()
    for _ in range(50):
        t.observe("packed", 4, 8, 30.0)
    assert t("packed", 4, 8) == pytest.approx(30.0, rel=0.02)
    assert t("split", 4, 8) == pytest.approx(18)  # another layout's forward is another measurement
    assert t.observed == 50


def test_a_plain_step_refines_the_plain_price_of_every_layout():
    t = table()
    for _ in range(50):
        t.observe("packed", 16, 0, 40.0)
    assert all(t(lay, 16, 0) == pytest.approx(40.0, rel=0.02) for lay in ("padded", "packed", "split"))


def test_nonsense_measurements_are_ignored():
    t = table()
    for ms in (float("nan"), float("inf"), -1.0, 0.0):
        t.observe("packed", 4, 8, ms)
    assert t("packed", 4, 8) == pytest.approx(18) and t.observed == 0


def test_a_plain_step_scales_the_whole_curve_of_its_rows():
    """A machine that runs twice as slow shows it first in plain steps; the drafting prices of those rows follow
    (otherwise drafts would soon look cheaper than none)."""
    t = table()
    before = [t("packed", 16, d) for d in (0, 8, 64)]
    for _ in range(60):
        t.observe("packed", 16, 0, 2 * before[0])
    after = [t("packed", 16, d) for d in (0, 8, 64)]
    assert all(a == pytest.approx(2 * b, rel=0.03) for a, b in zip(after, before))
    assert t("split", 16, 8) == pytest.approx(after[1], rel=0.03)
    assert t("packed", 1, 8) == pytest.approx(15)  # rows it did not touch keep their curve


def test_no_draft_is_priced_below_a_plain_step():
    """A drafting step measured cheaper than plain (noise, or a plain price too high) cannot make the curve
    fall along the drafts axis."""
    t = table()
    for _ in range(50):
        t.observe("packed", 4, 8, 5.0)  # plain at 4 rows is 14
    prices = [t("packed", 4, d) for d in (0, 1, 4, 8, 36, 64)]
    assert prices == sorted(prices) and prices[0] == pytest.approx(14)


def test_the_least_marginal_price_is_the_cheapest_slope_below_the_drafts_asked_about():
    t = StepTable.from_function((1, 16), (0, 8, 64), lambda lay, r, d: 10 * r + (d if d <= 8 else 8 + (d - 8) / 4)
                                + (5 if lay == "split" and d else 0))
    assert t.least_marginal(("packed",), 16, 8) == pytest.approx(1.0)  # only the first interval is below 8
    assert t.least_marginal(("packed",), 16, 100) == pytest.approx(0.25)
    assert t.least_marginal(("packed", "split"), 16, 8) == pytest.approx(1.0)  # split's first slope is dearer
    assert t.least_marginal(("absent",), 16, 8) == 0.0  # no such layout: no floor


def test_the_table_read_at_one_row_count_gives_the_same_floats():
    # the planner prices hundreds of steps of one row count a plan: it reads the table there once (RowPrices)
    table = StepTable.from_function((1, 4, 16, 64), (0, 8, 64, 512),
                                    lambda lay, r, d: 3.1 + 0.37 * r + 0.013 * d * (2 if lay == "split" else 1))
    table.observe("packed", 7, 40, 9.9)
    for rows in (1, 3, 7, 16, 50, 100):
        fixed = table.at_rows(rows)
        for layout in ("packed", "split", "padded"):
            for drafts in (0, 1, 5, 8, 63, 64, 300, 511, 900):
                assert fixed(layout, drafts) == table(layout, rows, drafts)
