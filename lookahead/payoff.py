"""The one safety net under the planner: does drafting deliver more tokens per second at this batch size?

The planner drafts where the step table and the calibrated probabilities
expect a gain. Either can be wrong for a while (a table seeded at another
context length, a trie whose estimates drifted), and the planner cannot
weigh what is spent before it runs: every row matching its context and
building a tree. So the engine also measures, per class of running-batch
size, the tokens per second that whole decode steps delivered, proposing
included, separately for steps whose rows proposed drafts (whatever the
planner then kept) and steps held plain. Where proposing steps come out
slower than plain ones (below `margin` of their tokens/s: 1.0, since
drafting that merely ties plain buys nothing), the class is held plain, so
rows do not even build trees, and probed again every `probe_every` steps,
so that a change in load or text brings drafting back.

That covers the common case on a compute-bound batch: the planner buys no
draft, yet every row still matched its context and built a tree for
nothing. Judged by verified drafts alone, such steps counted as plain ones,
and what they spent was never seen.

A class that always proposes has no held steps to compare with; there the
plain rate is the step table's: the rows over the plain step's measured
price (`expect_plain`). The table leaves proposing out of what it prices,
so that is what a held step costs.

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
    probe_every: int = 16  # while off, let the planner draft again every this many steps
    margin: float = 1.0  # drafting is turned off when it delivers below this share of plain's tokens/s
    decay: float = 0.95  # per step of that kind: the check follows roughly the last 20 of each
    enabled: bool = True
    _rates: dict[int, tuple[Rate, Rate]] = field(default_factory=dict)  # size class -> (proposing, held steps)
    _table: dict[int, Rate] = field(default_factory=dict)  # size class -> plain steps as the step table prices them
    _skipped: dict[int, int] = field(default_factory=dict)  # size class -> steps kept plain since the last probe

    def rates(self, rows: int) -> tuple[Rate, Rate]:
        c = size_class(rows)
        if c not in self._rates:
            self._rates[c] = (Rate(), Rate())
        return self._rates[c]

    def pays(self, rows: int) -> bool:
        """Whether drafting, as the planner chooses it, has delivered at least plain steps' tokens/s here."""
        drafting, plain = self.rates(rows)
        if plain.steps < self.min_steps:
            plain = self._table.get(size_class(rows), plain)
        if not self.enabled or drafting.steps < self.min_steps or plain.steps < self.min_steps:
            return True
        return drafting.per_second >= self.margin * plain.per_second

    def allow(self, rows: int) -> bool:
        """May rows build and verify drafts this step? Yes while drafting pays (or is not yet measured); no
        while it loses, except a probe every `probe_every` steps."""
        c = size_class(rows)
        if self.pays(rows):
            self._skipped[c] = 0
            return True
        self._skipped[c] = self._skipped.get(c, 0) + 1
        if self._skipped[c] >= self.probe_every:
            self._skipped[c] = 0
            return True
        return False

    def record(self, rows: int, proposed: bool, tokens: int, seconds: float) -> None:
        """One decode step: did its rows propose drafts, how many tokens it delivered, its whole time."""
        drafting, plain = self.rates(rows)
        (drafting if proposed else plain).add(tokens, seconds, self.decay)

    def expect_plain(self, rows: int, plain_seconds: float) -> None:
        """Beside a proposing step: what a held step of these rows would have taken, by the step table."""
        self._table.setdefault(size_class(rows), Rate()).add(rows, plain_seconds, self.decay)
