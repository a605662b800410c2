"""Static step shapes: which padded shape a decode step runs at, so a few captured graphs serve every step.

A CUDA graph replays a fixed sequence of kernels over fixed buffers, so a
step can only replay a graph captured at its exact shape. A decode step's
natural shape moves every step: the running rows, the tree width the
planner chose, the longest context (what attention reads). Rounding each
axis up to a power of two (with a floor) turns that into a few shapes:

    rows   1, 2, 4, ..., 64        the running rows; padding rows compute and are dropped
    width  1, 2, 4, ..., 64        tokens a row sends (root + drafts); padding tokens likewise
    kv     256, 512, ..., 32768    positions attention reads per row; padding is masked out

Padding costs at most 2x along each axis. On a GPU a decode step's
linears read every weight once whatever their row count (up to the
compute/bandwidth crossover, ~300 rows of bf16 on an H100), so padding rows
and tokens there is nearly free; the kv axis is a gather and an attention
over up to twice the positions, a small part of a step at these contexts.
`StepShape.tokens` (rows x width) is what the linears see.

Shapes are what the planner's step table measures too: the cost of a step
is the cost of its bucket, and the table's grid points time exactly that.

Pure Python; no torch.
"""

from dataclasses import dataclass

KV_FLOOR = 256  # the smallest kv bucket: short contexts all share one shape


@dataclass(frozen=True)
class StepShape:
    """One padded decode-step shape (a capture's key)."""

    rows: int  # running rows, padded
    width: int  # tokens a row sends, padded
    kv: int  # positions attention reads per row, padded

    @property
    def tokens(self) -> int:
        return self.rows * self.width


def round_up(n: int, floor: int = 1) -> int:
    """The least power of two >= max(n, floor)."""
    assert n >= 1 and floor >= 1
    return 1 << (max(n, floor) - 1).bit_length()


def step_shape(rows: int, width: int, kv_len: int, kv_floor: int = KV_FLOOR) -> StepShape:
    """The bucket a step of `rows` rows x `width` tokens reading `kv_len` positions per row runs at."""
    assert rows >= 1 and width >= 1 and kv_len >= width, (rows, width, kv_len)
    return StepShape(round_up(rows), round_up(width), round_up(kv_len, kv_floor))
