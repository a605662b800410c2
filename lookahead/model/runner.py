"""The one module that runs the model: prefill, tree verification, the step-time table's start-up seed.

Everything above it (draft, verify, generate) passes token lists and gets
logits back; only here do tensors meet the device. Works on any Hugging Face
causal LM whose forward honours a 4D boolean attention mask and explicit
`position_ids`; `check_tree_masks` proves that at load instead of assuming it.
"""

import inspect
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate

import torch

from lookahead.model import attention
from lookahead.core.draft import DraftTree, chain
from lookahead.model.fast_linear import FastLinears
from lookahead.model.batch_cache import BatchKVCache, PoolLayout, spare_bytes
from lookahead.model.decoder_step import DecoderStep, StepBatch
from lookahead.model.device_memory import CudaMemory, budget_terms
from lookahead.model.kv_cache import KVCache
from lookahead.model.kv_memory import Budget, KVLedger, KVShape, host_available_bytes, kv_budget
from lookahead.model.sampling import SamplingParams, draw
from lookahead.model.static_step import StaticSteps, graphs_wanted
from lookahead.core.planner import layouts_of
from lookahead.core.step_table import StepTable, bracket
from lookahead.model.tree_mask import TreeInputs, batch_tree_inputs, causal_inputs, tree_inputs

log = logging.getLogger(__name__)

SEED_DRAFTS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # the step table's draft-token grid


class UnsupportedModelError(ValueError):
    pass


@dataclass
class _Hooks:
    """What a runner installs on its model, once per model: every runner of that model shares it."""

    fast: FastLinears
    attn: attention.AttentionSwitch
    packed_attention: bool
    exact: bool  # what the first runner asked for: every runner of the model must ask the same
    step: DecoderStep | None  # the decode step's own forward (decoder_step.py), where the model allows it


@dataclass
class BatchLogits:
    """A batch forward's logits, every row's tree rows packed: row b's are logits[starts[b]:starts[b] + its tree]."""

    logits: torch.Tensor  # [tokens, vocab] float
    starts: list[int]  # [rows]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, b: int) -> torch.Tensor:
        end = self.starts[b + 1] if b + 1 < len(self.starts) else self.logits.shape[0]
        return self.logits[self.starts[b] : end]

    def argmax(self) -> list[int]:
        """Every packed row's argmax, read back in one transfer (the step's one host-device sync)."""
        return self.logits.argmax(-1).tolist()

    def picks(self, draws: list[SamplingParams | None]) -> list[int]:
        """Every packed row's token for the acceptance walk, read back in one transfer: the argmax, or, for
        each row b whose `draws[b]` is set, an independent sample per tree row (`sampling.draw`), made on
        the device. Rows with the same settings are drawn together, across requests."""
        out = self.logits.argmax(-1)
        groups: dict[SamplingParams, list[int]] = {}
        for b, p in enumerate(draws):
            if p is not None:
                groups.setdefault(p, []).append(b)
        for p, rows in groups.items():
            at = torch.cat([torch.arange(self.starts[b], self.starts[b] + len(self[b])) for b in rows])
            at = at.to(self.logits.device)
            out[at] = draw(self.logits[at], p)
        return out.tolist()


@dataclass
class StepPath:
    """Which forward a decode step takes (`GET /stats`): an operator sees whether graphs are replayed."""

    decoder_step: bool  # the decoder step's own forward (else the Hugging Face forward)
    static_shapes: bool  # at bucketed static shapes (static_step.py)
    cuda_graphs: bool  # captured and replayed as CUDA graphs
    graphs_captured: int
    graph_replays: int


