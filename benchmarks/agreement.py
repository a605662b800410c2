"""Where two greedy outputs part, and how close the reference's choice was there.

Exactness is a promise about bits; when two decodings of one prompt differ,
what tells numerics from a bug is the reference's margin at the first
differing token: its top-2 logit gap. A gap of a rounding step or two is a
near-tie the kernels broke differently; a large one means the two were not
computing the same thing.

Pure Python; the caller supplies the reference's logits.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Divergence:
    position: int  # index of the first new token where the two outputs differ
    gap: float  # the reference's top-1 minus top-2 logit there


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (the shorter one's end if one is a prefix of the other);
    None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(output: Sequence[int], reference: Sequence[int], prompt: Sequence[int],
               top2: Callable[[list[int]], tuple[float, float]]) -> Divergence | None:
    """None when `output` equals `reference`; else where they part, with `top2(context)`: the reference
    model's two highest logits after `context` (the prompt and the reference's tokens before that point)."""
    at = first_difference(output, reference)
    if at is None:
        return None
    first, second = top2(list(prompt) + list(reference[:at]))
    return Divergence(at, first - second)
