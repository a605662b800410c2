"""The model runner's batch forwards: ragged (rows send only their own tree tokens) equals padded equals alone."""

import pytest
import torch

from lookahead.model import attention, batch_cache, decoder_step
from lookahead.core.planner import split_attention
from lookahead.core.draft import DraftTree
from lookahead.model.runner import DeviceClock, ModelRunner

from tests.lookahead.tiny_models import tiny

TREES = [
    DraftTree([5, 6, 7, 8], [-1, 0, 0, 1], [0, 1, 1, 2], [1.0] * 4),  # a branching tree, 3 drafts
    DraftTree([9], [-1], [0], [1.0]),  # root only
    DraftTree([4, 4], [-1, 0], [0, 1], [1.0] * 2),  # a chain of one draft
]
PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [2, 7], [6, 6, 6, 6]]  # different lengths: KV rows diverge
# One row of five drafting: attention goes row by row (attention.split_attention), not in the padded layout.
SPLIT_TREES = [TREES[1], TREES[0], TREES[1], DraftTree([7], [-1], [0], [1.0]), TREES[1]]
SPLIT_PROMPTS = PROMPTS + [[8, 1, 1], [5]]


@pytest.fixture(autouse=True)
def _hf_forward(monkeypatch):
    """These are the Hugging Face forward's layouts (attention.py: what GLM and any model outside the decoder
    step run); the decoder step is held to this forward in test_decoder_step.py."""
    monkeypatch.setenv(decoder_step.ENV, "0")


def batch(runner, prompts):
    cache = runner.new_batch_cache(len(prompts), max(len(p) for p in prompts) + 8)
    for p in prompts:
        single = runner.new_cache(len(p) + 8)
        runner.prefill(single, p)
        cache.admit(single, 8)
    return cache


@pytest.mark.parametrize("family", ["llama", "qwen3", "glm"])
@pytest.mark.parametrize("trees,prompts,allowed,split", [(TREES, PROMPTS, False, None),
                                                         (SPLIT_TREES, SPLIT_PROMPTS, True, None),
                                                         (SPLIT_TREES, SPLIT_PROMPTS, True, False)],
                         ids=["padded-attention", "split-attention", "packed-where-split-may-run"])
@pytest.mark.parametrize("read", ["in-place", "gathered"])
def test_ragged_forward_equals_padded_and_alone(family, trees, prompts, allowed, split, read, monkeypatch):
    """In place (paged_attention): every layout is one kernel call reading each row's own keys. Gathered (no kernel:
    CUDA, or no compiler): the layout the plan asked for runs."""
    if read == "gathered":
        monkeypatch.setattr(batch_cache, "kernel", lambda: None)
    runner = ModelRunner(tiny(family))
    runner.check_tree_masks()
    assert runner.ragged
    assert split_attention(len(trees), sum(len(t.tokens) > 1 for t in trees)) == allowed
    width = max(len(t.tokens) for t in trees)
    padded = runner.verify_batch(batch(runner, prompts), trees, width, ragged=False)
    cache = batch(runner, prompts)
    calls, paged = [], []
    row_by_row, in_place = attention._split_sdpa, attention._paged_sdpa
    monkeypatch.setattr(attention, "_split_sdpa", lambda *a, **k: calls.append(1) or row_by_row(*a, **k))
    monkeypatch.setattr(attention, "_paged_sdpa", lambda *a, **k: paged.append(1) or in_place(*a, **k))
    ragged = runner.verify_batch(cache, trees, width, ragged=True, split=split)
    assert bool(paged) == (read == "in-place") == (cache.paged is not None)
    if read == "gathered":
        assert bool(calls) == (allowed if split is None else split)  # the layout asked for is the one that ran
    assert cache.plan.ragged and cache.plan.tokens == sum(len(t.tokens) for t in trees)
    for b, (tree, prompt) in enumerate(zip(trees, prompts)):
        n = len(tree.tokens)
        assert ragged[b].shape[0] == n
        torch.testing.assert_close(ragged[b], padded[b][:n], atol=1e-4, rtol=1e-4)
        single = runner.new_cache(len(prompt) + 8)
        runner.prefill(single, prompt)
        torch.testing.assert_close(ragged[b], runner.verify(single, tree), atol=1e-4, rtol=1e-4)


