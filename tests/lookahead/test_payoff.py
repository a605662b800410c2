"""The measured safety net: drafting turns off at a batch size where its steps deliver fewer tokens/s, and probes back."""

from lookahead.payoff import Payoff


def feed(p: Payoff, rows: int, drafted_tok_s: float, plain_tok_s: float, steps: int) -> None:
    for _ in range(steps):
        p.record(rows, True, round(drafted_tok_s * 0.1), 0.1)
        p.record(rows, False, round(plain_tok_s * 0.1), 0.1)


def test_drafting_stays_on_until_both_kinds_are_measured():
    p = Payoff(min_steps=8)
    feed(p, 16, drafted_tok_s=10, plain_tok_s=100, steps=7)
    assert p.allow(16)  # 7 < 8 samples each: no verdict yet


def test_losing_drafts_turn_off_at_that_batch_size_only_and_are_probed():
    p = Payoff(min_steps=4, probe_every=5, margin=1.0)
    feed(p, 16, drafted_tok_s=150, plain_tok_s=160, steps=10)  # drafting steps deliver less at 16 rows
    feed(p, 1, drafted_tok_s=50, plain_tok_s=30, steps=10)  # and more at 1 row
    assert not p.pays(16) and p.pays(1)
    verdicts = [p.allow(16) for _ in range(10)]
    assert verdicts == [False] * 4 + [True] + [False] * 4 + [True]  # a probe every 5th step
    assert all(p.allow(1) for _ in range(10))


def test_drafting_comes_back_when_it_pays_again():
    p = Payoff(min_steps=4, probe_every=3, decay=0.5, margin=1.0)
    feed(p, 8, drafted_tok_s=80, plain_tok_s=100, steps=6)
    assert not p.allow(8)
    for _ in range(6):  # the text turned repetitive: the probes now win
        p.record(8, True, 20, 0.1)
    assert p.pays(8) and p.allow(8)


def test_sizes_share_classes_and_a_disabled_check_never_holds_drafting():
    p = Payoff(min_steps=4, margin=1.0)
    assert p.rates(9) is p.rates(16) and p.rates(8) is not p.rates(9)
    off = Payoff(min_steps=4, margin=1.0, enabled=False)
    feed(off, 16, drafted_tok_s=10, plain_tok_s=100, steps=10)
    assert all(off.allow(16) for _ in range(20))


def test_a_class_that_always_drafts_is_judged_against_the_tables_plain_price():
    p = Payoff(min_steps=4, probe_every=5, margin=1.0)
    for _ in range(6):  # 16 rows always drafted: 20 tokens in 0.2 s, where a plain step is priced 0.1 s
        p.record(16, True, 20, 0.2)
        p.expect_plain(16, 0.1)
    assert not p.pays(16)  # 100 tok/s drafting against 160 plain
    assert [p.allow(16) for _ in range(5)] == [False] * 4 + [True]
