"""The GPU check's sections on random-weight models of real shapes: P profile, C timing, D load, E memory.

Random weights cost nothing to fetch and time the same as trained ones; what these sections measure is the
step, not the text.
"""

import time
import warnings
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch.autograd import DeviceType

from benchmarks.gpu.models import Sizes, activities, shaped_model
from lookahead.core.draft import chain
from benchmarks.gpu.record import SectionRecord, Throttle
from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.engine.engine import Engine
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model import attention, tree_attention, triton_build, triton_gemm
from lookahead.core.buckets import step_shape
from lookahead.model.runner import DeviceClock, ModelRunner
from lookahead.model.static_step import StaticInputs, StaticSteps, static_batch

TOP_KERNELS = 15


def _context(runner: ModelRunner, vocab: int, ctx: int, room: int):
    """A single cache holding `ctx` random tokens (seeded by ctx), with `room` entries to spare; and the tokens."""
    tokens = torch.randint(0, vocab, (ctx,), generator=torch.Generator().manual_seed(ctx)).tolist()
    single = runner.new_cache(ctx + room)
    runner.prefill(single, tokens)
    return single, tokens


def _batch(runner: ModelRunner, single, rows: int, room: int):
    cache = runner.new_batch_cache(rows, single.length + room)
    for _ in range(rows):
        cache.admit(single, room)
    return cache


# ---- P. profile ---------------------------------------------------------------------------------------------
def profile_step(step, device: str, layers: int, top: int = TOP_KERNELS) -> dict:
    """One step's wall time (the best of 3, unprofiled, to its argmax read back) and, from one profiled run,
    the kernels with the most device time: on CUDA the GPU kernels (and copies); on CPU the top-level ops,
    which are what runs there. `kernel_share_of_wall`: their summed time over the unprofiled wall time, the
    part of the step the device is busy; the rest is the host launching work and waiting."""
    for _ in range(2):
        step()
    wall = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        wall = min(wall, (time.perf_counter() - t0) * 1e3)
    with torch.profiler.profile(activities=activities(device)) as prof:
        step()
    events = prof.events()
    top_level = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    if device == "cuda":
        kernels = [(e.name, e.time_range.elapsed_us()) for e in events if e.device_type == DeviceType.CUDA]
    else:
        kernels = [(e.name, e.cpu_time_total) for e in top_level]
    calls, total = defaultdict(int), defaultdict(float)
    for name, us in kernels:
        calls[name] += 1
        total[name] += us
    busy = sum(total.values())
    ranked = sorted(total, key=total.get, reverse=True)[:top]
    aten = sum(e.name.startswith("aten::") for e in top_level)
    return {
        "wall_ms": wall,
        "kernel_us": busy,
        "kernel_share_of_wall": busy / (wall * 1e3),
        "kernel_calls": len(kernels),
        "top_level_aten_ops": aten,
        "aten_ops_per_layer": aten / layers,
        "top": [{"name": n[:240], "calls": calls[n], "total_us": round(total[n], 1)} for n in ranked],
        "top_share_of_kernels": sum(total[n] for n in ranked) / busy if busy else None,
    }


