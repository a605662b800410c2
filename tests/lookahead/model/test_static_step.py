"""The static-shape decode step (static_step.py) run eagerly on the CPU, as a CUDA graph replays it: the same
logits as the eager decoder step (bitwise in bf16's exact arithmetic, within rounding in fp32) for 1 and 4
rows with trees, every bucket axis padded; padding never touches a row's KV (only the trash slot); and
the buffers are refilled per step, so one bucket serves steps of other trees, rows and contexts; and, over a
stand-in for torch.cuda's graph API, a bucket is captured on its second use, replayed after, never during the
KV budget's probe, and left eager (warned once) when its capture fails."""

from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch

from lookahead.core.buckets import step_shape
from lookahead.core.draft import DraftTree, chain
from lookahead.model.runner import ModelRunner
from tests.lookahead.model.test_decoder_step import PROMPTS, TREES
from tests.lookahead.tiny_models import tiny


def pair(family: str, dtype: torch.dtype) -> tuple[ModelRunner, ModelRunner]:
    """(static, eager) runners over two copies of the same weights."""
    return (ModelRunner(tiny(family).to(dtype), static_step=True), ModelRunner(tiny(family).to(dtype), static_step=False))


def filled(runner: ModelRunner, prompts: list[list[int]]):
    cache = runner.new_batch_cache(len(prompts), 96)
    for prompt in prompts:
        single = runner.new_cache(96)
        runner.prefill(single, prompt)
        cache.admit(single, 32)
    return cache


def logits(runner: ModelRunner, cache, trees: list[DraftTree]) -> list[torch.Tensor]:
    out = runner.verify_batch(cache, trees, max(len(t.tokens) for t in trees))
    return [out[b][: len(t.tokens)].clone() for b, t in enumerate(trees)]


def test_the_runner_takes_the_static_step_only_where_asked():
    assert ModelRunner(tiny("qwen2"), static_step=True).static is not None
    assert ModelRunner(tiny("qwen2")).static is None  # the CPU's default: its own shapes
    assert ModelRunner(tiny("glm"), static_step=True).static is None  # no decoder step, nothing to make static


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_a_static_step_gives_the_eager_steps_logits(family, dtype, rows):
    static, eager = pair(family, dtype)
    trees = TREES[:rows] if rows != 3 else TREES[:3]  # 3 rows: a padding row in the bucket of 4
    a_cache, b_cache = filled(static, PROMPTS[:rows]), filled(eager, PROMPTS[:rows])
    for a, b in zip(logits(static, a_cache, trees), logits(eager, b_cache, trees)):
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 if dtype == torch.float32 else 0)
    # the keys and values written for the trees are the eager step's too (commit keeps them as context)
    for la, lb in zip(a_cache.layers, b_cache.layers):
        for off, n in zip(a_cache.offsets, [len(p) + 4 for p in PROMPTS[:rows]]):
            torch.testing.assert_close(la.keys[off : off + n], lb.keys[off : off + n], rtol=0,
                                       atol=1e-5 if dtype == torch.float32 else 0)


def test_padding_writes_only_the_trash_slot():
    static, _ = pair("qwen2", torch.bfloat16)
    cache = filled(static, PROMPTS[:3])
    trees = [TREES[0], chain([9]), TREES[2]]  # width 4; 3 rows in a bucket of 4: one padding row
    width = 4
    for layer in cache.layers:  # everything past the rows' prompts is a sentinel the step must not touch
        for off, p in zip(cache.offsets, PROMPTS[:3]):
            layer.keys[off + len(p) + width : off + 96 + 32].fill_(7.0)
    whole = cache.whole_pools()
    before = [k.clone() for k, _ in whole]  # (compared as bits: an unwritten slot may hold a NaN)
    static.verify_batch(cache, trees, width)
    assert static.static.shape_of(3, width, max(cache.lengths) + width) == step_shape(3, 4, 33)
    for (k, _), old in zip(whole, before):
        changed = (k.view(torch.int16) != old.view(torch.int16)).flatten(1).any(1).nonzero().flatten().tolist()
        allowed = {cache.trash} | {off + l + i for off, l in zip(cache.offsets, cache.lengths) for i in range(width)}
        assert changed and set(changed) <= allowed, sorted(set(changed) - allowed)
        assert cache.trash in changed  # the padding row and the bucket's padding tokens went there


