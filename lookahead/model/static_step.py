"""The decode step at static shapes: padded to a bucket, its inputs in fixed buffers, replayed as a CUDA graph.

The decoder step (decoder_step.py) runs a layer in ~36 ops; on a GPU each is
still a launch from Python, ~5-10 us each, and a 28-layer step is then ~1,000
launches, several milliseconds before the first weight is read. A CUDA graph
records the step's kernels once and replays them with one launch. It can only
replay what it recorded: the same shapes over the same buffers. So here:

- Every step runs at its bucket's shape (`buckets.step_shape`: rows, tree
  width and the positions attention reads, each rounded up to a power of
  two). Padding rows and padding tokens compute and are dropped.
- What changes from step to step is a few small tensors the host fills
  (`StaticInputs`: token ids, depths, each tree's ancestry, the rows' pool
  offsets and lengths, the step's width), copied into the bucket's fixed
  device buffers before the replay. Everything else is computed from them
  on the device inside the graph: the positions, the tree mask, each token's
  pool slot (`dst`) and each read position's slot (`src`).
- Padding writes go to the pool's trash slot (`BatchKVCache.trash`, a slot no
  row owns), and padding rows read only it, so no padding reaches a row's KV;
  a real row's padding tokens write inside its own tree's slots, as the
  eager step's do, and a row never writes past `width` tokens of its range.
- Attention gathers each row's positions 0..kv-1 (`index_select` over the
  pool, clamped to what the row has written) and runs the same SDPA, or the
  exact float64 path, as the eager step's gathered attention: the same
  arithmetic, over more columns that the mask leaves out.

A bucket is captured the second time it is used (a one-off shape, such as a
start-up probe, stays eager) and kept while it is among the `max_graphs`
last used; its graph holds the pool's addresses, so the records live on the
cache (`BatchKVCache.captured`) and go with it. Graphs share one memory pool,
so all of them together hold about one step's activations (each step's
output is read before the next step replays). A capture that fails leaves
that bucket eager, logged once. Off CUDA the same function runs eagerly
every step: the CPU tests prove the static path token for token against the
eager step, and the CUDA graph adds nothing to the arithmetic but replay.

`LOOKAHEAD_CUDA_GRAPHS=0` runs the eager step on CUDA instead (no static shapes, no graphs).
Why torch.cuda.CUDAGraph and not torch.compile: no compiler toolchain at
serving time, no recompilation on a new shape (a bucket is a capture, about
one step's time), and the buffers a graph reads are explicit here rather
than guarded by a compiler (docs/architecture.md).
"""

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lookahead.core.buckets import StepShape, step_shape
from lookahead.core.draft import DraftTree
from lookahead.model import attention, tree_attention
from lookahead.model.decoder_step import DecoderStep, StepBatch
from lookahead.model.tree_mask import device_mask, pack_trees

log = logging.getLogger(__name__)

GRAPHS_ENV = "LOOKAHEAD_CUDA_GRAPHS"
MAX_GRAPHS = 32  # captured buckets kept per cache: each holds only its kernels' parameters (the pool is shared)


def graphs_wanted(device: torch.device) -> bool:
    """Capture decode steps as CUDA graphs here: on CUDA, unless LOOKAHEAD_CUDA_GRAPHS=0."""
    return device.type == "cuda" and os.environ.get(GRAPHS_ENV, "1") != "0"


@dataclass
class StaticInputs:
    """One bucket's step inputs: host staging (pinned on CUDA) and the device buffers a graph reads."""

    shape: StepShape
    host_ints: torch.Tensor  # [2 rows width + 3 rows + 1] int64: ids, depths | sizes, lengths, offsets | width
    host_anc: torch.Tensor  # [rows, width, width] bool
    ints: torch.Tensor  # the same on the device
    anc: torch.Tensor
    host: tuple[np.ndarray, np.ndarray] = ()  # (host_ints, host_anc) as arrays over the same memory

    def __post_init__(self) -> None:
        self.host = (self.host_ints.numpy(), self.host_anc.numpy())  # once: a step's fill touches no tensor

    @staticmethod
    def new(shape: StepShape, device: torch.device) -> "StaticInputs":
        n = 2 * shape.tokens + 3 * shape.rows + 1
        pin = device.type == "cuda"
        return StaticInputs(
            shape,
            torch.zeros(n, dtype=torch.long, pin_memory=pin),
            torch.zeros((shape.rows, shape.width, shape.width), dtype=torch.bool, pin_memory=pin),
            torch.zeros(n, dtype=torch.long, device=device),
            torch.zeros((shape.rows, shape.width, shape.width), dtype=torch.bool, device=device))

    def fill(self, trees: list[DraftTree], lengths: list[int], offsets: list[int], width: int) -> None:
        """The host half of a step: every row's tree, padded as batch_tree_inputs pads it (copies of the root
        that see only themselves), then padding rows (size 0); one copy per buffer to the device."""
        s = self.shape
        ints, anc = self.host
        ids, depths = ints[: s.tokens].reshape(s.rows, s.width), ints[s.tokens : 2 * s.tokens].reshape(s.rows, s.width)
        sizes, lens, offs = (ints[2 * s.tokens + i * s.rows : 2 * s.tokens + (i + 1) * s.rows] for i in range(3))
        ints[:] = 0
        anc[:] = False
        anc[len(trees):] = np.eye(s.width, dtype=bool)  # padding rows see only themselves
        pack_trees(trees, ids, depths, anc, sizes)
        n = len(trees)
        lens[:n], offs[:n], ints[-1] = lengths, offsets, width
        self.ints.copy_(self.host_ints, non_blocking=True)
        self.anc.copy_(self.host_anc, non_blocking=True)