def profile(rec: SectionRecord, sz: Sizes) -> None:
    """One decode step of the shape, at each (rows, width) of `profile_batches` after `profile_context` tokens
    in every row: exact at the step's own shapes, exact at bucketed static shapes (static_step.py: CUDA graphs
    replayed on CUDA, the same function run eagerly elsewhere), the stock kernels, and exact through the
    Hugging Face forward the decoder step replaces."""
    model = shaped_model(sz.profile_shape, sz.device)
    runner = ModelRunner(model, static_step=True)
    runner.check_tree_masks()
    widest = max(w for _, w in sz.profile_batches)
    single, tokens = _context(runner, sz.profile_shape["vocab_size"], sz.profile_context, widest + 1)
    rec.result.update(shape=sz.profile_shape, context=sz.profile_context, dtype=str(runner.dtype), steps={})
    own, static = runner.step, runner.static
    # the static step with the exact fp32 tree attention kernel (tree_attention.py), where Triton runs
    fused = StaticSteps(own, runner._attention_modules(), runner.device, fused=True) if own is not None else None
    fused = fused if fused is not None and fused.tree_attention else None
    # the static step with every exact linear through triton_gemm.py's kernel, where Triton runs (its own graphs)
    gemm, gemm_paths = None, {}
    if own is not None and runner._fast.exact and triton_gemm.usable(runner.device):
        gemm = StaticSteps(own, runner._attention_modules(), runner.device, fused=False, variant="triton_gemm")
        gemm_paths = {id(m): triton_gemm.TritonLinear(m) for m in runner._fast.linears}
    arms = (("exact", True, own, None), ("exact_static", True, own, static), ("exact_static_fused", True, own, fused),
            ("exact_static_triton_gemm", True, own, gemm), ("stock", False, own, None),
            ("exact_hf_forward", True, None, None))
    kernel_arms = ("exact_static_fused", "exact_static_triton_gemm")  # first GPU runs: a failure is a finding
    broken: set[str] = set()  # arms that failed once (the kernel's): not run again

    @contextmanager
    def linears_of(static_of):
        """Every exact linear through the Triton GEMM while `static_of` is the GEMM arm's."""
        swap = static_of is gemm and gemm is not None
        old = {id(m): m._lookahead_exact for m in runner._fast.linears} if swap else {}
        for m in runner._fast.linears if swap else ():
            m._lookahead_exact = gemm_paths[id(m)]
        try:
            yield
        finally:
            for m in runner._fast.linears if swap else ():
                m._lookahead_exact = old[id(m)]
    for rows, width in sz.profile_batches:
        cache = _batch(runner, single, rows, widest + 1)
        trees = [chain(tokens[:width])] * rows
        for name, exact, step_of, static_of in arms:
            if rec.over() or step_of is None and own is None or static_of is None and name.startswith("exact_static") \
                    or name in broken:
                continue

            def step(cache=cache, trees=trees, width=width, exact=exact):
                return runner.verify_batch(cache, trees, width, ragged=runner.ragged, exact=exact).argmax()

            runner.step, runner.static = step_of, static_of
            try:
                with linears_of(static_of):
                    rec.put(("steps", f"{rows}x{width}", name), profile_step(step, sz.device, runner.num_layers))
            except Exception as e:  # noqa: BLE001 - the kernel's first GPU run: its failure is a finding, not the end
                if name not in kernel_arms:
                    raise
                rec.put(("steps", f"{rows}x{width}", name), {"error": f"{type(e).__name__}: {e}"[:2000]})
                broken.add(name)
            finally:
                runner.step, runner.static = own, static
        if static is not None and not rec.over():  # the static steps' tokens are the eager step's
            picks = []
            fused_ok = fused is not None and "exact_static_fused" not in broken
            gemm_ok = gemm is not None and "exact_static_triton_gemm" not in broken
            for static_of in (None, static, fused if fused_ok else None, gemm if gemm_ok else None):
                if static_of is None and picks:
                    picks.append(None)
                    continue
                runner.static = static_of
                with linears_of(static_of):
                    out = runner.verify_batch(cache, trees, width, ragged=runner.ragged)
                picks.append([out[b][:width].argmax(-1).tolist() for b in range(rows)])
            runner.static = static
            rec.put(("steps", f"{rows}x{width}", "static_argmax_equals_eager"), picks[0] == picks[1])
            if fused_ok:
                rec.put(("steps", f"{rows}x{width}", "static_fused_argmax_equals_eager"), picks[0] == picks[2])
            if gemm_ok:
                rec.put(("steps", f"{rows}x{width}", "static_triton_gemm_argmax_equals_eager"), picks[0] == picks[3])
        cache.close()
    if static is not None:
        rec.put(("cuda_graphs",), {"captured": static.captures, "replays": static.replays, "capturing": static.capture})
    attention_kernels(rec, sz, fused is not None)
    gemm_rows(rec, sz, model)
    if fused is not None and "exact_static_fused" not in broken:
        attention_tiles(rec, sz)


GEMM_ROWS = (1, 16, 128, 256, 512, 1024)


