"""Greedy lookahead == model.generate, token for token, on tiny random models of each family."""

import pytest
import torch

from lookahead import LookaheadConfig, LookaheadDecoder, SamplingParams, StopCriteria
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner

from tests.lookahead.tiny_models import FAMILIES, tiny

PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 2, 7], [3, 4, 3, 4, 8, 8, 8, 1], list(range(10, 40))]


def hf_greedy(model, prompt, n, **kw):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", ["hier", "par", "one"])
def test_greedy_identical_to_generate(family, mode):
    assert_single_stream_lossless(tiny(family), mode)


def assert_single_stream_lossless(model, mode: str = "hier", prompts=PROMPTS) -> None:
    """Greedy lookahead == generate on every prompt, twice (the second pass drafts from the first's memory)."""
    runner = ModelRunner(model)
    runner.check_tree_masks()
    # Flat cost: always verify the whole tree, so the draft path is exercised as hard as possible.
    cfg = LookaheadConfig(decoding_length=16, branch_length=6, decoding_mode=mode, adaptive=False)
    dec = LookaheadDecoder(runner, cfg, table=StepTable.flat())
    accepted = 0
    for prompt in prompts:
        ref = hf_greedy(model, prompt, 40)
        for _ in range(2):
            g = dec.generate(prompt, stop=StopCriteria(max_new_tokens=40))
            assert g.tokens == ref
            accepted += g.stats.accepted_drafts
    assert accepted > 0, "no draft was ever accepted: the tree path went untested"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_repetition_penalty_identical_to_generate(family):
    model = tiny(family)
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(decoding_length=16, branch_length=6, adaptive=False),
                           table=StepTable.flat())
    params = SamplingParams(repetition_penalty=1.3)
    for prompt in PROMPTS:
        ref = hf_greedy(model, prompt, 30, repetition_penalty=1.3)
        for _ in range(2):
            assert dec.generate(prompt, stop=StopCriteria(max_new_tokens=30), sampling=params).tokens == ref


def test_adaptive_policy_is_lossless_too():
    model = tiny("llama")
    runner = ModelRunner(model)
    dec = LookaheadDecoder(runner, LookaheadConfig(decoding_length=32, branch_length=8))
    for prompt in PROMPTS:
        ref = hf_greedy(model, prompt, 40)
        for _ in range(2):
            assert dec.generate(prompt, stop=StopCriteria(max_new_tokens=40)).tokens == ref


def test_lookahead_off_is_the_plain_loop():
    model = tiny("qwen2")
    dec = LookaheadDecoder(ModelRunner(model), LookaheadConfig(), table=StepTable.flat())
    g = dec.generate(PROMPTS[0], stop=StopCriteria(max_new_tokens=20), lookahead=LookaheadConfig(enabled=False))
    assert g.tokens == hf_greedy(model, PROMPTS[0], 20)
    assert g.stats.steps == 20 and g.stats.draft_tokens == 0
