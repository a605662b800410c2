"""Step prices: the start-up model, its per-shape corrections from measured forwards, and the host-side term."""

from lookahead.attention import SPLIT_ROW_SHARE
from lookahead.step_price import StepPrices

CURVE = lambda tokens: 10.0 + tokens  # noqa: E731 - the start-up model: 2 rows, 8 tokens = 18 ms vs 12 ms


def test_the_model_prices_padded_ragged_and_split_forwards():
    prices = StepPrices()
    assert prices.relative_cost(2, CURVE, ragged=False)(8, 4, 2) == 18 / 12
    # Ragged, both rows drafting: linears on the 5 real tokens, attention over 2 x 4; priced halfway between.
    assert prices.relative_cost(2, CURVE, ragged=True)(5, 4, 2) == (15 + 18) / 2 / 12
    # Ragged, one row of four drafting: attention goes row by row, so the 6 real tokens count, plus that row's calls.
    assert prices.relative_cost(4, CURVE, ragged=True)(6, 3, 1) == (16 + SPLIT_ROW_SHARE * 11) / 14
    assert prices.relative_cost(2, CURVE, ragged=False)(2, 1, 0) == 1.0  # a plain step is the unit


def test_measured_forwards_correct_their_own_shape():
    prices = StepPrices()
    for _ in range(3):
        prices.observe_forward((2, 1, False), 12.0, predicted=12.0)
        prices.observe_forward((2, 4, False), 36.0, predicted=18.0)  # 2-row forwards 4 wide really cost twice the price
    assert abs(prices.relative_cost(2, CURVE, ragged=False)(8, 4, 2) - 3.0) < 1e-9
    # Width 2 is unmeasured: it borrows the nearest width's correction at these rows, the plain step's.
    assert prices.relative_cost(2, CURVE, ragged=False)(4, 2, 2) == 14 / 12


def test_too_few_samples_are_not_trusted():
    prices = StepPrices()
    for _ in range(2):
        prices.observe_forward((2, 4, False), 36.0, predicted=18.0)
    assert prices.correction((2, 4, False)) == 1.0
    prices.observe_forward((2, 4, False), 36.0, predicted=18.0)
    assert prices.correction((2, 4, False)) == 2.0


def test_an_unmeasured_drafting_shape_is_priced_like_the_measured_plain_step_beside_it():
    """The bug this guards: plain 13-row steps measured at 1.7x their one-row price while a fresh drafting shape
    stayed at the bare model, so drafts looked cheaper than no drafts at all."""
    prices = StepPrices()
    for _ in range(3):
        prices.observe_forward((13, 1, False), 1.7 * CURVE(13), predicted=CURVE(13))
    cost = prices.relative_cost(13, CURVE, ragged=True)
    assert cost(14, 2, 1) > 1.0
    assert abs(cost(14, 2, 1) - (CURVE(14) + SPLIT_ROW_SHARE * CURVE(1)) / CURVE(13)) < 1e-9


def test_the_nearest_measured_shape_lends_its_correction():
    prices = StepPrices()
    for _ in range(3):
        prices.observe_forward((9, 1, False), 1.5, predicted=1.0)
        prices.observe_forward((12, 1, False), 1.7, predicted=1.0)
        prices.observe_forward((12, 3, True), 1.4, predicted=1.0)
    assert prices.correction((11, 1, False)) == 1.7  # row counts: 12 is nearer than 9
    assert prices.correction((12, 4, True)) == 1.4  # same rows: the same attention layout first
    assert prices.correction((12, 2, False)) == 1.7
    assert StepPrices().correction((5, 1, False)) == 1.0  # nothing measured: the model as it is


def test_host_side_work_of_drafting_steps_is_added_to_their_price():
    prices = StepPrices()
    prices.observe_host(2, False, 1.0)
    prices.observe_host(2, True, 4.0)  # drafting steps of 2 rows took 3 ms more than plain ones outside the forward
    assert abs(prices.relative_cost(2, CURVE, ragged=False)(8, 4, 2) - (18 + 3) / 12) < 1e-9
    assert prices.relative_cost(2, CURVE, ragged=False)(2, 1, 0) == 1.0  # a plain step pays none of it
