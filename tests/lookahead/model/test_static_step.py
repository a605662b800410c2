"""The static-shape decode step (static_step.py) run eagerly on the CPU: the same logits as the eager decoder
step (bitwise in bf16's exact arithmetic, within rounding in fp32) for 1 and 4 rows with trees, every bucket
axis padded; padding never touches a row's KV (only the trash slot); the buffers are refilled per step, so one
bucket serves steps of other trees, rows and contexts.

Captured, over a stand-in for torch.cuda's graph API with a graph's semantics (recorded_graphs.py: a capture
records the dispatched ops with every Python value frozen, a replay runs them again over the same tensors): a
bucket is captured on its second use and replayed after, never during the KV budget's probe, and left eager
(warned once) when its capture fails; a replay gives, bit for bit, the logits and KV of the same step run
afresh, in fp32, bf16 and bf16 through the GPU's fixed-row GEMMs; a host read inside the step function fails
its capture."""

import pytest
import torch

from lookahead.core.buckets import step_shape
from lookahead.core.draft import DraftTree, chain
from lookahead.model import exact_linear, fast_linear
from lookahead.model.runner import ModelRunner
from tests.lookahead.model.test_decoder_step import PROMPTS, TREES
from tests.lookahead.model.recorded_graphs import RecordedCuda
from tests.lookahead.tiny_models import tiny


def torch_only_linears(monkeypatch, path: str) -> None:
    """Exact linears through torch ops alone, so a recorded graph holds them (recorded_graphs.py): "float64", the
    CPU's fallback, or "fixed_rows", the GPU's fixed-shape GEMMs. The native kernel calls C over raw pointers."""
    monkeypatch.setattr(exact_linear, "kernel", lambda: None)
    if path == "fixed_rows":
        monkeypatch.setattr(fast_linear, "exact_path", lambda mod: fast_linear.FixedRowsLinear())


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


def test_a_bucket_is_captured_on_its_second_use_and_replayed_after(monkeypatch):
    torch_only_linears(monkeypatch, "float64")
    static, eager = pair("qwen2", torch.bfloat16)
    cuda = RecordedCuda(monkeypatch)
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
    cuda = RecordedCuda(monkeypatch, fail=True)
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


@pytest.mark.parametrize("dtype, path", [(torch.float32, "float64"), (torch.bfloat16, "float64"),
                                         (torch.bfloat16, "fixed_rows")], ids=["fp32", "bf16", "bf16-fixed-rows"])
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_a_replayed_graph_gives_the_logits_of_the_step_run_afresh(family, dtype, path, monkeypatch):
    # A replay runs what the capture recorded, every Python value frozen (recorded_graphs.py): if the step
    # function took anything from the data on the host, steps after the capture would come out wrong here.
    torch_only_linears(monkeypatch, path)
    static, eager = pair(family, dtype)
    uncaptured = ModelRunner(tiny(family).to(dtype), static_step=True)
    cuda = RecordedCuda(monkeypatch)
    static.static.capture = True
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[1]]
    caches = [filled(r, prompts) for r in (static, uncaptured, eager)]
    # One bucket (3 rows in 4, width 4) over other trees, depths, contexts and widths; then a row leaves (2 in 2)
    steps = [[TREES[0], TREES[1], TREES[2]], [TREES[0], TREES[1], TREES[2]], [chain([5, 6]), TREES[2], chain([1])],
             [TREES[2], chain([3]), TREES[0]], [chain([4]), chain([4]), chain([4])],
             [TREES[1], chain([2, 8, 8])], [chain([7]), TREES[0]]]
    for i, trees in enumerate(steps):
        if i == 5:
            for c in caches:
                c.release(1)
        got, fresh, plain = (logits(r, c, trees) for r, c in zip((static, uncaptured, eager), caches))
        for a, b, c in zip(got, fresh, plain):
            assert torch.equal(a, b), f"step {i}: the replay differs from the same step run afresh"
            assert a.argmax(-1).tolist() == c.argmax(-1).tolist()
        keeps = [[0, 1] if len(t.tokens) > 1 else [0] for t in trees]
        for c in caches:
            c.commit(keeps)
    # 3 rows at width 4 (steps 0-3) and 2 rows at width 4 (5-6), each captured on its second use and replayed
    # from then on; step 4's width-1 bucket, used once, ran eagerly
    assert cuda.captures == 2 and cuda.replays == 3 + 1 == static.static.replays
    kept = [(off, n) for off, n in zip(caches[0].offsets, caches[0].lengths)]  # each row's committed KV
    assert kept == list(zip(caches[1].offsets, caches[1].lengths))
    for a, b in zip(caches[0].layers, caches[1].layers):  # the KV the replays wrote is the fresh steps'
        for off, n in kept:
            assert torch.equal(a.keys[off : off + n], b.keys[off : off + n])
            assert torch.equal(a.values[off : off + n], b.values[off : off + n])
    print(f"\nops a replay runs: {[len(g.ops) for g in cuda.graphs]}")


@pytest.mark.parametrize("read", [lambda t: int(t[0]), lambda t: t.tolist()[0]], ids=["int", "tolist"])
def test_a_host_read_in_the_step_function_fails_its_capture(read, monkeypatch, caplog):
    # The stand-in refuses a host read inside a capture as CUDA does, so a step function that syncs would
    # never be captured: this is the check the replay test relies on, shown to fire.
    torch_only_linears(monkeypatch, "float64")
    static, _ = pair("qwen2", torch.bfloat16)
    cuda = RecordedCuda(monkeypatch)
    static.static.capture = True
    real = static.step.forward
    monkeypatch.setattr(static.step, "forward", lambda batch, *a: real(batch, *a) if read(batch.ids) >= 0 else None)
    cache = filled(static, PROMPTS[:1])
    for _ in range(3):
        logits(static, cache, TREES[:1])
        cache.commit([[0]])
    assert cuda.captures == 0 and cuda.replays == 0
    assert any("not captured as a CUDA graph" in r.getMessage() for r in caplog.records)