def test_split_attention_is_refused_where_most_rows_draft():
    runner = ModelRunner(tiny("llama"))
    runner.check_tree_masks()
    with pytest.raises(AssertionError, match="quarter"):
        runner.verify_batch(batch(runner, PROMPTS), TREES, 4, ragged=True, split=True)


def test_ragged_keys_land_where_padded_ones_do():
    runner = ModelRunner(tiny("qwen2"))
    width = max(len(t.tokens) for t in TREES)
    caches = {}
    for ragged in (False, True):
        caches[ragged] = batch(runner, PROMPTS)
        runner.verify_batch(caches[ragged], TREES, width, ragged=ragged)
    for b, (tree, prompt) in enumerate(zip(TREES, PROMPTS)):
        n = len(prompt) + len(tree.tokens)  # the committed context and this row's own tree, in the row's range
        at = {ragged: slice(c.offsets[b], c.offsets[b] + n) for ragged, c in caches.items()}
        for lp, lr in zip(caches[False].layers, caches[True].layers):
            torch.testing.assert_close(lr.keys[at[True]], lp.keys[at[False]], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(lr.values[at[True]], lp.values[at[False]], atol=1e-5, rtol=1e-4)


def test_models_outside_the_packed_attention_stay_padded():
    model = tiny("llama")
    model.config._attn_implementation = "eager"  # not routed through lookahead's attention
    runner = ModelRunner(model)
    assert not runner.ragged
    width = max(len(t.tokens) for t in TREES)
    out = runner.verify_batch(batch(runner, PROMPTS), TREES, width, ragged=True)  # asks, gets padded
    assert all(o.shape[0] == width for o in out)


def test_a_second_runner_on_one_model_shares_the_first_ones_attention_path():
    model = tiny("llama")
    first, second = ModelRunner(model), ModelRunner(model)
    assert first.packed_attention and second.packed_attention  # the second no longer falls back to stock SDPA
    assert second._attn is first._attn and second._fast is first._fast
    second.check_tree_masks()
    assert second.ragged
    cache = batch(second, PROMPTS)
    calls = []
    real = attention._ragged_sdpa, attention._paged_sdpa
    try:
        attention._ragged_sdpa = lambda *a, **k: calls.append(1) or real[0](*a, **k)
        attention._paged_sdpa = lambda *a, **k: calls.append(1) or real[1](*a, **k)
        second.verify_batch(cache, TREES, 4, ragged=True)
    finally:
        attention._ragged_sdpa, attention._paged_sdpa = real
    assert calls  # the path serving runs (rows read in place, or gathered where there is no kernel)


def test_the_mask_check_tolerance_fits_the_dtype_and_still_catches_a_leak():
    from lookahead.model.runner import logits_agree

    ref = torch.linspace(-8, 8, 1000)
    rounded = ref.to(torch.bfloat16).float()  # one bf16 rounding: up to 0.03 at a logit of 8
    assert logits_agree(rounded, ref, torch.bfloat16)
    assert not logits_agree(rounded, ref, torch.float32)  # far beyond fp32's rounding
    leak = ref.clone()
    leak[::7] += 1.0  # a mask leak moves logits by O(1)
    assert not logits_agree(leak, ref, torch.bfloat16)


def test_the_device_clock_defers_to_the_wall_clock_off_cuda():
    clock = DeviceClock(torch.device("cpu"))
    clock.start()
    torch.ones(8) @ torch.ones(8)
    clock.stop()
    assert clock.ms() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a CUDA device")
def test_the_device_clock_times_queued_cuda_work_after_the_sync():
    clock = DeviceClock(torch.device("cuda"))
    a = torch.randn(2048, 2048, device="cuda")
    clock.start()
    for _ in range(8):
        a = a @ a / 2048
    clock.stop()
    a.sum().item()  # the step's sync
    ms = clock.ms()
    assert ms is not None and ms > 0
    assert clock.ms() is None  # read once per step
