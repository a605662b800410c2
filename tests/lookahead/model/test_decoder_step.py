"""The decoder step (decoder_step.py) against the Hugging Face forward it replaces in decode steps: the same logits
(bitwise where the arithmetic is the same, within rounding where a fused matmul may sum in another order), the
same tokens through the engine, fp32 and bf16, 1 and 4 rows, with trees, padded and ragged, the pool read in
place and gathered; and the count of dispatched ops a layer that the step exists for."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import transformers as tf
from lookahead.core.draft import DraftTree, chain
from lookahead.model import decoder_step
from lookahead.model.runner import ModelRunner
from tests.lookahead.tiny_models import tiny

TREES = [DraftTree([5, 6, 7, 8], [-1, 0, 0, 1], [0, 1, 1, 2], [1.0] * 4), chain([9]),
         DraftTree([3, 4, 10], [-1, 0, 1], [0, 1, 2], [1.0] * 3), chain([11, 12])]
PROMPTS = [list(range(1, 30)), [4, 8, 15, 16, 23, 42], [7] * 12, list(range(40, 60))]


def runners(family: str, dtype: torch.dtype, monkeypatch, **overrides) -> tuple[ModelRunner, ModelRunner]:
    """(with the step, without it) over two copies of the same weights."""
    with_step = ModelRunner(tiny(family, **overrides).to(dtype))
    monkeypatch.setenv(decoder_step.ENV, "0")
    without = ModelRunner(tiny(family, **overrides).to(dtype))
    monkeypatch.delenv(decoder_step.ENV)
    return with_step, without


def batch_logits(runner: ModelRunner, rows: int, ragged: bool, in_place: bool = True) -> list[torch.Tensor]:
    """Each row's tree logits from one batch forward over PROMPTS[:rows]; `in_place=False`: the cache has no
    paged kernel, so attention reads gathered rows (CUDA, no compiler)."""
    cache = runner.new_batch_cache(rows, 64)
    if not in_place:
        cache.paged = None
    for prompt in PROMPTS[:rows]:
        single = runner.new_cache(64)
        runner.prefill(single, prompt)
        cache.admit(single, 16)
    trees = TREES[:rows]
    out = runner.verify_batch(cache, trees, max(len(t.tokens) for t in trees), ragged=ragged)
    assert in_place or cache.plan is None or cache.plan.read is None
    return [out[b][: len(t.tokens)] for b, t in enumerate(trees)]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "ragged"])
def test_step_gives_the_hf_forwards_logits(family, dtype, rows, ragged, monkeypatch):
    step, hf = runners(family, dtype, monkeypatch)
    assert step.step is not None and hf.step is None
    for a, b in zip(batch_logits(step, rows, ragged), batch_logits(hf, rows, ragged)):
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
        # fp32: the fused projections may sum in another order; bf16 (exact linears): one order per output
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 if dtype == torch.float32 else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_step_gathers_where_the_pool_cannot_be_read_in_place(dtype, monkeypatch):
    """No paged kernel (CUDA, no compiler): the step gathers rows and takes SDPA / exact attention."""
    step, hf = runners("qwen2", dtype, monkeypatch)
    for rows, ragged in ((1, False), (4, False), (4, True)):
        for got, expected in zip(batch_logits(step, rows, ragged, in_place=False), batch_logits(hf, rows, ragged)):
            assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
            # bf16: float64 attention against the kernel's float32 one, each rounded to bf16
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 if dtype == torch.float32 else 0.07)


def test_models_it_does_not_cover_keep_the_hf_forward(monkeypatch):
    assert ModelRunner(tiny("glm")).step is None  # another layer shape
    assert ModelRunner(tiny("mistral", sliding_window=16)).step is None  # a window inside its context
    monkeypatch.setenv(decoder_step.ENV, "0")
    assert ModelRunner(tiny("llama")).step is None


def test_fused_weights_are_not_held_twice():
    model = tiny("qwen2")
    before = sum(p.numel() for p in model.parameters())
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    runner = ModelRunner(model)
    attn = model.model.layers[0].self_attn
    qkv = runner.step.layers[0].qkv.weight
    assert attn.q_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert sum(p.numel() for p in model.parameters()) == before
    assert runner.weight_bytes(runner.device) == held  # each storage counted once


def top_level_ops_per_layer(runner: ModelRunner, layers: int) -> float:
    cache = runner.new_batch_cache(1, 128)
    single = runner.new_cache(128)
    runner.prefill(single, list(range(1, 40)))
    cache.admit(single, 64)
    for _ in range(2):
        runner.verify_batch(cache, [chain([5])], 1).argmax()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.verify_batch(cache, [chain([5])], 1).argmax()
    top = [e for e in prof.events()
           if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return len(top) / layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_one_row_verify_dispatches_at_most_40_ops_a_layer(dtype, monkeypatch):
    """Issue 37's count: a tiny 28-layer Qwen2, 1-row verify, top-level aten ops by the profiler (the Hugging
    Face forward dispatched 107-114 a layer)."""
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=28, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa")
    torch.manual_seed(0)
    step = ModelRunner(tf.Qwen2ForCausalLM(tf.Qwen2Config(**cfg)).to(dtype).eval())
    monkeypatch.setenv(decoder_step.ENV, "0")
    hf = ModelRunner(tf.Qwen2ForCausalLM(tf.Qwen2Config(**cfg)).to(dtype).eval())
    ours, theirs = top_level_ops_per_layer(step, 28), top_level_ops_per_layer(hf, 28)
    print(f"\n{dtype}: {ours:.1f} top-level aten ops a layer with the step, {theirs:.1f} through the HF forward")
    assert ours <= 40
    assert theirs > 2 * ours  # the count sees the difference (a probe that cannot fail would not)