def gemm_rows(rec: SectionRecord, sz: Sizes, model) -> None:
    """Is the stock GEMM row-invariant, and what does a row cost at each call size? For the first layer's MLP
    weights and the LM head, in the model's dtype: at EXACT_GPU_ROWS rows (the exact path's fixed call), whether
    a row's output is the same bits at any position of the call (`position_invariant`: rows rolled by 37); then
    at each of GEMM_ROWS rows, whether the first rows (the same inputs) come out as at EXACT_GPU_ROWS
    (`rows_equal_to_fixed`) and the call's time (µs, best of `kernel_runs`). Where a wider call gives the same bits, the exact
    path could call one shape that reads each weight once for more rows (FixedRowsLinear pads to 128 rows a
    call, so 512 tokens read the weights 4 times); `padded_us` is what it costs today. The same for
    triton_gemm.py's kernel (`triton`), where Triton runs: whether its rows are invariant as they are on the
    CPU, and its time at each row count (it reads each weight about once at any)."""
    import torch.nn.functional as F

    from lookahead.model.fast_linear import EXACT_GPU_ROWS, FixedRowsLinear

    layer = model.model.layers[0].mlp
    weights = {"gate_proj": layer.gate_proj, "down_proj": layer.down_proj, "lm_head": model.lm_head}
    gen = torch.Generator().manual_seed(9)
    fixed = FixedRowsLinear()
    for name, mod in weights.items():
        if rec.over():
            return
        w = mod.weight
        x = torch.randn(max(GEMM_ROWS), w.shape[1], generator=gen).to(w.device, w.dtype)
        ref = F.linear(x[:EXACT_GPU_ROWS], w)
        rolled = F.linear(x[:EXACT_GPU_ROWS].roll(37, 0), w).roll(-37, 0)
        item = {"shape": list(w.shape), "dtype": str(w.dtype), "position_invariant": torch.equal(ref, rolled),
                "rows": {}}
        for m in GEMM_ROWS:
            y = F.linear(x[:m], w)
            n = min(m, EXACT_GPU_ROWS)
            item["rows"][str(m)] = {"rows_equal_to_fixed": torch.equal(y[:n], ref[:n]),
                                    "us": _best_us(lambda m=m: F.linear(x[:m], w), sz),
                                    "padded_us": _best_us(lambda m=m: fixed(x[:m], mod), sz)}
        rec.put(("gemm", name), item)
        if not triton_gemm.usable(w.device) or rec.over():
            continue
        try:
            tg = triton_gemm.TritonLinear(mod)
            tref = tg.mm(x[:EXACT_GPU_ROWS], mod)
            item["triton"] = {"splits": tg.splits, "position_invariant":
                              torch.equal(tref, tg.mm(x[:EXACT_GPU_ROWS].roll(37, 0), mod).roll(-37, 0)),
                              "max_abs_diff_vs_stock": (tref.float() - ref.float()).abs().max().item(), "rows": {}}
            for m in GEMM_ROWS:
                n = min(m, EXACT_GPU_ROWS)
                item["triton"]["rows"][str(m)] = {"rows_equal_to_fixed": torch.equal(tg.mm(x[:m], mod)[:n], tref[:n]),
                                                  "us": _best_us(lambda m=m: tg.mm(x[:m], mod), sz)}
        except Exception as e:  # noqa: BLE001 - the kernel's first GPU run: its failure is a finding
            item["triton"] = {"error": f"{type(e).__name__}: {e}"[:500]}
        rec.put(("gemm", name), item)
    rec.put(("gemm", "compiled"), triton_build.compiled(triton_gemm._kernels(tree_attention.interpreting())))


KERNEL_CHUNKS = (128, 256, 512, None)  # None: one chunk over the whole walk (no split)
# Tiles (queries BM, virtual positions BN, warps) timed against the one in use, at its chunk: the tile was chosen
# by what ptxas makes of it (triton_build), which says nothing of speed: 8 x 8 rescales the online softmax twice
# as often per position as 8 x 16, and 16 queries fill GQA's 7-query groups less. Each is exact on its own (a
# constant tile keeps every invariance); the engine runs one.
KERNEL_TILES = ((8, 8, 8), (8, 16, 4), (8, 16, 8), (16, 8, 8))


@contextmanager
def _tile(bm: int, bn: int, warps: int):
    """tree_attention's kernel with another tile for the calls within (the module's constants, read per call)."""
    kept = tree_attention.BM, tree_attention.BN, tree_attention.NUM_WARPS
    tree_attention.BM, tree_attention.BN, tree_attention.NUM_WARPS = bm, bn, warps
    try:
        yield
    finally:
        tree_attention.BM, tree_attention.BN, tree_attention.NUM_WARPS = kept


