"""torch.cuda's graph API on the CPU, with a CUDA graph's semantics: a capture records the aten ops the step
function dispatches, a replay runs that record again.

A CUDA graph replays the kernels its capture launched, with the arguments they had then: the same buffers at
the same addresses, every shape and every Python number as it was at capture. Whatever the step function
decided in Python from the data (a branch, a length, an `.item()`) is frozen into the graph. So a step function
that is only right when run afresh each step is wrong when replayed, and on the GPU that would show as wrong
tokens, not as an error. This stand-in reproduces exactly that on the CPU:

- inside `torch.cuda.graph(g)`, a `TorchDispatchMode` runs each aten op and records (op, its arguments, its
  outputs); the arguments are the tensors themselves, so a replay reads the buffers as they are then, as the
  graph's kernels read their addresses;
- `g.replay()` runs the record in order and writes each op's result into the tensors the capture returned
  (the fixed output addresses), so later ops and the caller read the replay's values;
- when the capture ends, every floating-point tensor the record allocated is filled with NaN: a real capture
  computes nothing, so a caller that reads an output before a replay would read garbage there too;
- the graphs share one memory pool (static_step.py captures them so), so a replay may overwrite whatever
  another graph's replay left there: a replay fills every other graph's tensors with NaN, and a caller
  still reading an earlier step's logits after the next replay would read NaN;
- a host read inside the capture (`.item()`, `int(t)`, `.tolist()`, `.numpy()`, `.cpu()`) raises as CUDA's
  does ("operation not permitted when stream is capturing"), so static_step.py leaves that bucket eager.

Ops that run outside the dispatcher (a ctypes kernel over raw pointers, the Triton interpreter) are not
recorded: the step function must be given torch-only paths here (the exact linears' float64 path, or the
GPU's fixed-row GEMMs).
"""

from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)  # `.item()`, `int(t)`, ...
HOST_METHODS = ("tolist", "numpy", "cpu")  # host reads that dispatch no op (or none that says so)
REFUSED = "operation not permitted when stream is capturing"


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):  # an opaque tensor (oneDNN's packed weight): an input, never fresh
        return id(t)


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "RecordedGraph") -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError(f"{REFUSED} (a host read inside the capture: {func})")
        out = func(*args, **kwargs)
        inputs = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        fresh = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _storage(t) not in inputs]
        self.graph.ops.append((func, args, kwargs, out))
        self.graph.fresh += fresh
        return out


def _refuse(name: str):
    def read(self, *args, **kwargs):
        raise RuntimeError(f"{REFUSED} (a host read inside the capture: Tensor.{name})")
    return read


class RecordedGraph:
    """A `torch.cuda.CUDAGraph` stand-in: the ops of one capture, replayed over the same tensors."""

    def __init__(self, cuda: "RecordedCuda") -> None:
        self.cuda = cuda
        self.ops: list[tuple] = []  # (op, args, kwargs, outputs) in dispatch order
        self.fresh: list[torch.Tensor] = []  # tensors the capture allocated (the graph's private memory)

    def replay(self) -> None:
        self.cuda.replays += 1
        for other in self.cuda.graphs:  # one shared pool: this replay may overwrite what the others left
            if other is not self:
                other._poison()
        with torch.inference_mode():
            for func, args, kwargs, out in self.ops:
                new = func(*args, **kwargs)
                for old, now in zip(tree_leaves(out), tree_leaves(new)):
                    if isinstance(old, torch.Tensor) and _storage(old) != _storage(now):
                        old.copy_(now)  # the capture's output address holds the replay's value

    @torch.inference_mode()
    def _poison(self) -> None:
        for t in self.fresh:
            if t.is_floating_point():
                t.fill_(float("nan"))


class RecordedCuda:
    """Installs the stand-in over torch.cuda's graph API, as static_step.py calls it (`monkeypatch` undoes it).
    `fail`: every capture raises, as one the device refuses. Counts captures, replays, and the ops recorded."""

    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.captures, self.replays, self.fail = 0, 0, fail
        self.graphs: list[RecordedGraph] = []
        stream = SimpleNamespace(wait_stream=lambda other: None)
        cuda = self

        @contextmanager
        def graph(g: RecordedGraph, pool=None, stream=None, capture_error_mode="global"):
            assert pool is not None and capture_error_mode == "thread_local"
            if cuda.fail:
                raise RuntimeError(REFUSED)
            saved = {name: getattr(torch.Tensor, name) for name in HOST_METHODS}
            for name in HOST_METHODS:
                setattr(torch.Tensor, name, _refuse(name))
            try:
                with _Recorder(g):
                    yield
            finally:
                for name, method in saved.items():
                    setattr(torch.Tensor, name, method)
            g._poison()
            cuda.captures += 1
            cuda.graphs.append(g)

        for name, value in (("CUDAGraph", lambda: RecordedGraph(cuda)), ("graph", graph),
                            ("Stream", lambda device: stream), ("current_stream", lambda device: stream),
                            ("stream", lambda s: nullcontext()), ("graph_pool_handle", lambda: object())):
            monkeypatch.setattr(torch.cuda, name, value)
