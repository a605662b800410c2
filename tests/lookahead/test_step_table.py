"""The measured step-time table: interpolation between grid points and refinement by measured steps."""

import pytest

from lookahead.step_table import StepTable


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