def _best_us(fn, sz: Sizes) -> float:
    """fn's time, the best of `sz.kernel_runs` after warm-ups: the device's own (DeviceClock's CUDA events, synced
    here) on CUDA, the wall clock elsewhere."""
    for _ in range(min(2, sz.kernel_runs)):
        fn()
    clock, best = DeviceClock(torch.device(sz.device)), float("inf")
    for _ in range(sz.kernel_runs):
        t0 = time.perf_counter()
        clock.start()
        fn()
        clock.stop()
        if clock.cuda:
            torch.cuda.synchronize()
        ms = clock.ms()
        best = min(best, (ms if ms is not None else (time.perf_counter() - t0) * 1e3) * 1e3)
    return best


@dataclass
class _Layer:
    """One layer's attention inputs at a profiled (rows, width): a chain tree in every row after the context, the
    pool in bf16, with the static step's own inputs (`static_batch` of its bucket)."""

    q: torch.Tensor  # [R * W, heads, dim]
    keys: torch.Tensor  # [rows * span + 1, kv_heads, dim]: each row's span, then the trash slot
    values: torch.Tensor
    sb: object  # static_step.StaticBatch
    paths: torch.Tensor  # [R * W, W]
    R: int
    W: int
    K: int

    @classmethod
    def at(cls, sz: Sizes, rows: int, width: int) -> "_Layer":
        shape, ctx = sz.profile_shape, sz.profile_context
        heads, kvh = shape["num_attention_heads"], shape["num_key_value_heads"]
        dim = shape["hidden_size"] // heads
        dev, bf16, gen = torch.device(sz.device), torch.bfloat16, torch.Generator().manual_seed(5)
        span = ctx + width
        bucket = step_shape(rows, width, span)
        inputs = StaticInputs.new(bucket, dev)
        inputs.fill([chain(list(range(width)))] * rows, [ctx] * rows, [r * span for r in range(rows)], width)
        sb = static_batch(inputs, trash=rows * span)
        keys = torch.randn(rows * span + 1, kvh, dim, generator=gen).to(dev, bf16)
        values = torch.randn(rows * span + 1, kvh, dim, generator=gen).to(dev, bf16)
        R, W = bucket.rows, bucket.width
        q = torch.randn(R * W, heads, dim, generator=gen).to(dev, bf16)
        paths = tree_attention.ancestor_paths(sb.anc, sb.depths.view(R, W)).flatten(0, 1)
        return cls(q, keys, values, sb, paths, R, W, bucket.kv)

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5

    def gathered(self) -> torch.Tensor:
        """As the static step's float64 attention (static_step.StaticSteps._function); shaped as q."""
        R, W, K, (_, kvh, dim) = self.R, self.W, self.K, self.keys.shape
        k = self.keys.index_select(0, self.sb.src).view(R, K, kvh, dim).transpose(1, 2)
        v = self.values.index_select(0, self.sb.src).view(R, K, kvh, dim).transpose(1, 2)
        out = attention.exact_sdpa(None, self.q.view(R, W, -1, dim).transpose(1, 2), k, v, self.sb.batch.mask,
                                   scaling=self.scale)[0]
        return out.reshape(self.q.shape)

    def fused(self, chunk: int | None = None) -> torch.Tensor:
        sb = self.sb
        return tree_attention.attend(self.q, self.keys, self.values, sb.offsets, sb.lengths, sb.reach, self.paths,
                                     sb.walk, self.R, self.W, self.scale, self.K, chunk)


def _compiled(rec: SectionRecord) -> None:
    """What the GPU compiled of the attention kernels so far, each with its constexprs (the tile); rewritten as
    more compile, so an early stop keeps what was."""
    rec.put(("attention", "compiled"), triton_build.compiled(tree_attention._kernels(tree_attention.interpreting())))


