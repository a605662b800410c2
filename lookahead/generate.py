"""One request, start to finish: prefill, then draft -> verify -> commit -> learn.

Each step takes the last token as the tree root, asks the tries for drafts
continuing the context, lets the cost policy trim them (to nothing when they
would not pay for their forward), verifies the tree in one forward, accepts
the longest agreeing path plus the bonus token, keeps only those KV entries,
and teaches the request's own trie what was emitted. When the request ends,
its output goes into the shared memory for later requests.

With lookahead disabled the same loop runs root-only trees: the project's own
plain decoder, kept as a second oracle beside `model.generate`. The batching
engine (engine.py) runs the same `Sequence` steps for many requests at once.
"""

import logging
import time
from collections.abc import Iterator, Sequence as Seq

from .config import LookaheadConfig, from_pia_kwargs
from .policy import CalibrationTable, CostModel, choose_drafts
from .runner import ModelRunner
from .sampling import SamplingParams
from .sequence import Generation, Sequence, StopCriteria
from .trie import TokenTrie

log = logging.getLogger(__name__)

__all__ = ["LookaheadDecoder", "GenerationStream", "Generation", "StopCriteria"]


class LookaheadDecoder:
    """A model runner plus the state lookahead shares across requests: output memory, cost model, calibration."""

    def __init__(
        self,
        runner: ModelRunner,
        config: LookaheadConfig = LookaheadConfig(),
        tokenizer=None,
        cost: CostModel | None = None,
        eos_token_ids: Seq[int] = (),
    ) -> None:
        self.runner = runner
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.memory = TokenTrie(config.branch_length + 1, config.stop_words, max_nodes=config.memory_max_nodes)
        self.cost = cost if cost is not None else (runner.measure_cost_model() if config.adaptive else CostModel.flat())
        self.calibration = CalibrationTable()

    def new_sequence(
        self,
        prompt_ids: Seq[int],
        stop: StopCriteria | None = None,
        sampling: SamplingParams = SamplingParams(),
        lookahead: LookaheadConfig | None = None,
        decoding_kwargs: dict | None = None,
    ) -> Sequence:
        la = from_pia_kwargs(lookahead or self.config, decoding_kwargs)
        if la.enabled and la.branch_length > self.config.branch_length:
            raise ValueError(
                f"branch_length={la.branch_length} exceeds the memory's n-gram depth {self.config.branch_length}"
            )
        stop = stop or StopCriteria(eos_token_ids=self.eos_token_ids)
        return Sequence(list(prompt_ids), stop, sampling, la, self.tokenizer)

    def stream(self, prompt_ids: Seq[int], **kwargs) -> "GenerationStream":
        return GenerationStream(self, self.new_sequence(prompt_ids, **kwargs))

    def generate(self, prompt_ids: Seq[int], **kwargs) -> Generation:
        run = self.stream(prompt_ids, **kwargs)
        for _ in run:
            pass
        return run.result()


class GenerationStream:
    """Iterating yields the tokens emitted by each step; `result()` gives the whole generation."""

    def __init__(self, decoder: LookaheadDecoder, seq: Sequence) -> None:
        self.decoder = decoder
        self.seq = seq

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens

    @property
    def stats(self):
        return self.seq.stats

    @property
    def finish_reason(self) -> str | None:
        return self.seq.finish_reason

    def result(self) -> Generation:
        return self.seq.result()

    def __iter__(self) -> Iterator[list[int]]:
        d, seq = self.decoder, self.seq
        la, st = seq.la, seq.stats
        cache = d.runner.new_cache(len(seq.ctx) + seq.stop.max_new_tokens + la.decoding_length + 2)
        t0 = time.perf_counter()
        d.runner.prefill(cache, seq.ctx[:-1])
        st.prefill_ms = (time.perf_counter() - t0) * 1e3
        try:
            while not seq.finished:
                t0 = time.perf_counter()
                tree = seq.propose(d.memory)
                if la.adaptive and tree.num_drafts:
                    cost = d.cost.curve_at(len(seq.ctx))
                    factor = d.calibration.factor(tree.match_length)
                    tree = tree.truncated(choose_drafts(tree.probs, cost, factor, la.decoding_length))
                t1 = time.perf_counter()
                logits = d.runner.verify(cache, tree)  # [1 + drafts, vocab]
                t2 = time.perf_counter()
                acc = seq.choose(tree, logits)
                cache.commit(cache.length, [0] + acc.rows)
                emitted = seq.advance(tree, acc, d.calibration)
                st.query_ms += (t1 - t0) * 1e3
                st.forward_ms += (t2 - t1) * 1e3
                if la.debug:
                    log.info("step %d: %d drafts (match %d), accepted %d",
                             st.steps, tree.num_drafts, tree.match_length, len(acc.rows))
                yield emitted
        finally:
            seq.close(d.memory)