@dataclass
class StepGraph:
    """A bucket's inputs and, once captured, its graph and the logits it writes."""

    inputs: StaticInputs
    uses: int = 0
    graph: object | None = None  # torch.cuda.CUDAGraph
    logits: torch.Tensor | None = None  # [rows * width, vocab] float: the graph's output buffer
    failed: bool = False  # capture failed once: this bucket stays eager


@dataclass
class StaticBatch:
    """A static step's batch and what attention reads, all computed on the device from a bucket's buffers."""

    batch: StepBatch  # ids, positions, mask, dst [rows x width]
    src: torch.Tensor  # [rows * kv] pool slot each row reads at each position (the gathered path)
    offsets: torch.Tensor  # [rows] each row's first slot (padding rows: the trash slot)
    lengths: torch.Tensor  # [rows] committed tokens
    depths: torch.Tensor  # [rows * width]
    reach: torch.Tensor  # [rows * width] the deepest tree position a token attends: its depth; -1 past the step's
    #                      width and in padding rows (their own slot may lie past the row's range, even the pool's)
    anc: torch.Tensor  # [rows, width, width] bool
    walk: torch.Tensor  # [rows] virtual positions tree attention walks: length + width (padding rows: 1)


def static_batch(inputs: StaticInputs, trash: int) -> StaticBatch:
    """The step's batch and its reads, computed on the device from the bucket's buffers alone (so a graph
    replays them)."""
    s = inputs.shape
    R, W, K, T = s.rows, s.width, s.kv, s.tokens
    ints, dev = inputs.ints, inputs.ints.device
    ids, depths = ints[:T].view(R, W), ints[T : 2 * T].view(R, W)
    sizes, lengths, offsets = ints[2 * T : 2 * T + R], ints[2 * T + R : 2 * T + 2 * R], ints[2 * T + 2 * R : 2 * T + 3 * R]
    width = ints[-1]
    live = (sizes > 0)[:, None]  # [R, 1] a running row, not padding
    cols, w = torch.arange(K, device=dev)[None], torch.arange(W, device=dev)[None]  # [1, K], [1, W]
    mask = device_mask(inputs.anc, sizes, lengths, K)  # [R, 1, W, K]
    start = (offsets + lengths)[:, None]  # [R, 1] the row's first slot this step writes
    dst = torch.where(live & (w < width), start + w, trash)  # [R, W]
    last = (lengths + width - 1)[:, None]  # [R, 1] the row's last slot written this step
    src = torch.where(live, offsets[:, None] + torch.minimum(cols, last), trash)  # [R, K]
    positions = lengths[:, None] + depths
    batch = StepBatch(ids.flatten(), positions.flatten(), mask, dst.flatten(), R, W, None)
    reach = torch.where(live & (w < width), depths, -1)
    return StaticBatch(batch, src.flatten(), torch.where(live[:, 0], offsets, trash), lengths, depths.flatten(),
                       reach.flatten(), inputs.anc, torch.where(live[:, 0], lengths + width, 1))


