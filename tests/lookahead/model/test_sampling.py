"""Lookahead sampling keeps the exact distribution of plain sampling."""

import random

import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import lookahead.engine.sequence as seq_mod
from lookahead import LookaheadConfig, LookaheadDecoder, SamplingParams, StopCriteria
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner
from lookahead.model.sampling import apply_repetition_penalty, draw, warp
from lookahead.core.verify import Acceptance

from tests.lookahead.tiny_models import tiny

VOCAB = 8
PROMPT = [1, 2, 3]


def test_warpers_match_transformers():
    torch.manual_seed(1)
    scores = torch.randn(1, 50) * 3
    ctx = torch.tensor([[3, 7, 7, 20]])
    p = SamplingParams(do_sample=True, temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.2)
    ref = RepetitionPenaltyLogitsProcessor(1.2)(ctx, scores.clone())
    for w in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.8)):
        ref = w(ctx, ref)
    ours = warp(apply_repetition_penalty(scores[0], ctx[0], 1.2), p)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref[0]))
    assert torch.allclose(ours[~torch.isinf(ours)], ref[0][~torch.isinf(ref[0])])


def exact_two_token_distribution(model, params: SamplingParams) -> dict[tuple[int, int], float]:
    with torch.inference_mode():
        first = model(torch.tensor([PROMPT])).logits[0, -1]
        p1 = warp(first, params).softmax(-1)
        seconds = model(torch.tensor([PROMPT + [t] for t in range(VOCAB)])).logits[:, -1]
        p2 = torch.stack([warp(row, params).softmax(-1) for row in seconds])
    return {(a, b): float(p1[a] * p2[a, b]) for a in range(VOCAB) for b in range(VOCAB)}


def sampled_counts(params: SamplingParams, draws: int, seeded: bool = True) -> tuple[dict, dict, int]:
    model = tiny("llama", vocab_size=VOCAB)
    with torch.no_grad():
        model.lm_head.weight.div_(4.0)  # keep the distribution broad, so many cells get mass
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(decoding_length=16, branch_length=3, max_query_length=1,
                                                          adaptive=False),
                           table=StepTable.flat())
    rng = random.Random(0)
    dec.memory.add_sequence([rng.randrange(VOCAB) for _ in range(400)])  # drafts for every context
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    for seed in range(draws):
        g = dec.generate(PROMPT, stop=StopCriteria(max_new_tokens=2),
                         sampling=SamplingParams(**{**params.__dict__, "seed": seed if seeded else None}))
        key = tuple(g.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += g.stats.accepted_drafts
    return counts, exact_two_token_distribution(model, params), accepted


def chi2_pvalue(counts, expected_probs, draws):
    cells = sorted(expected_probs, key=expected_probs.get, reverse=True)
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for c in cells:  # pool the cells expected under 5 draws
        e = expected_probs[c] * draws
        if e >= 5:
            obs.append(counts.get(c, 0))
            exp.append(e)
        else:
            pool_o += counts.get(c, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded-row-by-row", "unseeded-rows-drawn-together"])
@pytest.mark.parametrize("params", [
    SamplingParams(do_sample=True),
    SamplingParams(do_sample=True, temperature=0.8, top_k=5, top_p=0.9),
])
def test_lookahead_sampling_matches_the_exact_distribution(params, seeded):
    draws = 3000
    counts, expected, accepted = sampled_counts(params, draws, seeded)
    assert accepted > draws // 4, "drafts were rarely accepted: the tree path went untested"
    assert chi2_pvalue(counts, expected, draws) > 1e-3


def test_the_chi_square_test_catches_a_biased_acceptance_rule(monkeypatch):
    """Negative control: a rule that takes the first draft child half the time must be detected."""
    real_accept = seq_mod.accept
    coin = random.Random(1)

    def biased(tree, choose):
        kids = tree.children()[0]
        if kids and coin.random() < 0.5:
            tok, row = next(iter(kids.items()))
            return Acceptance([row], [tok, choose(row, [tok])])
        return real_accept(tree, choose)

    monkeypatch.setattr(seq_mod, "accept", biased)
    counts, expected, _ = sampled_counts(SamplingParams(do_sample=True), 3000)
    assert chi2_pvalue(counts, expected, 3000) < 1e-3


def test_same_seed_same_output():
    model = tiny("qwen2")
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(adaptive=False), table=StepTable.flat())
    p = SamplingParams(do_sample=True, temperature=0.9, top_p=0.95, seed=1234)
    a = dec.generate(PROMPT, stop=StopCriteria(max_new_tokens=30), sampling=p).tokens
    b = dec.generate(PROMPT, stop=StopCriteria(max_new_tokens=30), sampling=p).tokens
    assert a == b


@pytest.mark.parametrize("params", [
    SamplingParams(do_sample=True),
    SamplingParams(do_sample=True, temperature=0.7, top_k=6, top_p=0.8),
])
def test_device_draws_follow_the_warped_distribution(params):
    """The exponential race behind `draw`: many rows of the same logits, one draw each, counted per token
    against warp(logits).softmax; filtered tokens are never drawn."""
    torch.manual_seed(0)
    logits = torch.randn(12) * 2
    exact = warp(logits, params).softmax(-1)
    draws = draw(logits.expand(20000, -1), params)
    counts = torch.bincount(draws, minlength=12)
    assert counts[exact == 0].sum() == 0
    assert chi2_pvalue({t: int(counts[t]) for t in range(12)}, {t: float(exact[t]) for t in range(12)}, 20000) > 1e-3


def test_device_draws_catch_a_biased_race():
    """Negative control: a race with uniform instead of exponential times (a plausible slip) must be detected."""
    torch.manual_seed(0)
    exact = (torch.randn(12) * 2).softmax(-1)
    probs = exact.expand(20000, -1)
    counts = torch.bincount((probs / torch.rand_like(probs)).argmax(-1), minlength=12)
    assert chi2_pvalue({t: int(counts[t]) for t in range(12)}, {t: float(exact[t]) for t in range(12)}, 20000) < 1e-3