def attention_kernels(rec: SectionRecord, sz: Sizes, kernel: bool) -> None:
    """One layer's exact attention at each profiled (rows, width) (`_Layer`): the static step's float64 path
    (gather each row's bucket of positions, `exact_sdpa`) against tree_attention.py's fp32 kernel at each chunk
    size of KERNEL_CHUNKS. Which chunk to fix for a model (every step must use the same) is read from these: a
    split fills the GPU at one row and a long context, and costs its partial states' traffic at many rows."""
    rec.put(("attention", "chunk_in_use"), tree_attention.CHUNK)
    for rows, width in sz.profile_batches:
        if rec.over():
            return
        layer, key = _Layer.at(sz, rows, width), f"{rows}x{width}"
        rec.put(("attention", key, "float64_gathered_us"), _best_us(layer.gathered, sz))
        if not kernel:
            continue
        for chunk in KERNEL_CHUNKS:
            if rec.over():
                return
            c = chunk or -(-layer.K // tree_attention.BN) * tree_attention.BN
            try:
                us = _best_us(lambda: layer.fused(c), sz)
            except Exception as e:  # noqa: BLE001 - a kernel's first GPU run: its failure is a finding
                rec.put(("attention", key, f"kernel_chunk_{chunk or 'whole'}"), {"error": f"{type(e).__name__}: {e}"[:500]})
                return
            rec.put(("attention", key, f"kernel_chunk_{chunk or 'whole'}_us"), us)
        _compiled(rec)
        diff = (layer.fused().float() - layer.gathered().float()).abs().max().item()  # bf16 rounding of float64's
        rec.put(("attention", key, "kernel_max_abs_diff_vs_float64"), diff)


def attention_tiles(rec: SectionRecord, sz: Sizes) -> None:
    """The kernel at each tile of KERNEL_TILES, at the chunk in use, at each profiled (rows, width): µs a call and
    max |Δ| from float64 (the tile in use is named `_in_use`). Last in P: the chunks and the GEMM come first."""
    in_use = tree_attention.BM, tree_attention.BN, tree_attention.NUM_WARPS
    for rows, width in sz.profile_batches:
        layer, key = _Layer.at(sz, rows, width), f"{rows}x{width}"
        ref = layer.gathered().float()
        for tile in KERNEL_TILES:
            if rec.over():
                return
            name = "tile_{}x{}_w{}".format(*tile) + ("_in_use" if tile == in_use else "")
            try:
                with _tile(*tile):
                    us = _best_us(layer.fused, sz)
                    diff = (layer.fused().float() - ref).abs().max().item()
            except Exception as e:  # noqa: BLE001 - a tile that does not compile or launch: a finding
                rec.put(("attention", key, name), {"error": f"{type(e).__name__}: {e}"[:500]})
                continue
            rec.put(("attention", key, name), {"us": us, "max_abs_diff_vs_float64": diff})
        _compiled(rec)


# ---- C. timing grid -----------------------------------------------------------------------------------------
def timing(rec: SectionRecord, sz: Sizes) -> None:
    runner = ModelRunner(shaped_model(sz.grid_shape, sz.device))
    runner.check_tree_masks()
    rows_max, width_max = max(sz.grid_rows), max(sz.grid_widths)
    table = runner.seed_step_table(rows_max, rows_max * width_max, width_max, runner.ragged)
    layout = "packed" if runner.ragged else "padded"
    points: list[dict] = []
    rec.result.update(shape=sz.grid_shape, table_seeded_at_context=512, layout=layout, points=points)
    rec.save()
    for ctx in sz.grid_contexts:
        if rec.over():
            break
        if sz.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        single, tokens = _context(runner, sz.grid_shape["vocab_size"], ctx, width_max + 1)
        for rows in sz.grid_rows:
            cache = _batch(runner, single, rows, width_max + 1)
            for width in sz.grid_widths:
                if rec.over():
                    break
                trees = [chain(tokens[:width])] * rows
                best = float("inf")
                for _ in range(3):
                    runner.clock.start()
                    t0 = time.perf_counter()
                    runner.verify_batch(cache, trees, width, ragged=runner.ragged).argmax()
                    runner.clock.stop()
                    ms = runner.clock.ms()
                    best = min(best, ms if ms is not None else (time.perf_counter() - t0) * 1e3)
                predicted = table(layout, rows, rows * (width - 1))
                points.append({"context": ctx, "rows": rows, "width": width, "ms": best,
                               "table_ms": predicted, "table_over_measured": predicted / best})
                rec.save()
            cache.close()
        peak = torch.cuda.max_memory_allocated() if sz.device == "cuda" else None
        points.append({"context": ctx, "peak_memory_bytes": peak})
        rec.save()


# ---- D. engine under load -----------------------------------------------------------------------------------
def load(rec: SectionRecord, sz: Sizes) -> None:
    runner = ModelRunner(shaped_model(sz.grid_shape, sz.device))
    runner.check_tree_masks()
    dec = LookaheadDecoder(runner, LookaheadConfig())
    n = sz.load_requests
    device_ms: list[float] = []
    measure = runner.clock.ms

    def recorded():
        ms = measure()
        if ms is not None:
            device_ms.append(ms)
        return ms

    runner.clock.ms = recorded
    vocab = sz.grid_shape["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    cuda = sz.device == "cuda"
    steps, host_ms, syncs, wall = 0, [], [], 0.0
    with Engine(dec, SchedulerConfig(max_batch_size=n, max_tokens_per_step=max(256, 4 * n))) as engine:
        handles = []
        for _ in range(n):  # a repeated phrase: the prompt's own n-grams give the drafts something to propose
            phrase = torch.randint(0, vocab, (12,), generator=gen).tolist()
            handles.append(engine.add_request(phrase * 16, stop=StopCriteria(sz.load_tokens)))

        def summary() -> None:
            busy = sum(device_ms[-len(host_ms):]) / wall if host_ms and wall else None
            rec.result.update({
                "requests": n, "decode_steps": steps, "gpu_busy_fraction": busy if cuda else None,
                "host_ms_per_step": sum(host_ms) / len(host_ms) if host_ms and cuda else None,
                "wall_ms_per_step": wall / steps if steps else None,
                "syncs_per_step": sum(syncs) / len(syncs) if syncs and cuda else None,
                "decode_steps_by_kind": dict(engine.decode_steps), "finished": sum(h.done for h in handles),
                # finished outputs learnt into the memory in the forwards' shadow, and on the host's own time
                "output_learning": asdict(engine.backlog.stats)})
            rec.save()

        save = Throttle(summary)
        while not all(h.done for h in handles) and not rec.over():
            s = engine.scheduler  # with nothing to prefill, the step is the batch's decode alone
            decoding = bool(s.running) and s.prefilling is None and not s.waiting
            before, decoded = len(device_ms), sum(engine.decode_steps.values())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                t0 = time.perf_counter()
                engine.step()
                step_ms = (time.perf_counter() - t0) * 1e3
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            if decoding and sum(engine.decode_steps.values()) > decoded:  # a decode step and nothing else
                steps += 1
                wall += step_ms
                if len(device_ms) > before:  # CUDA: its device time was recorded
                    host_ms.append(step_ms - device_ms[-1])
                syncs.append(sum("synchroniz" in str(w.message) for w in caught))
            save()
        summary()


# ---- E. memory plan -----------------------------------------------------------------------------------------
def memory(rec: SectionRecord, sz: Sizes) -> None:
    runner = ModelRunner(shaped_model(sz.memory_shape, sz.device))
    dec = LookaheadDecoder(runner, LookaheadConfig())
    kv_gb = None if sz.memory_kv_tokens is None else sz.memory_kv_tokens * runner.kv_shape.token_bytes / 2**30
    sched = SchedulerConfig(max_batch_size=32, max_tokens_per_step=256, prefill_chunk=2048, kv_cache_gb=kv_gb)
    with Engine(dec, sched) as engine:
        gen = torch.Generator().manual_seed(2)
        vocab = sz.memory_shape["vocab_size"]
        new_tokens = 8
        handles = [engine.add_request(torch.randint(0, vocab, (sz.memory_prompt,), generator=gen).tolist(),
                                      stop=StopCriteria(new_tokens)) for _ in range(sz.memory_requests)]
        worst = sz.memory_prompt + new_tokens + engine.headroom
        plan = min(engine.ledger.admissible(worst), sched.max_batch_size)
        most = 0

        def summary() -> None:
            errors = []
            for h in handles:
                if h.done:
                    try:
                        h.result()
                    except Exception as e:  # noqa: BLE001 - the finding itself
                        errors.append(f"{type(e).__name__}: {e}")
            st = engine.memory_stats()
            rec.result.update({
                "shape": sz.memory_shape, "requests": len(handles), "worst_case_tokens": worst,
                "budget_tokens": engine.ledger.token_capacity, "budget_source": engine.ledger.budget.source,
                "budget_terms": engine.ledger.budget.terms(),
                "plan_admits": plan, "most_at_once": most, "finished": sum(h.done for h in handles),
                "errors": errors, "out_of_memory": sum("OutOfMemory" in e for e in errors),
                "kv_budget_bytes": st.kv_budget_bytes, "kv_peak_bytes": st.kv_peak_bytes})
            rec.save()

        summary()
        save = Throttle(summary)
        while not all(h.done for h in handles) and not rec.over():
            engine.step()
            s = engine.scheduler
            most = max(most, len(s.running) + (s.prefilling is not None))
            save()
        summary()
