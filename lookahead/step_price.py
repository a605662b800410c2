"""What a batched decode step costs: the start-up curve's price, corrected by what steps measured while serving.

Vocabulary. A forward's *shape* is (rows, width, split): the running rows,
the widest row's tree (1 for a plain step) and whether attention went row by
row (`attention.split_attention`). Its *model price* (`model_ms`) comes from
the cost curve measured at start-up on one row. Its *correction* is the
running ratio of measured to model time for that shape: a 13-row plain step
on SmolLM2 at ~700 tokens of context takes ~1.7x its one-row price, because
every row reads its own keys and values. The *host* time of a step is all
but its forward (proposing, accepting, learning, moving accepted KV).

The budget only ever compares a step with drafts against a plain step of the
same rows (`relative_cost`), so what matters is that both are priced with
comparable corrections. A shape not yet measured often enough borrows the
correction of the nearest measured one (same rows first, then the same
attention layout, then the closest width; else the closest row count):
pricing a fresh drafting shape at the bare model while the plain step
beside it is corrected by 1.7x made drafts look cheaper than no drafts.

Pure Python; no torch.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from .attention import SPLIT_ROW_SHARE, split_attention
from .payoff import size_class

Shape = tuple[int, int, bool]  # (rows, width, split attention)


def model_ms(curve: Callable[[int], float], rows: int, tokens: int, width: int, ragged: bool, drafting: int) -> float:
    """The start-up curve's price of a batch forward (`drafting`: rows sending more than their root).

    The curve was measured on one row. In a padded forward everything runs on
    rows x width tokens. In a ragged one the linear layers run on `tokens`
    only. Its attention goes row by row when few rows draft
    (`attention.split_attention`): then every query attends only its own row,
    as on the curve, and the price is curve(tokens) plus each drafting row's
    own attention calls (`SPLIT_ROW_SHARE` of a one-token forward each).
    Otherwise attention spans rows x width, and the mean of the two prices
    lands within ~15% (on the dear side) of the real time (8 rows at 700
    tokens of context).
    """
    if not ragged:
        return curve(rows * width)
    if split_attention(rows, drafting):
        return curve(tokens) + drafting * SPLIT_ROW_SHARE * curve(1)
    return (curve(tokens) + curve(rows * width)) / 2


@dataclass
class StepPrices:
    trust_after: int = 3  # forwards of one shape before its own correction is used
    # rows -> {(width, split): (EMA of measured ms / model ms, samples)}
    _forward: dict[int, dict[tuple[int, bool], tuple[float, int]]] = field(default_factory=dict)
    # (size class of the batch, drafted?) -> EMA of a decode step's host-side ms
    _host: dict[tuple[int, bool], float] = field(default_factory=dict)

    def observe_forward(self, shape: Shape, ms: float, predicted: float) -> None:
        """Record how far a forward's time was from its model price."""
        rows, width, split = shape
        by_rows = self._forward.setdefault(rows, {})
        ratio = ms / predicted
        ema, k = by_rows.get((width, split), (ratio, 0))
        by_rows[(width, split)] = (ema + (ratio - ema) * max(0.2, 1 / (k + 1)), k + 1)

    def observe_host(self, rows: int, drafted: bool, ms: float) -> None:
        """Record a decode step's host-side time (all but its forward)."""
        kind = (size_class(rows), drafted)
        seen = self._host.get(kind)
        self._host[kind] = ms if seen is None else seen + (ms - seen) * 0.1

    def drafting_host_ms(self, rows: int) -> float:
        """What a drafting step's host-side work has cost beyond a plain step's at this batch size: ~1-3 ms on
        the 2-core CPU, in no forward's price."""
        c = size_class(rows)
        drafting, plain = self._host.get((c, True)), self._host.get((c, False))
        return max(0.0, drafting - plain) if drafting is not None and plain is not None else 0.0

    def correction(self, shape: Shape) -> float:
        """Measured over model time for this shape, or for the nearest shape measured `trust_after` times; 1.0
        before any is."""
        rows, width, split = shape
        for dr in range(max(self._forward, default=rows) + rows + 1):
            best = None
            for r in (rows - dr, rows + dr) if dr else (rows,):
                for (w, s), (ema, k) in self._forward.get(r, {}).items():
                    if k >= self.trust_after:
                        key = (s != split, abs(w - width), r)
                        if best is None or key < best[0]:
                            best = (key, ema)
            if best is not None:
                return best[1]
        return 1.0

    def relative_cost(self, rows: int, curve: Callable[[int], float], ragged: bool) -> Callable[[int, int, int], float]:
        """cost(tokens, width, drafting) of a forward of all rows, relative to a plain step of the same rows.

        The model price times the shape's correction, plus the host-side work
        a drafting step measurably adds. Only ratios matter to the budget, and
        ratios survive the machine's speed drifting.
        """
        plain = model_ms(curve, rows, rows, 1, ragged, 0) * self.correction((rows, 1, False))
        host = self.drafting_host_ms(rows)
        corrections: dict[Shape, float] = {}  # one budget asks about few shapes, many times

        def cost(tokens: int, width: int, drafting: int) -> float:
            if tokens <= rows:
                return 1.0
            shape = (rows, width, ragged and split_attention(rows, drafting))
            if shape not in corrections:
                corrections[shape] = self.correction(shape)
            return (model_ms(curve, rows, tokens, width, ragged, drafting) * corrections[shape] + host) / plain

        return cost
