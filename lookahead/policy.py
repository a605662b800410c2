"""How many draft tokens are worth one verification forward.

A forward over k tokens costs cost(k) ms, measured on the actual hardware at
start-up at a short and a long context (`CostModel`): attention makes a wide
tree dearer the longer the context, so the same drafts may pay at 500 tokens
and not at 2,000. A tree whose rows are accepted with probabilities
p_1..p_n yields, in expectation, 1 + sum(p_i) tokens (the accepted path plus
the model's bonus token). Verifying the first k rows therefore buys
(1 + sum_{i<=k} p_i) / cost(1 + k) tokens per ms, against 1 / cost(1) for a
plain step. The policy picks the k with the best rate, often 0 when the trie
match is weak: then the step is a plain decode step.

The trie's probabilities are frequencies, and how far they can be trusted
depends on how long a context suffix matched: replaying SmolLM2's greedy
outputs (shared/tools), rows the trie rated 0.5 were accepted ~10% of the time
after a 1-token match and ~65% after a 4-token match. `CalibrationTable`
therefore keeps, per match length, the running ratio of accepted to predicted
tokens and rescales the trie's estimates by it.

Pure Python; no torch.
"""

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CostCurve:
    """Forward cost by tokens in flight, linearly interpolated between measured points."""

    points: dict[int, float]  # tokens in one forward -> ms

    def __post_init__(self) -> None:
        assert 1 in self.points, "the curve needs the 1-token (plain step) cost"
        self._ks = sorted(self.points)

    def __call__(self, n: int) -> float:
        ks, pts = self._ks, self.points
        if n in pts:
            return pts[n]
        if n >= ks[-1]:  # extrapolate along the last segment
            a, b = (ks[-2], ks[-1]) if len(ks) > 1 else (ks[-1], ks[-1])
        else:
            i = bisect.bisect_left(ks, n)
            a, b = ks[i - 1], ks[i]
        if a == b:
            return pts[a] * n / a
        return pts[a] + (pts[b] - pts[a]) * (n - a) / (b - a)

    @classmethod
    def flat(cls) -> "CostCurve":
        """Every forward costs the same: PIA's implicit assumption."""
        return cls({1: 1.0, 4096: 1.0})


@dataclass
class CostModel:
    """Forward cost by tokens in flight and context length: two measured curves, linear in context between them."""

    short: CostCurve
    long: CostCurve
    short_context: int = 512
    long_context: int = 2048

    def curve_at(self, context: int):
        """cost(n) at this context length."""
        w = (context - self.short_context) / (self.long_context - self.short_context)
        w = max(0.0, w)  # below the short context, the short curve; above the long one, extrapolate

        def cost(n: int) -> float:
            a = self.short(n)
            return a + (self.long(n) - a) * w

        return cost

    @property
    def points(self) -> dict[str, dict[int, float]]:
        return {str(self.short_context): self.short.points, str(self.long_context): self.long.points}

    @classmethod
    def flat(cls) -> "CostModel":
        return cls(CostCurve.flat(), CostCurve.flat())


@dataclass
class Calibration:
    """Running ratio of accepted tokens to the trie's predicted sum, per step."""

    predicted: float = 4.0  # a mild prior: trust the trie at about 3/4
    accepted: float = 3.0
    decay: float = 0.98

    @property
    def factor(self) -> float:
        return min(1.0, max(0.05, self.accepted / self.predicted))

    def update(self, predicted: float, accepted: int) -> None:
        if predicted <= 0:
            return
        self.predicted = self.predicted * self.decay + predicted
        self.accepted = self.accepted * self.decay + accepted


@dataclass
class CalibrationTable:
    """One `Calibration` per matched suffix length."""

    by_match: dict[int, Calibration] = field(default_factory=dict)

    def get(self, match_length: int) -> Calibration:
        cal = self.by_match.get(match_length)
        if cal is None:
            cal = self.by_match[match_length] = Calibration()
        return cal

    def factor(self, match_length: int) -> float:
        return self.get(match_length).factor

    def update(self, match_length: int, predicted: float, accepted: int) -> None:
        self.get(match_length).update(predicted, accepted)


def choose_drafts(probs: list[float], cost: Callable[[int], float], factor: float, max_drafts: int) -> int:
    """Number of leading draft rows to verify (0 = plain step). probs[0] is the root."""
    best_k, best_rate = 0, 1.0 / cost(1)
    gain = 1.0
    for k in range(1, min(len(probs) - 1, max_drafts) + 1):
        gain += probs[k] * factor
        rate = gain / cost(1 + k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def choose_width(rows_probs: list[list[float]], cost: Callable[[int], float], max_tokens: int, max_width: int) -> int:
    """Tree width (root + drafts) shared by every row of one batched forward.

    Padding makes every row pay for the widest tree, so the batch picks one
    width Q: it buys sum_b (1 + p_b1 + ... + p_b(Q-1)) tokens for cost(n * Q).
    rows_probs[b] holds row b's calibrated draft probabilities, best first.
    Q = 1 is a plain decode step for everyone. n * Q never exceeds max_tokens.
    """
    n = len(rows_probs)
    best_q, best_rate = 1, n / cost(n)
    gain = float(n)
    for q in range(2, max_width + 1):
        if n * q > max_tokens:
            break
        gain += sum(p[q - 2] for p in rows_probs if len(p) >= q - 1)
        rate = gain / cost(n * q)
        if rate > best_rate:
            best_q, best_rate = q, rate
    return best_q


def choose_counts(rows_probs: list[list[float]], cost: Callable[[int, int, int], float], max_tokens: int) -> list[int]:
    """Draft rows per batch row for a ragged forward, where each row sends only its own tokens.

    The linear layers cost by the total tokens n + k, wherever the drafts sit,
    so the best k drafts are the most likely ones across the batch. They are
    taken greedily, highest first, each row's drafts in their own order (a
    tree's truncation must be a prefix); `cost(tokens, width, drafting)`
    prices the forward (attention may span the widest row's tree, or go row
    by row when few rows draft), and the k with the best expected tokens per
    ms wins, 0 being a plain step. n + k never
    exceeds max_tokens. rows_probs[b] holds row b's calibrated draft
    probabilities in tree order.
    """
    n = len(rows_probs)
    counts = [0] * n
    best, best_rate = list(counts), n / cost(n, 1, 0)
    heap = [(-p[0], b) for b, p in enumerate(rows_probs) if p]
    heapq.heapify(heap)
    gain, k, widest, drafting = float(n), 0, 0, 0
    while heap and n + k < max_tokens:
        neg, b = heapq.heappop(heap)
        drafting += counts[b] == 0
        counts[b] += 1
        k += 1
        gain -= neg
        widest = max(widest, counts[b])
        if counts[b] < len(rows_probs[b]):
            heapq.heappush(heap, (-rows_probs[b][counts[b]], b))
        rate = gain / cost(n + k, 1 + widest, drafting)
        if rate > best_rate:
            best, best_rate = list(counts), rate
    return best
