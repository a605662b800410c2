"""Lookahead on converted Qwen(1) and ChatGLM3 models == model.generate, single-stream and batched.

The point of converting: the native architectures take lookahead's 4D tree masks (check_tree_masks),
so greedy lookahead must reproduce plain greedy decoding token for token.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.policy import CostModel
from lookahead.runner import ModelRunner

from ..test_engine import PROMPTS
from ..test_lossless_architectures import hf_greedy
from ..test_lossless_batched import assert_batched_lossless


@pytest.fixture(scope="module", params=["qwen1", "chatglm3"])
def model(request, converted):
    return AutoModelForCausalLM.from_pretrained(converted[request.param].dst, dtype=torch.float32).eval()


def test_single_stream_greedy_identical_to_generate(model):
    runner = ModelRunner(model)
    runner.check_tree_masks()
    dec = LookaheadDecoder(runner, LookaheadConfig(decoding_length=16, branch_length=6, adaptive=False),
                           cost=CostModel.flat())
    accepted = 0
    for prompt in PROMPTS:
        ref = hf_greedy(model, prompt, 40)
        for _ in range(2):  # the second pass drafts from the memory of the first
            g = dec.generate(prompt, stop=StopCriteria(max_new_tokens=40))
            assert g.tokens == ref
            accepted += g.stats.accepted_drafts
    assert accepted > 0, "no draft was ever accepted: the tree path went untested"


def test_batched_greedy_identical_to_generate(model):
    assert_batched_lossless(model)