class DeviceClock:
    """The device's own time for the work queued between `start` and `stop`: CUDA events, read only after the
    step's existing sync (its argmax read back), so timing adds no sync. Off CUDA the host runs the work as it
    queues it, and the wall clock around the forward is that time: `ms` returns None there."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._events: tuple | None = None

    def start(self) -> None:
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()

    def busy(self) -> bool:
        """Whether the device still runs the work queued before `stop` (a CUDA event's query, no sync); never
        off CUDA, where the host ran the work as it queued it."""
        return self._events is not None and not self._events[1].query()

    def ms(self) -> float | None:
        """Call after the sync that ends the step."""
        if self._events is None:
            return None
        begin, end = self._events
        self._events = None
        return begin.elapsed_time(end)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, fast_small_matmul: bool | None = None, exact: bool | None = None,
                 static_step: bool | None = None) -> None:
        """`exact`: batch-invariant forwards (attention.exact_sdpa and one matmul kernel for every row count), so a
        token's logits are the same bits alone, in a tree or in a batch; None: on for half-precision models.
        `static_step`: decode steps at bucketed static shapes (static_step.py), captured as CUDA graphs on CUDA;
        None: on CUDA unless LOOKAHEAD_CUDA_GRAPHS=0. Needs the decoder step (else ignored)."""
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        params = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` in 5.x; accept either.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" in params
        self.num_layers = model.config.get_text_config().num_hidden_layers
        if exact is None:
            exact = self.dtype in (torch.bfloat16, torch.float16)
        if fast_small_matmul is None:  # its row-count-dependent kernels would undo exactness
            fast_small_matmul = self.device.type == "cpu" and not exact
        # Tree forwards attend without copying K/V per query-head group, and batches may be ragged (attention.py).
        # Installed once per model: a second runner shares the first one's hooks (installing again would find
        # the attention already renamed, and leave the first runner's fast linears switched off for good).
        hooks = getattr(model, "_lookahead_hooks", None)
        if hooks is None:
            switch = attention.AttentionSwitch(exact=exact)
            step = DecoderStep.of(model)
            linears = FastLinears(model, fast_small_matmul, exact=exact, extra=step.fused if step else (),
                                  unpacked=tuple(step.replaced) if step else ())
            packed = attention.install(model, switch)
            if step is not None:
                step.fast = linears
                step = step if packed else None  # (the same attention arithmetic as the installed hook's)
            hooks = _Hooks(linears, switch, packed, exact, step)
            model._lookahead_hooks = hooks
        elif hooks.exact != exact:
            raise ValueError(f"this model already has a runner with exact={hooks.exact}; one runner per model")
        self._fast, self._attn, self.packed_attention = hooks.fast, hooks.attn, hooks.packed_attention
        self.step = hooks.step  # None: every forward through the model's own (Hugging Face) code
        self.exact = exact and self.packed_attention  # exact attention needs the installed hook
        self._exact_linears = self._fast.exact
        self.ragged = self.packed_attention  # confirmed or withdrawn by check_tree_masks
        self.clock = DeviceClock(self.device)
        self.memory = CudaMemory()  # how the KV budget reads an accelerator's memory (tests: a stand-in)
        self._peaks: dict[tuple[int, int, int], int] = {}  # (rows, width, prefill chunk) -> activation peak
        if static_step is None:
            static_step = graphs_wanted(self.device)
        self.static = None  # StaticSteps: the decode step at bucketed shapes (None: at its own shapes)
        if static_step and self.step is not None:
            self.static = StaticSteps(self.step, self._attention_modules(), self.device)
        self._probing = False  # the activation probe runs: static steps stay eager (no capture)

    @contextmanager
    def _active(self, ragged: attention.RaggedQueries | None = None, exact: bool = True, paged=None):
        """The runner's own forward: fast linears and tree attention on (the stock paths stay for everyone else).
        `exact=False`: this forward takes the stock kernels even on an exact runner (prefill, below).
        `paged`: the batch cache's plan when attention reads its pool in place (ForwardPlan.read)."""
        self._attn.on, self._attn.ragged, self._attn.paged = True, ragged, paged
        self._attn.exact, self._fast.exact = exact and self.exact, exact and self._exact_linears
        try:
            with self._fast.active():
                yield
        finally:
            self._attn.on, self._attn.ragged, self._attn.paged = False, None, None
            self._attn.exact, self._fast.exact = self.exact, self._exact_linears

    def step_path(self) -> StepPath:
        st = self.static
        return StepPath(self.step is not None, st is not None, st is not None and st.capture,
                        st.captures if st else 0, st.replays if st else 0)

    # ---- forwards --------------------------------------------------------
    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.num_layers, capacity)

    @torch.inference_mode()
    def _forward(self, cache: KVCache, inputs: TreeInputs, keep_last: int | None, exact: bool = True) -> torch.Tensor:
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if keep_last is not None and self._keep_kw:
            kwargs["logits_to_keep"] = keep_last
        with self._active(exact=exact):
            out = self.model(
                input_ids=inputs.input_ids,
                attention_mask=inputs.attention_mask,
                position_ids=inputs.position_ids,
                **kwargs,
            )
        logits = out.logits[0]  # [rows, vocab]
        if keep_last is not None:
            logits = logits[-keep_last:]
        return logits.float()

    # ---- KV memory -------------------------------------------------------
    @property
    def kv_shape(self) -> KVShape:
        return KVShape.of(self.model.config.get_text_config(), self.dtype.itemsize)

    def layer_devices(self) -> tuple[torch.device, ...]:
        """Each decoder layer's device (several with a `device_map` across GPUs); its KV lives there too."""
        layers = getattr(self.model.get_decoder(), "layers", None) if hasattr(self.model, "get_decoder") else None
        if layers is None or len(layers) != self.num_layers:
            return (self.device,) * self.num_layers
        return tuple(next(layer.parameters()).device for layer in layers)

    def pool_layout(self) -> PoolLayout:
        shape = self.kv_shape
        soft = getattr(self.model.config, "attn_logit_softcapping", None)  # not in the paged kernel's arithmetic
        return PoolLayout(shape.kv_heads, shape.head_dim, self.dtype, self.layer_devices(),
                          in_place=self.packed_attention and soft is None)

    def new_batch_cache(self, rows: int, row_tokens: int) -> BatchKVCache:
        """A batch cache with room for `rows` requests of `row_tokens` entries each (start-up checks, the step
        table's seed, tests); the engine sizes its own from the KV budget."""
        return BatchKVCache(self.pool_layout(), KVLedger.for_rows(self.kv_shape, rows, row_tokens))

    def weight_bytes(self, device: torch.device) -> int:
        """This model's parameters and buffers on `device`."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        # by storage: the decoder step leaves the model's projections as views of its fused weights
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device == device}
        return sum(storages.values())

    def _accelerated(self) -> list[torch.device]:
        return sorted({d for d in self.layer_devices() if self.memory.accelerated(d)}, key=str)

    @torch.inference_mode()
    def activation_peak(self, rows: int, width: int, prefill_chunk: int) -> int:
        """The most one forward of an engine with these limits allocates above what is allocated before it, on
        its accelerators (0 where there are none): the larger of a verify of `rows` rows x `width` tokens with
        every row at the model's whole context, and a prefill chunk of `prefill_chunk` tokens ending there.
        Where decode steps are captured as CUDA graphs (static_step.py) the verify's share is held by the graphs'
        pool while prefills run eagerly beside it: the two add. Measured once per shape, at the real shapes
        (the static step's bucket, run eagerly): every row reads one range of a probe pool, so the probe's
        KV is one context's worth, not `rows` of them (the pool is made before measuring, and is not counted)."""
        devices = self._accelerated()
        if not devices:
            return 0
        key = (rows, width, prefill_chunk)
        if key not in self._peaks:
            context = max(1, self.max_positions() - width)
            probe = self.new_batch_cache(1, context + width)
            whole = object()
            probe.ledger.reserve(whole, context + width)
            for _ in range(rows):
                probe.attach(whole, context)
            trees = [chain([1] * width)] * rows
            self._probing = True
            try:
                verify = self.memory.peak_during(devices, lambda: self.verify_batch(probe, trees, width).argmax())
            finally:
                self._probing = False
            chunk = min(prefill_chunk, context)
            row = probe.row_cache(whole)
            row.length = context - chunk
            prefill = self.memory.peak_during(devices, lambda: self.prefill(row, [1] * chunk))
            probe.close()
            # captured graphs keep their working set in their own pool for good, beside every eager forward's
            held = self.static is not None and self.static.capture
            self._peaks[key] = verify + prefill if held else max(verify, prefill)
        return self._peaks[key]

    def kv_budget(self, kv_cache_gb: float | None, utilization: float, activation_peak: int) -> Budget:
        """The KV budget (kv_memory.kv_budget's precedence). On accelerators, per device: its memory x
        `utilization`, less this model's weights there, less what else is in use (device_memory.py: cached
        blocks and a closed engine's spare pool count as free), less `activation_peak`; the pool holds every
        token on every device in proportion to its layers, so the tightest device sets the budget."""
        devices = self.layer_devices()
        accel = self._accelerated()
        if kv_cache_gb is not None or not accel:
            return kv_budget(kv_cache_gb, utilization, None, host_available_bytes())
        tightest: tuple[float, Budget] | None = None
        for d in accel:
            terms = budget_terms(self.memory.read(d), self.weight_bytes(d), spare_bytes(d), activation_peak)
            b = kv_budget(None, utilization, terms, 0)
            share = devices.count(d) / len(devices)  # of every token's KV that this device holds
            if tightest is None or b.bytes / share < tightest[0]:
                tightest = (b.bytes / share, Budget(int(b.bytes / share), f"{d}: {b.source}", terms, utilization))
        return tightest[1]

    def prefill(self, cache: KVCache, tokens: list[int]) -> None:
        """Commit `tokens` to the cache without computing their logits (the last one is left as the next root)."""
        if not tokens:
            return
        base = cache.length
        inputs = causal_inputs(tokens, base, self.device)
        if base == 0:
            # Let the model build its own causal mask: SDPA then takes its fused causal kernel,
            # Faster than an explicit boolean mask (no mask tensor to build or read).
            inputs.attention_mask = None
        # Stock kernels, exact runner or not: plain decoding and lookahead prefill a prompt alike (same chunks),
        # so its KV is the same bits for both; the first token's logits come from the first decode step. Exact
        # attention over a long prompt costs tens of times SDPA's.
        self._forward(cache, inputs, keep_last=1, exact=False)
        cache.length = base + len(tokens)

    def verify(self, cache: KVCache, tree: DraftTree) -> torch.Tensor:
        """Logits of every tree row, [1 + n, vocab]. Rows are written after the committed cache; call commit next."""
        return self._forward(cache, tree_inputs(tree, cache.length, self.device), keep_last=len(tree.tokens))

    def verify_batch(self, cache: BatchKVCache, trees: list[DraftTree], width: int,
                     ragged: bool = False, split: bool | None = None, exact: bool = True) -> BatchLogits:
        """Logits of every row's tree, row b's as [>= len(trees[b].tokens), vocab]; call cache.commit next.

        Padded: every row sends `width` tokens. Ragged (when the model allows it): row b sends only its
        own tree's tokens, all packed into one sequence, so no linear layer computes padding. `split`: a
        ragged forward's attention row by row (the plan's layout "split"), or not; None: wherever allowed.
        `exact=False`: the stock kernels even on an exact runner (to measure what exactness costs).
        """
        if self.step is not None:
            return self._step_batch(cache, trees, width, ragged, exact)
        inputs = batch_tree_inputs(trees, cache.lengths, width, self.device)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        counts = [len(t.tokens) for t in trees]
        if not (ragged and self.ragged) or all(c == width for c in counts):
            plan = cache.begin_forward(width)
            with torch.inference_mode(), self._active(exact=exact, paged=plan if plan.read is not None else None):
                out = self.model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                                 position_ids=inputs.position_ids, **kwargs)
            return BatchLogits(out.logits.float().flatten(0, 1), [b * width for b in range(len(trees))])
        plan = cache.begin_forward(width, counts)
        row_of = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).to(self.device)  # [tokens]
        slot_of = torch.cat([torch.arange(c) for c in counts]).to(self.device)  # [tokens]
        layout = attention.RaggedQueries(len(trees), width, row_of, slot_of, counts, list(cache.lengths), split)
        paged = plan if plan.read is not None else None
        with torch.inference_mode(), self._active(layout, exact=exact, paged=paged):
            out = self.model(input_ids=inputs.input_ids[row_of, slot_of][None],
                             attention_mask=inputs.attention_mask,  # [rows, 1, width, kv_len]: attention reads it per row
                             position_ids=inputs.position_ids[row_of, slot_of][None], **kwargs)
        return BatchLogits(out.logits[0].float(), layout.starts)

    def _step_batch(self, cache: BatchKVCache, trees: list[DraftTree], width: int, ragged: bool, exact: bool
                    ) -> BatchLogits:
        """verify_batch through the decoder step (decoder_step.py): the same layouts, the same arithmetic; at a
        bucket's static shape (and replayed as a CUDA graph there) when the runner has `static`."""
        if self.static is not None:
            cache.begin_static(width)
            logits, shape = self.static.run(cache, trees, width, exact and self.exact, eager=self._probing)
            return BatchLogits(logits[: len(trees) * shape.width], [b * shape.width for b in range(len(trees))])
        counts = [len(t.tokens) for t in trees]
        ragged = ragged and self.ragged and any(c != width for c in counts)
        lone = not ragged and len(trees) == 1 and width == 1 and self._fast.enabled
        if lone:
            width = 2  # one token takes W @ x.T as two (fast_linear): pad the step once, not every linear
        inputs = batch_tree_inputs(trees, cache.lengths, width, self.device)
        plan = cache.begin_forward(width, counts if ragged else None, read_in_place=True)
        dst, _ = plan.on(self.device)
        ids, positions = inputs.input_ids, inputs.position_ids
        layout = None
        if ragged:
            row_of = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).to(self.device)
            slot_of = torch.cat([torch.arange(c) for c in counts]).to(self.device)
            layout = attention.RaggedQueries(len(trees), width, row_of, slot_of, counts, list(cache.lengths), False)
            ids, positions = ids[row_of, slot_of], positions[row_of, slot_of]
        batch = StepBatch(ids.flatten(), positions.flatten(), inputs.attention_mask, dst, len(trees), width, layout,
                          lone)
        exact = exact and self.exact
        step = self.step
        if plan.read is not None:
            kernel, read = plan.kernel, plan.read

            def attend(i, q, keys, values, batch):
                return kernel.attend(q, keys, values, read, batch.mask, step.scale)
        else:
            modules = self._attention_modules()

            def attend(i, q, keys, values, batch):
                return self._gathered_attention(modules[i], q, keys, values, batch, cache, exact)

        pools = [(layer.keys, layer.values) for layer in cache.layers]
        logits = step.forward(batch, pools, attend, exact)
        starts = layout.starts if layout is not None else [b * width for b in range(len(trees))]
        return BatchLogits(logits, starts)

    def _attention_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn for layer in self.model.model.layers]

    def _gathered_attention(self, module, q, keys, values, batch: StepBatch, cache: BatchKVCache, exact: bool):
        """Attention where the pool is not read in place (no paged kernel: CUDA, no compiler): the rows the
        batch cache gives (`read_rows`), then the padded layout's SDPA, or the exact float64 path, as the HF
        forward's hook takes them (attention.py). q [tokens, heads, dim] -> [tokens, heads, dim]."""
        k, v = cache.read_rows(keys, values, cache.plan)
        sdpa = attention.exact_sdpa if exact else attention._tree_sdpa
        if batch.ragged is not None:
            out, _ = attention._ragged_sdpa(module, q.transpose(0, 1)[None], k, v, batch.mask, self.step.scale,
                                            batch.ragged, sdpa)
            return out[0]
        padded = q.view(batch.rows, batch.width, *q.shape[1:]).transpose(1, 2)  # [rows, heads, width, dim]
        out, _ = sdpa(module, padded, k, v, batch.mask, scaling=self.step.scale)
        return out.reshape(q.shape)  # [rows, width, heads, dim] -> [tokens, heads, dim]

    # ---- start-up checks -------------------------------------------------
    @torch.inference_mode()
    def check_tree_masks(self) -> None:
        """Two sibling rows at the same position must each match that token run alone."""
        name = type(self.model).__name__
        a, b = 5, 7
        try:
            cache = self.new_cache(8)
            self.prefill(cache, [3])
            sib = DraftTree(tokens=[a, b], parents=[-1, -1], depths=[0, 0], probs=[1.0, 1.0])
            both = self.verify(cache, sib)
            alone = []
            for tok in (a, b):
                c = self.new_cache(8)
                self.prefill(c, [3])
                alone.append(self.verify(c, DraftTree([tok], [-1], [0], [1.0]))[0])
        except Exception as e:  # noqa: BLE001 - any failure here means "unsupported"
            raise UnsupportedModelError(f"{name} failed a forward with a 4D attention mask: {e}") from e
        for row, ref in enumerate(alone):
            if not logits_agree(both[row], ref, self.dtype):
                raise UnsupportedModelError(
                    f"{name} ignores 4D attention masks (sibling rows leak into each other); "
                    "lookahead tree verification cannot run on it"
                )
        if self.ragged:
            self.ragged = self._ragged_matches_padded()

    @torch.inference_mode()
    def _ragged_matches_padded(self) -> bool:
        """A ragged batch forward must give every row what the padded one gives; otherwise batches stay padded."""
        wide, plain = DraftTree([5, 6, 7], [-1, 0, 0], [0, 1, 1], [1.0] * 3), DraftTree([8], [-1], [0], [1.0])
        prompts = [[3, 4, 9], [3], [2, 2], [7, 1, 8, 2]]
        # two rows attend in the padded layout; four with one drafting attend row by row (attention.split_attention)
        return all(self._ragged_case(trees, prompts) for trees in ([wide, plain], [wide, plain, plain, plain]))

    def _ragged_case(self, trees: list[DraftTree], prompts: list[list[int]]) -> bool:
        outs = []
        for ragged in (False, True):
            cache = self.new_batch_cache(len(trees), 16)
            for prompt in prompts[: len(trees)]:
                single = self.new_cache(8)
                self.prefill(single, prompt)
                cache.admit(single, 8)
            try:
                outs.append(self.verify_batch(cache, trees, 3, ragged=ragged))
            except Exception as e:  # noqa: BLE001 - any failure means "not for this model"
                log.info("%s: ragged batch forwards unavailable (%s); batches are padded", type(self.model).__name__, e)
                return False
        for padded, ragged, tree in zip(*outs, trees):
            n = len(tree.tokens)
            if not logits_agree(padded[:n], ragged[:n], self.dtype):
                log.info("%s: ragged batch forwards disagree with padded ones; batches are padded",
                         type(self.model).__name__)
                return False
        return True

    @property
    def context_length(self) -> int | None:
        """The model's context window in tokens, from its config (GLM names it `seq_length`); None if unstated."""
        cfg = self.model.config.get_text_config()
        return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "seq_length", None)

    def max_positions(self) -> int:
        return self.context_length or 4096

    @torch.inference_mode()
    def seed_step_table(self, max_rows: int, max_tokens: int, max_width: int, ragged: bool,
                        context: int = 512, rounds: int = 2) -> StepTable:
        """The step table's start-up seed: ms of a batch forward, launch to its argmax read back, over a short
        grid of rows x draft tokens (`max_tokens` at most in flight, trees `max_width` wide at most), in every
        layout the engine may run, after `context` tokens in every row.

        Packed forwards are timed with every row drafting alike; split ones with a quarter of the rows
        drafting; padded ones at whole widths. Each point is the fastest of `rounds` (after a warm-up),
        interleaved so a burst of noise from a shared machine does not skew one point; between measured
        points, and past the last, the grid is filled linearly. The engine refines the table while serving.
        """
        context = max(1, min(context, self.max_positions() - max_width - 2))
        rows_grid = sorted({1 << i for i in range(max_rows.bit_length())} | {max_rows})
        drafts_grid = tuple(d for d in SEED_DRAFTS if d < max_tokens) or (0,)
        layouts = ("packed", "split") if ragged and self.ragged else ("padded",)
        vocab = self.model.config.get_text_config().vocab_size
        ctx = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0)).tolist()
        single = self.new_cache(context + max_width + 1)
        self.prefill(single, ctx)
        points: dict[tuple[str, int], dict[int, float]] = {}  # (layout, rows) -> {drafts in flight: ms}
        for r in rows_grid:
            cache = self.new_batch_cache(r, context + max_width + 1)
            for _ in range(r):
                cache.admit(single, max_width + 1)
            plain = chain(ctx[:1])
            shapes = [("plain", 0, [plain] * r)]
            for layout in layouts:
                drafting = r if layout != "split" else r // 4
                k = 1
                while drafting and k < max_width and r + drafting * k <= max_tokens:
                    if layout in layouts_of(r, drafting, layout != "padded"):
                        trees = [chain(ctx[: k + 1])] * drafting + [plain] * (r - drafting)
                        shapes.append((layout, drafting * k, trees))
                    k *= 2
            best = {(lay, d): float("inf") for lay, d, _ in shapes}
            for timed in [False] + [True] * rounds:
                for lay, d, trees in shapes:
                    width = max(len(t.tokens) for t in trees)
                    t0 = time.perf_counter()
                    self.verify_batch(cache, trees, width, ragged=lay != "padded", split=lay == "split").argmax()
                    if timed:
                        best[lay, d] = min(best[lay, d], (time.perf_counter() - t0) * 1e3)
            for layout in layouts:
                measured = {d: ms for (lay, d), ms in best.items() if lay == layout}
                if measured:  # (too few rows to split: the packed points stand in, never asked for)
                    points[layout, r] = {0: best["plain", 0], **measured}
            points.setdefault((layouts[0], r), {0: best["plain", 0]})
        fill = lambda layout, r, d: _linear(points.get((layout, r)) or points[layouts[0], r], d)  # noqa: E731
        table = StepTable.from_function(rows_grid, drafts_grid, fill, layouts)
        log.info("step table (ms by layout, rows, draft tokens in flight): %s", table.summary())
        return table


