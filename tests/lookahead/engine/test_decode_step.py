"""One engine decode step through the decoder step (lookahead/model/decoder_step.py): the engine's tokens equal
those of the Hugging Face forward it replaces, fp32 and bf16, one row and four, with trees; and a step reads
the device back at most twice (on a GPU each read is a host sync that stalls the launch queue)."""

import pytest
import torch

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.core.buckets import round_up
from lookahead.core.step_table import StepTable
from lookahead.engine.engine import Engine
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model import decoder_step
from lookahead.model.runner import ModelRunner

from tests.lookahead.model.recorded_graphs import RecordedCuda
from tests.lookahead.model.test_static_step import torch_only_linears
from tests.lookahead.tiny_models import tiny

PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 2, 7], [3, 4, 3, 4, 8, 8, 8, 1], list(range(10, 40)), [2, 9, 2, 9, 2, 9, 2]]


def engine(family: str, dtype: torch.dtype, step: bool, monkeypatch, rows: int, static: bool = False) -> Engine:
    """`static`: the step at bucketed static shapes (static_step.py), as CUDA replays it, run eagerly here."""
    if not step:
        monkeypatch.setenv(decoder_step.ENV, "0")
    runner = ModelRunner(tiny(family).to(dtype), static_step=static)
    monkeypatch.delenv(decoder_step.ENV, raising=False)
    assert (runner.step is not None) == step
    la = LookaheadConfig(decoding_length=16, branch_length=6, adaptive=False)
    return Engine(LookaheadDecoder(runner, la, table=StepTable.flat()),
                  SchedulerConfig(max_batch_size=rows, max_tokens_per_step=64))


def run(e: Engine, prompts: list[list[int]], n: int) -> tuple[list[list[int]], int]:
    """Every prompt twice (the second time drafts from the first's outputs); tokens and drafts accepted."""
    out, accepted = [], 0
    for _ in range(2):
        handles = [e.add_request(p, stop=StopCriteria(n)) for p in prompts]
        for _ in range(3000):
            if all(h._finished.is_set() for h in handles):
                break
            e.step()
        results = [h.result() for h in handles]
        out += [r.tokens for r in results]
        accepted += sum(r.stats.accepted_drafts for r in results)
    return out, accepted


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 4])
def test_the_engine_decodes_the_same_tokens_through_the_step(family, dtype, rows, monkeypatch):
    prompts = PROMPTS[:rows] if rows > 1 else PROMPTS[2:3]
    ours, accepted = run(engine(family, dtype, True, monkeypatch, rows), prompts, 40)
    theirs, _ = run(engine(family, dtype, False, monkeypatch, rows), prompts, 40)
    assert ours == theirs
    assert accepted > 0, "no draft accepted: the trees went untested"


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_the_engine_decodes_the_same_tokens_through_the_static_step(family, dtype, rows, monkeypatch):
    prompts = PROMPTS[:rows] if rows > 1 else PROMPTS[2:3]
    e = engine(family, dtype, True, monkeypatch, rows, static=True)
    ours, accepted = run(e, prompts, 40)
    theirs, _ = run(engine(family, dtype, True, monkeypatch, rows), prompts, 40)
    assert ours == theirs
    assert accepted > 0, "no draft accepted: the trees went untested"
    path = e.step_path()  # what /stats shows: static shapes; on the CPU run eagerly, no graph
    assert path.decoder_step and path.static_shapes and not path.cuda_graphs and path.graphs_captured == 0
    buckets = e.cache.captured["static"]  # the steps ran at bucketed shapes
    assert buckets and sum(r.uses for r in buckets.values()) >= 10 and round_up(rows) in {s.rows for s, *_ in buckets}


HOST_READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_a_decode_step_reads_the_device_back_at_most_twice(static, monkeypatch):
    e = engine("qwen2", torch.float32, True, monkeypatch, 4, static)
    handles = [e.add_request(p, stop=StopCriteria(40)) for p in PROMPTS]
    while len(e.scheduler.running) < 4 or e.scheduler.prefilling is not None:
        e.step()
    for _ in range(3):  # every row has drafted once (its n-gram index is built)
        e.step()
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    before = sum(e.decode_steps.values())
    e.step()
    monkeypatch.undo()
    assert sum(e.decode_steps.values()) == before + 1 and e.decode_steps["drafting"] > 0
    print(f"\nhost reads in one decode step of 4 rows: {reads}")
    assert 1 <= len(reads) <= 2, reads  # the picks read back (the accepted tokens' source), nothing else
    assert not any(h._finished.is_set() and h.result().finish_reason == "error" for h in handles)


@pytest.mark.parametrize("dtype, path", [(torch.float32, "float64"), (torch.bfloat16, "float64"),
                                         (torch.bfloat16, "fixed_rows")], ids=["fp32", "bf16", "bf16-fixed-rows"])
@pytest.mark.parametrize("rows", [1, 4])
def test_the_engine_decodes_the_same_tokens_through_captured_steps(dtype, path, rows, monkeypatch):
    # CUDA's path end to end: static steps captured and replayed (recorded_graphs.py's stand-in, a graph's
    # semantics), every row drafting; the tokens equal those of the same engine's eager steps.
    torch_only_linears(monkeypatch, path)
    prompts = PROMPTS[:rows] if rows > 1 else PROMPTS[2:3]
    theirs, _ = run(engine("qwen2", dtype, True, monkeypatch, rows), prompts, 40)
    e = engine("qwen2", dtype, True, monkeypatch, rows, static=True)
    cuda = RecordedCuda(monkeypatch)
    e.runner.static.capture = True
    ours, accepted = run(e, prompts, 40)
    assert ours == theirs
    assert accepted > 0, "no draft accepted: the trees went untested"
    path = e.step_path()
    assert path.graphs_captured == cuda.captures >= 1 and path.graph_replays == cuda.replays >= 10
