"""The measured safety net: does drafting pay at this batch size?

The budget policy drafts where its models expect a gain: the trie's
calibrated probabilities and the forward-cost model. Models can be wrong, and
a step's Python work (building trees, replaying shadows) is in neither. So
the engine also measures, per running-batch size, the tokens per second the
whole decode step really delivered, separately for steps that verified
drafts and steps that did not. Where drafting steps come out slower than
plain ones, drafting is switched off at that batch size (rows do not even
build their trees) and probed again every `probe_every` steps, so a change in
load or in the text brings it back.

On a compute-bound CPU this is what keeps lookahead from ever costing
throughput at high concurrency: wide batches already use the cores, drafts
rarely pay there, and the check turns them off on measurement rather than on
a model's say-so.

Pure Python; no torch.
"""

from dataclasses import dataclass, field


@dataclass
class Rate:
    """Decayed sums of tokens delivered and seconds spent by one kind of step."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float, decay: float) -> None:
        self.tokens = self.tokens * decay + tokens
        self.seconds = self.seconds * decay + seconds
        self.steps += 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Payoff:
    min_steps: int = 8  # steps of each kind at a batch size before the check may turn drafting off there
    probe_every: int = 16  # while off, let the policy draft again every this many steps
    decay: float = 0.95  # per step of that kind: the check follows roughly the last 20 of each
    _rates: dict[int, tuple[Rate, Rate]] = field(default_factory=dict)  # rows -> (drafting steps, plain steps)
    _skipped: dict[int, int] = field(default_factory=dict)  # rows -> steps kept plain since the last probe

    def rates(self, rows: int) -> tuple[Rate, Rate]:
        if rows not in self._rates:
            self._rates[rows] = (Rate(), Rate())
        return self._rates[rows]

    def pays(self, rows: int) -> bool:
        """Whether drafting, as the policy chooses it, has delivered at least plain steps' tokens/s here."""
        drafting, plain = self.rates(rows)
        if drafting.steps < self.min_steps or plain.steps < self.min_steps:
            return True
        return drafting.per_second >= plain.per_second

    def allow(self, rows: int) -> bool:
        """May rows build and verify drafts this step? (Counts the probe interval while the answer is no.)"""
        if self.pays(rows):
            self._skipped[rows] = 0
            return True
        self._skipped[rows] = self._skipped.get(rows, 0) + 1
        if self._skipped[rows] >= self.probe_every:
            self._skipped[rows] = 0
            return True
        return False

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float) -> None:
        """One decode step: did it verify drafts, how many tokens it delivered, its whole time."""
        drafting, plain = self.rates(rows)
        (drafting if drafted else plain).add(tokens, seconds, self.decay)
