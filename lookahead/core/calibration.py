"""How far the trie's estimates can be trusted: measured acceptance over predicted, per match length.

The trie's probabilities are frequencies, and how far they can be trusted
depends on how long a context suffix matched: replaying SmolLM2's greedy
outputs (shared/tools), rows the trie rated 0.5 were accepted ~10% of the time
after a 1-token match and ~65% after a 4-token match. `CalibrationTable`
therefore keeps, per match length, the running ratio of accepted to predicted
tokens, and the planner weighs the trie's estimates scaled by it.

Pure Python; no torch.
"""

from dataclasses import dataclass, field


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
