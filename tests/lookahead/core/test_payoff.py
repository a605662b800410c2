"""The measured safety net: both kinds of step are measured per batch size, the one delivering more tokens/s runs,
and the other is probed."""

from lookahead.core.payoff import Payoff


def feed(p: Payoff, rows: int, drafted_tok_s: float, plain_tok_s: float, steps: int) -> None:
    for _ in range(steps):
        p.record(rows, True, round(drafted_tok_s * 0.1), 0.1)
        p.record(rows, False, round(plain_tok_s * 0.1), 0.1)


def test_until_both_kinds_are_measured_they_take_turns():
    p = Payoff(min_steps=3)
    kinds = []
    for _ in range(6):
        kinds.append(p.allow(4))
        p.allow(1)  # one row is never held: not a turn taken
        p.record(4, kinds[-1], 4, 0.1)
    assert kinds == [True, False] * 3  # proposing first, then the kind with fewer steps
    assert p.pays(4) is not None and p.pays(2) is None  # measured at 3-4 rows; not yet at 2


def test_losing_drafts_turn_off_at_that_batch_size_only_and_are_probed():
    p = Payoff(min_steps=4, probe_every=5, margin=1.0)
    feed(p, 16, drafted_tok_s=150, plain_tok_s=160, steps=10)  # drafting steps deliver less at 16 rows
    feed(p, 2, drafted_tok_s=50, plain_tok_s=30, steps=10)  # and more at 2 rows
    assert p.pays(16) is False and p.pays(2) is True
    assert [p.allow(16) for _ in range(10)] == ([False] * 4 + [True]) * 2  # drafting probed every 5th step
    assert [p.allow(2) for _ in range(10)] == ([True] * 4 + [False]) * 2  # and a winning class still holds
    # one step in 5, so the plain rate it is judged against stays measured


def test_drafting_comes_back_when_it_pays_again():
    p = Payoff(min_steps=4, probe_every=3, decay=0.5, margin=1.0)
    feed(p, 8, drafted_tok_s=80, plain_tok_s=100, steps=6)
    assert not p.allow(8)
    for _ in range(6):  # the text turned repetitive: the probes now win
        p.record(8, True, 20, 0.1)
    assert p.pays(8) and p.allow(8)


def test_a_stale_plain_rate_is_refreshed_by_the_probes():
    """Plain steps got faster (shorter contexts, say) while drafting won: the held probes see it, and drafting
    that no longer beats the fresh plain rate stops."""
    p = Payoff(min_steps=4, probe_every=2, decay=0.5, margin=1.0)
    feed(p, 4, drafted_tok_s=120, plain_tok_s=100, steps=6)
    assert p.pays(4)
    for _ in range(8):
        if not p.allow(4):
            p.record(4, False, 16, 0.1)  # plain now delivers 160 tok/s
        else:
            p.record(4, True, 12, 0.1)
    assert p.pays(4) is False


def test_sizes_share_classes_and_a_disabled_check_never_holds_drafting():
    p = Payoff(min_steps=4, margin=1.0)
    assert p.rates(9) is p.rates(16) and p.rates(8) is not p.rates(9)
    off = Payoff(min_steps=4, margin=1.0, enabled=False)
    feed(off, 16, drafted_tok_s=10, plain_tok_s=100, steps=10)
    assert all(off.allow(16) for _ in range(20))


def test_a_lone_row_is_never_held_however_its_drafts_did():
    """Held steps teach the calibration nothing, so at one row a verdict from the first steps would starve the
    probes that could overturn it; there the planner alone decides."""
    p = Payoff(min_steps=4, margin=1.0)
    feed(p, 1, drafted_tok_s=10, plain_tok_s=100, steps=10)
    assert all(p.allow(1) for _ in range(40))
    assert Payoff(min_rows=1, min_steps=4).allow(1) is True  # measuring first, as any class