class StaticSteps:
    """Runs decode steps at bucketed shapes through `step`, captured as CUDA graphs on CUDA (module doc)."""

    def __init__(self, step: DecoderStep, modules: list[torch.nn.Module], device: torch.device,
                 capture: bool | None = None, max_graphs: int = MAX_GRAPHS, fused: bool | None = None,
                 variant: str = "") -> None:
        """`fused`: exact steps attend with tree_attention.py's kernel (fp32, over the pool in place) instead of
        gathering and float64; None: where LOOKAHEAD_TREE_ATTENTION=triton asks for it and Triton can run.
        `variant`: a name for graphs captured with other kernels inside (the GPU check's other exact linears),
        so that they are never replayed for this one's steps over the same cache."""
        self.step, self.modules, self.device, self.variant = step, modules, device, variant
        if fused is None:
            fused = tree_attention.wanted()
        self.tree_attention = fused and tree_attention.usable(device)
        if capture is None:
            capture = graphs_wanted(device)
        self.capture = capture
        self.max_graphs = max_graphs
        self._pool = None  # the graphs' shared memory pool, and the one stream they are captured on (first capture)
        self._stream = None
        self.captures = 0  # graphs captured (a count for /stats and the GPU check)
        self.replays = 0

    def shape_of(self, rows: int, width: int, kv_len: int) -> StepShape:
        return step_shape(rows, width, kv_len)

    def run(self, cache, trees: list[DraftTree], width: int, exact: bool, eager: bool = False
            ) -> tuple[torch.Tensor, StepShape]:
        """(logits [bucket rows * bucket width, vocab] float, the bucket): row b's tree at rows
        [b * W, b * W + len(tree)).
        The caller has begun the forward (`cache.begin_static(width)`). `eager`: never capture (the KV
        budget's activation probe measures this step run eagerly)."""
        shape = self.shape_of(len(trees), width, max(cache.lengths) + width)
        records: OrderedDict = cache.captured.setdefault("static", OrderedDict())
        key = (shape, exact, self.tree_attention, self.variant)  # (two StaticSteps over one cache: their own graphs)
        rec = records.get(key)
        if rec is None:
            rec = records[key] = StepGraph(StaticInputs.new(shape, self.device))
        records.move_to_end(key)
        rec.inputs.fill(trees, cache.lengths, cache.offsets, width)
        rec.uses += 1
        fn = None
        if rec.graph is None:  # (a replay needs no step function: the graph holds its kernels)
            fn = self._function(cache, rec.inputs, exact)
            if self.capture and not eager and not rec.failed and rec.uses >= 2:
                self._capture(rec, fn, key)
        while len(records) > self.max_graphs:  # the least recently used bucket goes (its graph with it)
            records.popitem(last=False)
        if rec.graph is not None:
            rec.graph.replay()
            self.replays += 1
            return rec.logits, shape
        return fn(), shape

    def _function(self, cache, inputs: StaticInputs, exact: bool) -> Callable[[], torch.Tensor]:
        step, modules, trash = self.step, self.modules, cache.trash
        pools = cache.whole_pools()
        sdpa = attention.exact_sdpa if exact else attention._tree_sdpa
        R, W, K = inputs.shape.rows, inputs.shape.width, inputs.shape.kv

        fused = exact and self.tree_attention

        @torch.inference_mode()
        def forward() -> torch.Tensor:
            sb = static_batch(inputs, trash)
            src = sb.src
            if fused:  # exact fp32 tree attention over the pool in place (tree_attention.py)
                paths = tree_attention.ancestor_paths(sb.anc, sb.depths.view(R, W)).flatten(0, 1)

                def attend(i, q, keys, values, batch):
                    return tree_attention.attend(q, keys, values, sb.offsets, sb.lengths, sb.reach, paths, sb.walk,
                                                 R, W, step.scale, K)

                return step.forward(sb.batch, pools, attend, exact)

            def attend(i, q, keys, values, batch):
                kvh, d = keys.shape[1], keys.shape[2]
                k = keys.index_select(0, src).view(R, K, kvh, d).transpose(1, 2)  # [R, kv_heads, K, dim]
                v = values.index_select(0, src).view(R, K, kvh, d).transpose(1, 2)
                padded = q.view(R, W, *q.shape[1:]).transpose(1, 2)  # [R, heads, W, dim]
                out, _ = sdpa(modules[i], padded, k, v, batch.mask, scaling=step.scale)
                return out.reshape(q.shape)

            return step.forward(sb.batch, pools, attend, exact)

        return forward

    def _capture(self, rec: StepGraph, fn: Callable[[], torch.Tensor], key) -> None:
        """Warm up on a side stream (cuBLAS picks its kernels, the allocator sizes its blocks), then record."""
        try:
            if self._pool is None:
                self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)
            side = self._stream
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # one stream: the pool is shared fully; thread_local: the replica's other threads (metrics reading
            # the device's memory) may call the driver while the engine thread captures
            with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                rec.logits = fn()
            rec.graph = graph
            self.captures += 1
        except Exception as e:  # noqa: BLE001 - any failure: this bucket runs eagerly, as it did before
            rec.failed, rec.graph, rec.logits = True, None, None
            log.warning("decode step %s not captured as a CUDA graph (%s); it runs eagerly", key, e)
