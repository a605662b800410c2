"""The measured safety net: does drafting pay at this batch size?

The budget policy drafts where its models expect a gain: the trie's
calibrated probabilities and the forward-cost model. Models can be wrong, and
a step's Python work (building trees, replaying shadows) is in neither. So
the engine also measures, per class of running-batch size, the tokens per
second the whole decode step really delivered, separately for steps that
verified drafts and steps that did not (optionally forcing one step in
`reference_every` plain while a class has no plain reference; off by
default, since those steps measurably cost at low concurrency). Where
drafting steps come out clearly slower than plain ones (below `margin`, to
stay out of the timing noise), drafting is switched
off in that class (rows do not even build their trees) and probed again
every `probe_every` steps, so a change in load or in the text brings it back.
The same goes for a class where the budget keeps pricing drafts out: after
`min_steps` steps in a row whose rows held drafts it rated likely but found
too dear, its rows stop building trees the budget would not use (~0.25 ms a
row per step on the 2-core CPU at 9-15 rows, proposing, pricing and shadowing), again with a probe
every `probe_every` steps. Steps declined for weak matches say nothing:
they are about the text, not the batch size.

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


def size_class(rows: int) -> int:
    """Batch sizes are judged in classes 1, 2, 3-4, 5-8, 9-16, ...: neighbours behave alike, and a class
    gathers its samples far sooner than one exact size would while requests come and go."""
    return 1 << (rows - 1).bit_length()


@dataclass
class Payoff:
    min_steps: int = 8  # steps of each kind in a size class before the check may turn drafting off there
    probe_every: int = 16  # while off, let the policy draft again every this many steps
    reference_every: int = 0  # if > 0: while plain steps are too few to compare with, every this many is plain
    margin: float = 0.97  # drafting is turned off only when it delivers below this share of plain's tokens/s
    decay: float = 0.95  # per step of that kind: the check follows roughly the last 20 of each
    _rates: dict[int, tuple[Rate, Rate]] = field(default_factory=dict)  # size class -> (drafting steps, plain steps)
    _skipped: dict[int, int] = field(default_factory=dict)  # size class -> steps kept plain since the last probe
    _seen: dict[int, int] = field(default_factory=dict)  # size class -> steps asked about
    _priced_out: dict[int, int] = field(default_factory=dict)  # size class -> steps in a row that priced drafts out

    def rates(self, rows: int) -> tuple[Rate, Rate]:
        c = size_class(rows)
        if c not in self._rates:
            self._rates[c] = (Rate(), Rate())
        return self._rates[c]

    def pays(self, rows: int) -> bool:
        """Whether drafting, as the policy chooses it, has delivered at least plain steps' tokens/s here."""
        drafting, plain = self.rates(rows)
        if drafting.steps < self.min_steps or plain.steps < self.min_steps:
            return True
        return drafting.per_second >= self.margin * plain.per_second

    def allow(self, rows: int) -> bool:
        """May rows build and verify drafts this step?

        Yes while drafting pays (or is not yet measured), except that a class
        whose drafting steps have no plain steps to be compared with takes
        every `reference_every`-th step plainly. No while it loses, or while
        the budget has priced every likely draft out lately, except a probe
        every `probe_every` steps.
        """
        c = size_class(rows)
        drafting, plain = self.rates(rows)
        self._seen[c] = self._seen.get(c, 0) + 1
        if self.reference_every and drafting.steps >= self.min_steps and plain.steps < self.min_steps:
            return self._seen[c] % self.reference_every != 0
        if self.pays(rows) and self._priced_out.get(c, 0) < self.min_steps:
            self._skipped[c] = 0
            return True
        self._skipped[c] = self._skipped.get(c, 0) + 1
        if self._skipped[c] >= self.probe_every:
            self._skipped[c] = 0
            return True
        return False

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, priced_out: bool = False) -> None:
        """One decode step: did it verify drafts, how many tokens it delivered, its whole time; `priced_out`:
        its rows held drafts the budget rated likely and declined for their price."""
        drafting, plain = self.rates(rows)
        (drafting if drafted else plain).add(tokens, seconds, self.decay)
        c = size_class(rows)
        if drafted:
            self._priced_out[c] = 0
        elif priced_out:
            self._priced_out[c] = self._priced_out.get(c, 0) + 1
