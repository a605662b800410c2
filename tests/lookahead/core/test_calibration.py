"""The calibration of the trie's estimates: measured acceptance over predicted, per match length."""

from lookahead.core.calibration import Calibration, CalibrationTable
from lookahead.core.planner import RowDrafts, plan_step
from lookahead.core.step_table import StepTable


def test_calibration_shrinks_an_overconfident_trie_until_its_drafts_no_longer_pay():
    cal = Calibration()
    for _ in range(50):
        cal.update(predicted=5.0, accepted=1)
    assert cal.factor < 0.3
    # a 2-token step costs 1.44 plain ones: a draft rated 0.6 pays if trusted, not at the calibrated rate
    cpu = StepTable.from_function((1, 2), (0, 1, 2), lambda _, r, d: 44.6 * (1 + 0.44 * d))
    assert plan_step([RowDrafts([0.6])], cpu, 64, ragged=True).counts == [1]
    assert plan_step([RowDrafts([0.6 * cal.factor])], cpu, 64, ragged=True).counts == [0]


def test_each_match_length_keeps_its_own_rate():
    table = CalibrationTable()
    for _ in range(30):
        table.update(1, predicted=1.0, accepted=0)
        table.update(4, predicted=1.0, accepted=1)
    assert table.factor(1) < 0.2 and table.factor(4) > 0.95
    assert table.factor(7) == Calibration().factor  # unseen: the prior
