"""The one module that runs the model: prefill, tree verification, cost curve.

Everything above it (draft, verify, generate) passes token lists and gets
logits back; only here do tensors meet the device. Works on any Hugging Face
causal LM whose forward honours a 4D boolean attention mask and explicit
`position_ids`; `check_tree_masks` proves that at load instead of assuming it.
"""

import inspect
import logging
import time
from contextlib import contextmanager

import torch

from . import attention
from .draft import DraftTree
from .fast_linear import FastLinears
from .batch_cache import BatchKVCache
from .kv_cache import KVCache
from .policy import CostCurve, CostModel
from .tree_mask import TreeInputs, batch_tree_inputs, causal_inputs, tree_inputs

log = logging.getLogger(__name__)

COST_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class UnsupportedModelError(ValueError):
    pass


class ModelRunner:
    def __init__(self, model: torch.nn.Module, fast_small_matmul: bool | None = None) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` in 5.x; accept either.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" in params
        self.num_layers = model.config.get_text_config().num_hidden_layers
        if fast_small_matmul is None:
            fast_small_matmul = self.device.type == "cpu"
        self._fast = FastLinears(model, fast_small_matmul)
        # Tree forwards attend without copying K/V per query-head group, and batches may be ragged (attention.py).
        self._attn = attention.AttentionSwitch()
        self.packed_attention = attention.install(model, self._attn)
        self.ragged = self.packed_attention  # confirmed or withdrawn by check_tree_masks

    @contextmanager
    def _active(self, ragged: attention.RaggedQueries | None = None):
        """The runner's own forward: fast linears and tree attention on (the stock paths stay for everyone else)."""
        self._attn.on, self._attn.ragged = True, ragged
        try:
            with self._fast.active():
                yield
        finally:
            self._attn.on, self._attn.ragged = False, None

    # ---- forwards --------------------------------------------------------
    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.num_layers, capacity)

    @torch.inference_mode()
    def _forward(self, cache: KVCache, inputs: TreeInputs, keep_last: int | None) -> torch.Tensor:
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if keep_last is not None and self._keep_kw:
            kwargs["logits_to_keep"] = keep_last
        with self._active():
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

    def new_batch_cache(self, slots: int) -> BatchKVCache:
        return BatchKVCache(self.num_layers, slots)

    def prefill(self, cache: KVCache, tokens: list[int]) -> None:
        """Commit `tokens` to the cache without computing their logits (the last one is left as the next root)."""
        if not tokens:
            return
        base = cache.length
        inputs = causal_inputs(tokens, base, self.device)
        if base == 0:
            # Let the model build its own causal mask: SDPA then takes its fused causal kernel,
            # ~25% faster than an explicit boolean mask on a 2,000-token CPU prefill.
            inputs.attention_mask = None
        self._forward(cache, inputs, keep_last=1)
        cache.length = base + len(tokens)

    def verify(self, cache: KVCache, tree: DraftTree) -> torch.Tensor:
        """Logits of every tree row, [1 + n, vocab]. Rows are written after the committed cache; call commit next."""
        return self._forward(cache, tree_inputs(tree, cache.length, self.device), keep_last=len(tree.tokens))

    def verify_batch(self, cache: BatchKVCache, trees: list[DraftTree], width: int,
                     ragged: bool = False) -> list[torch.Tensor]:
        """Logits of every row's tree, row b's as [>= len(trees[b].tokens), vocab]; call cache.commit next.

        Padded: every row sends `width` tokens. Ragged (when the model allows it): row b sends only its
        own tree's tokens, all packed into one sequence, so no linear layer computes padding.
        """
        inputs = batch_tree_inputs(trees, cache.lengths, width, self.device)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        counts = [len(t.tokens) for t in trees]
        if not (ragged and self.ragged) or all(c == width for c in counts):
            cache.begin_forward(width)
            with torch.inference_mode(), self._active():
                out = self.model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                                 position_ids=inputs.position_ids, **kwargs)
            return list(out.logits.float())
        plan = cache.begin_forward(width, counts)
        slot_of = torch.cat([torch.arange(c) for c in counts]).to(self.device)  # [tokens]
        layout = attention.RaggedQueries(len(trees), width, plan.row_of, slot_of,
                                         counts, list(cache.lengths))
        with torch.inference_mode(), self._active(layout):
            out = self.model(input_ids=inputs.input_ids[plan.row_of, slot_of][None],
                             attention_mask=inputs.attention_mask,  # [rows, 1, width, kv_len]: attention reads it per row
                             position_ids=inputs.position_ids[plan.row_of, slot_of][None], **kwargs)
        return list(out.logits[0].float().split(counts))

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
            if not torch.allclose(both[row], ref, atol=1e-3, rtol=1e-3):
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
            cache = self.new_batch_cache(len(trees))
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
            if not torch.allclose(padded[:n], ragged[:n], atol=1e-3, rtol=1e-3):
                log.info("%s: ragged batch forwards disagree with padded ones; batches are padded",
                         type(self.model).__name__)
                return False
        return True

    def measure_cost_model(self, short_context: int = 512, long_context: int = 2048) -> CostModel:
        long_context = min(long_context, self._max_positions() - max(COST_SIZES) - 1)
        short_context = min(short_context, long_context // 2)
        return CostModel(self.measure_cost_curve(short_context), self.measure_cost_curve(long_context),
                         short_context, long_context)

    def _max_positions(self) -> int:
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None) or 4096

    @torch.inference_mode()
    def measure_cost_curve(self, context: int = 512, sizes: tuple[int, ...] = COST_SIZES, rounds: int = 3) -> CostCurve:
        """ms of a verification forward of each size, after `context` committed tokens.

        Sizes are interleaved over several rounds and the fastest time kept, so
        a burst of noise from a shared machine does not skew one size; the curve
        is then made non-decreasing (a bigger forward never looks cheaper).
        """
        vocab = self.model.config.get_text_config().vocab_size
        gen = torch.Generator().manual_seed(0)
        ctx = torch.randint(0, vocab, (context,), generator=gen).tolist()
        cache = self.new_cache(context + max(sizes) + 1)
        self.prefill(cache, ctx)
        best = {n: float("inf") for n in sizes}
        chains = {n: DraftTree(ctx[:n], [-1] + list(range(n - 1)), list(range(n)), [1.0] * n) for n in sizes}
        for n in sizes:  # warm-up
            self.verify(cache, chains[n])
        for _ in range(rounds):
            for n in sizes:
                t0 = time.perf_counter()
                self.verify(cache, chains[n])
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                best[n] = min(best[n], (time.perf_counter() - t0) * 1e3)
        points, floor = {}, 0.0
        for n in sorted(sizes):
            floor = max(floor, best[n])
            points[n] = floor
        log.info("forward cost at context %d (ms by tokens): %s", context, {k: round(v, 1) for k, v in points.items()})
        return CostCurve(points)
