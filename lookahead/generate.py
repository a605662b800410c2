"""One request, start to finish: prefill, then draft -> verify -> commit -> learn.

Each step takes the last token as the tree root, asks the tries for drafts
continuing the context, lets the cost policy trim them (to nothing when they
would not pay for their forward), verifies the tree in one forward, accepts
the longest agreeing path plus the bonus token, keeps only those KV entries,
and teaches the request's own trie what was emitted. When the request ends,
its output goes into the shared memory for later requests.

With lookahead disabled the same loop runs root-only trees: the project's own
plain decoder, kept as a second oracle beside `model.generate`.
"""

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .config import LookaheadConfig, from_pia_kwargs
from .draft import DraftTree, build_tree, match, root_only
from .policy import CalibrationTable, CostModel, choose_drafts
from .runner import ModelRunner
from .sampling import RowChooser, SamplingParams
from .stats import RequestStats
from .trie import TokenTrie
from .verify import accept

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopCriteria:
    max_new_tokens: int = 128
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"invalid max_new_tokens={self.max_new_tokens!r}: must be >= 1")


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "length" | "eos" | "stop"
    stats: RequestStats


class LookaheadDecoder:
    """A model runner plus the state lookahead shares across requests: output memory, cost curve, calibration."""

    def __init__(
        self,
        runner: ModelRunner,
        config: LookaheadConfig = LookaheadConfig(),
        tokenizer=None,
        cost: CostModel | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.runner = runner
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.memory = TokenTrie(config.branch_length + 1, config.stop_words, max_nodes=config.memory_max_nodes)
        self.cost = cost if cost is not None else (runner.measure_cost_model() if config.adaptive else CostModel.flat())
        self.calibration = CalibrationTable()

    def stream(
        self,
        prompt_ids: Sequence[int],
        stop: StopCriteria | None = None,
        sampling: SamplingParams = SamplingParams(),
        lookahead: LookaheadConfig | None = None,
        decoding_kwargs: dict | None = None,
    ) -> "GenerationStream":
        la = from_pia_kwargs(lookahead or self.config, decoding_kwargs)
        if la.branch_length > self.config.branch_length:
            raise ValueError(
                f"branch_length={la.branch_length} exceeds the memory's n-gram depth {self.config.branch_length}"
            )
        stop = stop or StopCriteria(eos_token_ids=self.eos_token_ids)
        return GenerationStream(self, list(prompt_ids), stop, sampling, la)

    def generate(self, prompt_ids: Sequence[int], **kwargs) -> Generation:
        run = self.stream(prompt_ids, **kwargs)
        for _ in run:
            pass
        return run.result()


@dataclass
class GenerationStream:
    """Iterating yields the tokens emitted by each step; `result()` gives the whole generation."""

    decoder: LookaheadDecoder
    prompt: list[int]
    stop: StopCriteria
    sampling: SamplingParams
    la: LookaheadConfig
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("prompt_ids must hold at least one token")
        self._generator = None
        if self.sampling.do_sample:
            self._generator = torch.Generator()
            if self.sampling.seed is not None:
                self._generator.manual_seed(self.sampling.seed)
            else:
                self._generator.seed()
        self._stop_window = max((len(s) for s in self.stop.stop_strings), default=0) + 1

    def result(self) -> Generation:
        assert self.finish_reason is not None, "the stream has not finished"
        return Generation(self.tokens, self.finish_reason, self.stats)

    def __iter__(self) -> Iterator[list[int]]:
        d, la, st = self.decoder, self.la, self.stats
        t_start = time.perf_counter()
        ctx = list(self.prompt)  # every token so far; ctx[-1] is the next root (not in the KV cache)
        st.prompt_tokens = len(ctx)
        local = TokenTrie(la.branch_length + 1, la.stop_words)
        drafting = la.enabled and la.decoding_length > 0
        if drafting:
            local.add_sequence(ctx)
        sources = [(local, la.prompt_weight), (d.memory, 1.0)]
        cache = d.runner.new_cache(len(ctx) + self.stop.max_new_tokens + la.decoding_length + 2)
        t0 = time.perf_counter()
        d.runner.prefill(cache, ctx[:-1])
        st.prefill_ms = (time.perf_counter() - t0) * 1e3
        greedy_fast = not self.sampling.needs_processing
        try:
            while self.finish_reason is None:
                remaining = self.stop.max_new_tokens - len(self.tokens)
                t0 = time.perf_counter()
                tree = self._draft(ctx, sources, remaining) if drafting else root_only(ctx[-1])
                t1 = time.perf_counter()
                logits = d.runner.verify(cache, tree)  # [1 + drafts, vocab]
                t2 = time.perf_counter()
                if greedy_fast:
                    preds = logits.argmax(-1).tolist()
                    acc = accept(tree, lambda row, path: preds[row])
                else:
                    chooser = RowChooser(self.sampling, ctx, self._generator)
                    acc = accept(tree, lambda row, path: chooser(logits[row], path))
                base = cache.length
                cache.commit(base, [0] + acc.rows)
                emitted = self._emit(acc.tokens)
                old = len(ctx)
                ctx.extend(emitted)
                if drafting:
                    local.extend(ctx, old, len(ctx))
                    if tree.num_drafts:
                        d.calibration.update(tree.match_length, sum(tree.probs[1:]), len(acc.rows))
                st.steps += 1
                st.draft_tokens += tree.num_drafts
                st.accepted_drafts += len(acc.rows)
                st.query_ms += (t1 - t0) * 1e3
                st.forward_ms += (t2 - t1) * 1e3
                if st.steps == 1:
                    st.first_token_s = time.perf_counter() - t_start
                if la.debug:
                    log.info("step %d: %d drafts (match %d), accepted %d", st.steps, tree.num_drafts, tree.match_length, len(acc.rows))
                yield emitted
        finally:
            st.new_tokens = len(self.tokens)
            st.total_s = time.perf_counter() - t_start
            if self.finish_reason is None:
                self.finish_reason = "cancelled"
        if drafting and self.tokens:
            d.memory.add_sequence(self.tokens)

    def _draft(self, ctx: list[int], sources, remaining: int) -> DraftTree:
        la = self.la
        max_depth = min(la.branch_length, remaining - 1)
        if max_depth < 1:
            return root_only(ctx[-1])
        m, matched = match(sources, ctx, la.max_query_length, la.min_query_length)
        tree = build_tree(ctx[-1], matched, m, la.decoding_mode, la.decoding_length, max_depth)
        if la.adaptive and tree.num_drafts:
            d = self.decoder
            cost = d.cost.curve_at(len(ctx))
            tree = tree.truncated(choose_drafts(tree.probs, cost, d.calibration.factor(tree.match_length), la.decoding_length))
        return tree

    def _emit(self, step_tokens: list[int]) -> list[int]:
        """Append the step's tokens up to the first stop condition; return what was appended."""
        emitted = []
        for tok in step_tokens:
            self.tokens.append(tok)
            emitted.append(tok)
            if tok in self.stop.eos_token_ids:
                self.finish_reason = "eos"
            elif self.stop.stop_strings and self._hit_stop_string():
                self.finish_reason = "stop"
            elif len(self.tokens) >= self.stop.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                break
        return emitted

    def _hit_stop_string(self) -> bool:
        tok = self.decoder.tokenizer
        assert tok is not None, "stop strings need the decoder's tokenizer"
        tail = tok.decode(self.tokens[-self._stop_window :])
        return any(s in tail for s in self.stop.stop_strings)
