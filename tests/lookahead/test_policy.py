from lookahead.policy import Calibration, CostCurve, CostModel, choose_counts, choose_drafts, choose_width

CPU = CostCurve({1: 44.6, 2: 64.4, 4: 63.8, 8: 67.5, 16: 81.6, 32: 111, 64: 149})


def test_cost_curve_interpolates_and_extrapolates():
    assert CPU(1) == 44.6
    assert abs(CPU(12) - (67.5 + (81.6 - 67.5) / 2)) < 1e-9
    assert CPU(128) > CPU(64)


def test_weak_drafts_are_not_worth_a_forward():
    # A 2-token forward costs 1.44 plain steps: a 30% guess does not pay.
    assert choose_drafts([1.0, 0.3], CPU, 1.0, 64) == 0


def test_strong_chain_gets_verified():
    probs = [1.0] + [0.95 ** i for i in range(1, 13)]
    assert choose_drafts(probs, CPU, 1.0, 64) == 12


def test_calibration_shrinks_an_overconfident_trie():
    cal = Calibration()
    for _ in range(50):
        cal.update(predicted=5.0, accepted=1)
    assert cal.factor < 0.3
    probs = [1.0, 0.6]  # worth a 2-token forward if trusted (1.6 tokens for 1.44 steps), not at 0.3x
    assert choose_drafts(probs, CPU, 1.0, 64) == 1
    assert choose_drafts(probs, CPU, cal.factor, 64) == 0


def test_flat_cost_takes_everything_offered():
    assert choose_drafts([1.0, 0.01, 0.01], CostCurve.flat(), 1.0, 64) == 2


def test_cost_model_is_linear_in_context_between_its_curves():
    model = CostModel(CostCurve({1: 30.0, 16: 60.0}), CostCurve({1: 40.0, 16: 100.0}), 500, 2000)
    assert model.curve_at(500)(16) == 60.0 and model.curve_at(2000)(16) == 100.0
    assert model.curve_at(1250)(16) == 80.0
    assert model.curve_at(100)(1) == 30.0  # below the short context: the short curve
    assert model.curve_at(3500)(16) == 140.0  # past the long one: extrapolated


def test_batch_width_shrinks_as_the_batch_grows():
    # Linear cost in tokens (compute-bound): drafts that pay for one row do not pay for sixteen.
    cost = CostCurve({1: 30.0, 2: 31.0, 4: 33.0, 8: 40.0, 16: 55.0, 64: 200.0, 256: 800.0})
    strong = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    assert choose_width([strong], cost, 256, 8) == 8
    assert choose_width([strong] * 16, cost, 256, 8) < 8


def test_batch_width_respects_the_token_cap_and_weak_rows():
    cost = CostCurve.flat()
    assert choose_width([[0.9] * 7] * 8, cost, 16, 8) == 2  # 8 rows x 2 = the whole cap
    assert choose_width([[], []], cost, 256, 8) == 1  # nothing to draft: plain step


def test_ragged_counts_take_the_likeliest_drafts_wherever_they_are():
    flat = lambda tokens, width, drafting: 1.0 + 0.1 * (tokens - 3)  # noqa: E731 - 3 rows; each extra token +10%
    counts = choose_counts([[0.9, 0.8, 0.05], [0.02], [0.7, 0.6]], flat, 256)
    assert counts == [2, 0, 2]  # the strong rows' leading drafts; the weak tail and weak row stay out
    assert choose_counts([[0.01], [0.02]], flat, 256) == [0, 0]  # nothing pays: plain step
    assert sum(choose_counts([[0.9] * 8] * 3, flat, 7)) == 4  # 3 roots + 4 drafts = the cap
    wide = lambda tokens, width, drafting: 1.0 + 0.5 * (width - 1)  # noqa: E731 - only the widest tree costs
    assert choose_counts([[0.9, 0.9, 0.9], [0.9, 0.9, 0.9]], wide, 256) == [3, 3]  # width bought once, used twice
    per_row = lambda tokens, width, drafting: 1.0 + 0.6 * drafting  # noqa: E731 - each drafting row costs a call
    assert choose_counts([[0.9, 0.9, 0.9], [0.5, 0.5]], per_row, 256) == [3, 0]  # the second row's call is not worth it