def test_one_bucket_serves_steps_of_other_trees_rows_and_contexts():
    static, eager = pair("qwen2", torch.bfloat16)
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[1]]
    a_cache, b_cache = filled(static, prompts), filled(eager, prompts)
    steps = [[TREES[0], TREES[1], TREES[2]], [chain([5, 6]), TREES[2], chain([1])], [TREES[2], chain([3]), TREES[0]]]
    for trees in steps:
        for a, b in zip(logits(static, a_cache, trees), logits(eager, b_cache, trees)):
            assert torch.equal(a, b)
        keeps = [[0, 1] if len(t.tokens) > 1 else [0] for t in trees]
        a_cache.commit(keeps)
        b_cache.commit(keeps)
    records = a_cache.captured["static"]
    assert len(records) == 1 and next(iter(records.values())).uses == 3  # one bucket, its buffers refilled
    a_cache.release(1)
    b_cache.release(1)  # two rows now: a smaller bucket
    for a, b in zip(logits(static, a_cache, steps[0][:2]), logits(eager, b_cache, steps[0][:2])):
        assert torch.equal(a, b)
    assert len(a_cache.captured["static"]) == 2
    a_cache.close()
    assert not a_cache.captured  # the records hold the pool's addresses: they go with it


class FakeCuda:
    """torch.cuda's graph API as static_step calls it, on the CPU: a capture runs the step once (as a real capture's
    warm-up does), a replay only counts. For the control flow around capture, not for what a graph computes."""

    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.replays, self.captures, self.fail = 0, 0, fail
        stream = SimpleNamespace(wait_stream=lambda other: None)
        fake = self

        class Graph:
            def replay(self):
                fake.replays += 1

        @contextmanager
        def graph(g, pool=None, stream=None, capture_error_mode="global"):
            assert pool is not None and capture_error_mode == "thread_local"
            if fake.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.captures += 1
            yield

        for name, value in (("CUDAGraph", Graph), ("graph", graph), ("Stream", lambda device: stream),
                            ("current_stream", lambda device: stream), ("stream", lambda s: nullcontext()),
                            ("graph_pool_handle", lambda: object())):
            monkeypatch.setattr(torch.cuda, name, value)


def test_a_bucket_is_captured_on_its_second_use_and_replayed_after(monkeypatch):
    static, eager = pair("qwen2", torch.bfloat16)
    cuda = FakeCuda(monkeypatch)
    static.static.capture = True
    a_cache, b_cache = filled(static, PROMPTS[:2]), filled(eager, PROMPTS[:2])
    trees = TREES[:2]
    first = logits(static, a_cache, trees)  # a one-off shape stays eager
    assert cuda.captures == 0 and static.static.captures == 0
    second = logits(static, a_cache, trees)  # captured: the graph's output buffer holds this step's logits
    assert cuda.captures == 1 and static.static.captures == 1 and cuda.replays == 1
    for a, b, c in zip(first, second, logits(eager, b_cache, trees)):
        assert torch.equal(a, c) and torch.equal(b, c)
    logits(static, a_cache, trees)
    assert cuda.replays == 2 and cuda.captures == 1  # replayed, never captured again
    assert static.step_path().graphs_captured == 1 and static.step_path().graph_replays == 2


def test_the_activation_probe_never_captures_and_a_failed_capture_stays_eager(monkeypatch, caplog):
    static, eager = pair("qwen2", torch.bfloat16)
    cuda = FakeCuda(monkeypatch, fail=True)
    static.static.capture = True
    cache = filled(static, PROMPTS[:1])
    for _ in range(2):
        cache.begin_static(4)
        static.static.run(cache, TREES[:1], 4, exact=True, eager=True)  # the probe's way
        cache.commit([[0]])
    assert cuda.captures == 0 and not caplog.records
    want = logits(eager, filled(eager, PROMPTS[:1]), TREES[:1])
    cache = filled(static, PROMPTS[:1])
    for _ in range(3):
        got = logits(static, cache, TREES[:1])
        assert torch.equal(got[0], want[0])  # the eager step's logits, every time
    warned = [r for r in caplog.records if "not captured as a CUDA graph" in r.getMessage()]
    assert len(warned) == 1 and cuda.replays == 0  # tried once, then that bucket stays eager
