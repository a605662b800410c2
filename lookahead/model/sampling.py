"""Logits processing with `generate`'s semantics, one tree row at a time.

Order and formulas follow transformers' processors: repetition penalty
(divide positive / multiply negative logits of every token in the context),
then temperature, top-k, top-p (keep the smallest set whose mass reaches
top_p, always at least one token). The context of a tree row is the request's
tokens plus the accepted drafts above that row, so the penalty sees exactly
what it would see in step-by-step decoding.
"""

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature, self.temperature > 0 and self.temperature == self.temperature),
            ("top_k", self.top_k, self.top_k >= 0),
            ("top_p", self.top_p, 0 < self.top_p <= 1),
            ("repetition_penalty", self.repetition_penalty, self.repetition_penalty > 0),
        ]
        for name, value, ok in checks:
            if not ok:
                raise ValueError(f"invalid sampling setting {name}={value!r}")

    @property
    def needs_processing(self) -> bool:
        return self.do_sample or self.repetition_penalty != 1.0


def apply_repetition_penalty(scores: torch.Tensor, context: torch.Tensor, penalty: float) -> torch.Tensor:
    picked = scores.gather(-1, context)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return scores.scatter(-1, context, picked)


def warp(scores: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p on [..., vocab] rows, each row on its own; filtered entries become -inf."""
    scores = scores / p.temperature
    if 0 < p.top_k < scores.shape[-1]:
        kth = torch.topk(scores, p.top_k).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum <= 1 - p.top_p
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


def draw(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One independent draw from every row of [rows, vocab], made where the logits are; [rows], not read back.

    The exponential race: with E_i ~ Exp(1) independent, argmax_i probs_i / E_i is token i with probability
    probs_i (E_i / probs_i ~ Exp(probs_i), and the smallest of independent exponentials is i with probability
    rate_i / sum of rates), so one argmax on the device replaces a sort and a host-side multinomial. Exact for
    a tree: the acceptance walk consumes the draws of the rows it visits, each drawn from that row's own
    distribution, whichever others were drawn beside it (no repetition penalty: that depends on each row's
    path, see RowChooser). Uses the device's global generator: reproducible under torch.manual_seed.
    """
    probs = warp(logits.float(), p).softmax(-1)
    race = torch.empty_like(probs).exponential_().clamp_min_(torch.finfo(probs.dtype).tiny)
    return (probs / race).argmax(-1)


@dataclass
class RowChooser:
    """The model's token for one tree row: argmax or a seeded sample of the processed logits."""

    params: SamplingParams
    context: list[int]  # request tokens before the tree root, root included
    generator: torch.Generator | None = field(default=None)

    def __call__(self, logits_row: torch.Tensor, path: list[int]) -> int:
        scores = logits_row
        if self.params.repetition_penalty != 1.0:
            ctx = torch.tensor(self.context + path, device=scores.device)
            scores = apply_repetition_penalty(scores, ctx, self.params.repetition_penalty)
        if not self.params.do_sample:
            return int(scores.argmax())
        probs = warp(scores, self.params).softmax(-1)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))
