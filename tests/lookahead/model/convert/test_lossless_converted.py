"""Lookahead on converted Qwen(1) and ChatGLM3 models == model.generate, single-stream and batched.

The point of converting: the native architectures take lookahead's 4D tree masks (check_tree_masks),
so greedy lookahead must reproduce plain greedy decoding token for token.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.lookahead.engine.test_engine import PROMPTS
from tests.lookahead.engine.test_lossless_architectures import assert_single_stream_lossless
from tests.lookahead.engine.test_lossless_batched import assert_batched_lossless


@pytest.fixture(scope="module", params=["qwen1", "chatglm3"])
def model(request, converted):
    return AutoModelForCausalLM.from_pretrained(converted[request.param].dst, dtype=torch.float32).eval()


def test_single_stream_greedy_identical_to_generate(model):
    assert_single_stream_lossless(model, prompts=PROMPTS)


def test_batched_greedy_identical_to_generate(model):
    assert_batched_lossless(model)