FATAL_MARKS = ("CUDA error", "device-side assert", "CUBLAS_STATUS", "cuDNN error", "NCCL error", "CUDA driver")


def is_fatal_device_error(e: BaseException) -> bool:
    """Does this error leave the device unusable? A CUDA error other than out-of-memory poisons the context:
    every later kernel fails too, so the replica must be replaced. Out-of-memory, and any CPU error, do not."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return False
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(e, accel):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in FATAL_MARKS)


def logits_agree(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, ulps: float = 4.0) -> bool:
    """Two forwards of the same tokens agree up to the model dtype's rounding: within `ulps` units of its
    last place at the largest logit (at least 1e-3, and 1e-3 relative), and with the same best token
    wherever the best two are further apart than that. In bf16 one unit at a logit of 8 is 0.03, and a
    one-token and a two-token forward run different kernels; a real mask leak moves logits by O(1)."""
    scale = float(torch.maximum(a.abs().amax(), b.abs().amax()))
    tol = max(1e-3, ulps * torch.finfo(dtype).eps * scale)
    if not torch.allclose(a, b, atol=tol, rtol=1e-3):
        return False
    best_a, best_b = a.argmax(-1, keepdim=True), b.argmax(-1, keepdim=True)
    return bool((b.gather(-1, best_a) >= b.gather(-1, best_b) - 2 * tol).all())


def _linear(points: dict[int, float], x: int) -> float:
    """Piecewise-linear through the measured points, extended along the last segment, never decreasing."""
    xs = tuple(sorted(points))
    ys = list(accumulate((points[k] for k in xs), max))
    return sum(w * ys[i] for i, w in bracket(xs, x))
