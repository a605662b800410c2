"""One request at a time: `LookaheadDecoder.generate` and `stream` run the batching engine's step on a batch of one.

There is one step implementation (engine.py: schedule -> plan -> forward ->
accept -> commit); a single stream is that step with one row, run on the
caller's thread. With lookahead disabled the same loop runs root-only trees:
the project's own plain decoder, kept as a second oracle beside
`model.generate`.

The decoder holds what lookahead shares across requests and engines: the
output memory, the calibration of the trie's estimates, and the step-time
tables (one per engine shape, seeded from the model's own forwards).
"""

from collections.abc import Iterator, Sequence as Seq

from lookahead.config import LookaheadConfig, from_pia_kwargs
from lookahead.core.calibration import CalibrationTable
from lookahead.model.runner import ModelRunner
from lookahead.model.sampling import SamplingParams
from lookahead.engine.sequence import Generation, Sequence, StopCriteria
from lookahead.core.step_table import StepTable
from lookahead.core.trie import TokenTrie

__all__ = ["LookaheadDecoder", "GenerationStream", "Generation", "StopCriteria"]


class LookaheadDecoder:
    """A model runner plus the state lookahead shares across requests: output memory, calibration, step tables."""

    def __init__(
        self,
        runner: ModelRunner,
        config: LookaheadConfig = LookaheadConfig(),
        tokenizer=None,
        table: StepTable | None = None,
        eos_token_ids: Seq[int] = (),
    ) -> None:
        self.runner = runner
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.memory = TokenTrie(config.branch_length + 1, config.stop_words, max_nodes=config.memory_max_nodes)
        # A given table serves every engine (tests; `flat` when the budget is fixed); else each engine shape
        # gets its own, seeded at its first use from timed forwards.
        self.table = table if table is not None else (None if config.adaptive else StepTable.flat())
        self._tables: dict[tuple[int, int, bool], StepTable] = {}
        self.calibration = CalibrationTable()
        self._single = None  # the batch-of-one engine `stream` runs

    def step_table(self, max_rows: int, max_tokens: int, ragged: bool) -> StepTable:
        if self.table is not None:
            return self.table
        key = (max_rows, max_tokens, ragged)
        if key not in self._tables:
            width = min(max_tokens, self.config.decoding_length + 1)
            self._tables[key] = self.runner.seed_step_table(max_rows, max_tokens, width, ragged)
        return self._tables[key]

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

    def single_engine(self):
        """The engine of one row that `stream` and `generate` step on the caller's thread (no prefix cache:
        every call prefills its prompt, as plain decoding does)."""
        if self._single is None:
            from lookahead.engine.engine import Engine
            from lookahead.engine.scheduler import SchedulerConfig

            tokens = self.config.decoding_length + 1
            # KV room for one request of the model's whole context (or twice 4,096 when unstated), not a device's
            room = 2 * 4096 if self.runner.context_length is None else self.runner.context_length + tokens
            self._single = Engine(self, SchedulerConfig(max_batch_size=1, max_tokens_per_step=tokens,
                                                        prefill_chunk=1 << 30, prefix_cache_mb=0,
                                                        kv_cache_gb=room * self.runner.kv_shape.token_bytes / 2**30))
        return self._single

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
        engine = self.decoder.single_engine()
        assert not engine.alive and engine.scheduler.idle(), "one stream at a time per decoder"
        handle = engine.submit(self.seq, loop=None)
        try:
            while not handle.done:
                engine.step()
                yield from handle.drain()
        finally:
            if not handle.done:  # the caller stopped early: end it and free its row
                handle.cancel()
                engine.step()
