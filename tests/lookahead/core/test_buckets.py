"""Step buckets (buckets.py): every step shape rounds up to the least power of two on each axis, never down."""

import pytest

from lookahead.core.buckets import KV_FLOOR, StepShape, round_up, step_shape


@pytest.mark.parametrize("n,floor,want", [(1, 1, 1), (2, 1, 2), (3, 1, 4), (64, 1, 64), (65, 1, 128),
                                          (1, 256, 256), (256, 256, 256), (257, 256, 512)])
def test_round_up_is_the_least_power_of_two_at_or_above(n, floor, want):
    assert round_up(n, floor) == want


def test_every_step_fits_its_bucket_within_twice_each_axis():
    for rows in range(1, 70):
        for width in (1, 2, 3, 7, 16, 33):
            for kv in (width, 100, 255, 256, 257, 5000):
                if kv < width:
                    continue
                s = step_shape(rows, width, kv)
                assert rows <= s.rows < 2 * rows and width <= s.width < 2 * width
                assert kv <= s.kv < 2 * max(kv, KV_FLOOR) and s.kv >= KV_FLOOR
                assert s.tokens == s.rows * s.width


def test_nearby_steps_share_a_bucket():
    # a decode step's context grows a token at a time: hundreds of steps replay one graph
    assert len({step_shape(3, 5, kv) for kv in range(300, 513)}) == 1
    assert step_shape(5, 9, 700) == StepShape(8, 16, 1024)
