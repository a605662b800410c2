"""A request's step bookkeeping: plain steps whose drafts were cut still teach the calibration (shadow replay)."""

import random

from lookahead.config import LookaheadConfig
from lookahead.core.calibration import CalibrationTable
from lookahead.model.sampling import SamplingParams
from lookahead.engine.sequence import SHADOW_DRAFTS, Sequence, StopCriteria
from lookahead.core.trie import TokenTrie
from lookahead.core.verify import Acceptance

PATTERN = [11, 12, 13, 14, 15, 16]


def plain_steps(seq: Sequence, memory: TokenTrie, calibration: CalibrationTable, tokens: list[int]) -> None:
    """Run plain steps (every draft cut) that emit `tokens` one by one, as the model would."""
    for tok in tokens:
        tree = seq.propose(memory)
        seq.advance(tree.truncated(0), Acceptance([], [tok]), calibration)


def test_cut_proposals_are_replayed_once_their_tokens_are_out():
    seq = Sequence(PATTERN * 3, StopCriteria(64), SamplingParams(), LookaheadConfig(decoding_length=8, branch_length=4))
    memory, cal = TokenTrie(5), CalibrationTable()
    plain_steps(seq, memory, cal, PATTERN[:1])  # the shadow still waits for the tokens its depth needs
    assert cal.by_match == {} and len(seq._shadows) == 1
    plain_steps(seq, memory, cal, PATTERN[1:] + PATTERN)  # the model keeps repeating: the drafts were right
    learned = cal.by_match
    assert learned, "plain steps taught nothing"
    total = sum(c.accepted for c in learned.values())
    prior = sum(3.0 for _ in learned)  # Calibration's prior accepted count
    assert total > prior + 5  # whole branches would have been accepted
    assert seq.own_calibration.factor > 0.5


def test_wrong_drafts_lower_the_estimate_without_verifying_them():
    seq = Sequence(PATTERN * 3, StopCriteria(6), SamplingParams(), LookaheadConfig(decoding_length=8, branch_length=4))
    memory, cal = TokenTrie(5), CalibrationTable()
    plain_steps(seq, memory, cal, PATTERN[::-1][1:] + PATTERN[-1:])  # the model walks the pattern backwards
    assert seq.finished
    assert cal.by_match
    assert all(c.factor < 0.75 for c in cal.by_match.values())  # below the prior's 3/4


def test_a_finished_request_resolves_its_pending_shadows():
    seq = Sequence(PATTERN * 3, StopCriteria(2), SamplingParams(), LookaheadConfig(decoding_length=8, branch_length=4))
    memory, cal = TokenTrie(5), CalibrationTable()
    plain_steps(seq, memory, cal, PATTERN[:1])
    assert seq._shadows and not cal.by_match
    last = seq.propose(memory)  # one token left: nothing to draft
    seq.advance(last, Acceptance([], [PATTERN[1]]), cal)
    assert seq.finished and not seq._shadows and cal.by_match


def test_a_floor_builds_the_shadows_rows_and_no_draft_the_plan_cannot_take():
    """Below break-even nothing is built past the shadow's rows, so a plain step teaches what it taught before."""
    rng = random.Random(1)
    prompt = [rng.randrange(4) for _ in range(400)]  # a small vocabulary: many continuations, at many odds
    la = LookaheadConfig(decoding_length=40, branch_length=6)
    full = Sequence(prompt, StopCriteria(64), SamplingParams(), la).propose(TokenTrie(7))
    assert full.num_drafts > SHADOW_DRAFTS
    cal = CalibrationTable()
    for floor in (0.1, 0.2, 0.3, 1.0):
        seq = Sequence(prompt, StopCriteria(64), SamplingParams(), la)
        tree = seq.propose(TokenTrie(7), floor)
        kept = max(SHADOW_DRAFTS, sum(p >= floor for p in full.probs[1:]))
        assert tree.tokens == full.tokens[: 1 + kept]
        probs = seq.candidates(tree, cal, floor).probs
        assert probs and min(probs) >= floor or not probs
        assert probs == seq.candidates(tree, cal).probs[: len(probs)]  # a prefix: best first, cut at the floor
