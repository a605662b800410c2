"""The one safety net under the planner: does drafting deliver more tokens per second at this batch size?

The planner drafts where the step table and the calibrated probabilities
expect a gain. Either can be wrong for a while (a table seeded at another
context length, a plain price not measured since the planner last chose a
plain step, a trie whose estimates drifted), and the planner cannot weigh
what is spent before it runs: every row matching its context and building
a tree. So the engine also measures, per class of running-batch size, the
tokens per second that whole decode steps delivered, proposing included,
separately for steps whose rows proposed drafts (whatever the planner then
kept) and steps held plain, and runs the kind that delivers more.

Both rates are measured, never inferred: until each kind has `min_steps`
steps in a class, the kinds take turns there; from then on the losing kind
still runs one step in `probe_every`, so a change in load or text that
makes it the winner is seen, and the winner's rate is never compared with
a stale figure (judged against the step table's plain price instead, a
class that always drafted could keep a plain price no step had refreshed
since start-up). Drafting that merely ties plain buys nothing, so it must
deliver at least `margin` (1.0) of the plain rate.

A lone row is never held (`min_rows`, 2). Held steps propose nothing, so
the calibration learns nothing from them, and the probes then draft too
little to win back: a verdict drawn from a process's first steps (new
shapes, an empty trie, the opening of an answer) held whole requests plain
that paid to draft. From 2 rows up the check earns its place. The runs
behind both: docs/planner.md ("Stop 30").

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
    min_steps: int = 8  # steps of each kind in a size class before it is judged; until then the kinds take turns
    probe_every: int = 32  # once judged, the losing kind still runs one step in this many
    margin: float = 1.0  # drafting runs only while it delivers at least this share of plain's tokens/s
    decay: float = 0.95  # per step of that kind: each rate follows roughly its last 20 steps
    min_rows: int = 2  # a batch of fewer rows always may draft: the planner alone decides (see above)
    enabled: bool = True
    _rates: dict[int, tuple[Rate, Rate]] = field(default_factory=dict)  # size class -> (proposing, held steps)
    _since: dict[int, int] = field(default_factory=dict)  # size class -> steps since the losing kind last ran

    def rates(self, rows: int) -> tuple[Rate, Rate]:
        c = size_class(rows)
        if c not in self._rates:
            self._rates[c] = (Rate(), Rate())
        return self._rates[c]

    def pays(self, rows: int) -> bool | None:
        """Whether steps that propose drafts have delivered at least held steps' tokens/s here; None until both
        kinds are measured."""
        drafting, plain = self.rates(rows)
        if drafting.steps < self.min_steps or plain.steps < self.min_steps:
            return None
        return drafting.per_second >= self.margin * plain.per_second

    def allow(self, rows: int) -> bool:
        """May rows build and verify drafts this step? While a class is being measured, the kind with fewer
        steps runs (proposing first); then the winner, and the loser one step in `probe_every`."""
        if not self.enabled or rows < self.min_rows:
            return True
        verdict = self.pays(rows)
        if verdict is None:
            drafting, plain = self.rates(rows)
            return drafting.steps <= plain.steps
        c = size_class(rows)
        self._since[c] = self._since.get(c, 0) + 1
        if self._since[c] >= self.probe_every:
            self._since[c] = 0
            return not verdict
        return verdict

    def record(self, rows: int, proposed: bool, tokens: int, seconds: float) -> None:
        """One decode step: did its rows propose drafts, how many tokens it delivered, its whole time."""
        drafting, plain = self.rates(rows)
        (drafting if proposed else plain).add(tokens, seconds, self.decay)
