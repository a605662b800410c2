"""Where two outputs part, and the reference's top-2 gap there."""

from benchmarks.agreement import Divergence, divergence, first_difference


def test_the_first_difference_is_the_first_unequal_token_or_the_shorter_end():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([7], [8]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early: they part where it ends


def test_a_divergence_asks_the_reference_about_the_context_before_it():
    asked = []

    def top2(context):
        asked.append(context)
        return 9.5, 9.25

    assert divergence([4, 5, 6], [4, 5, 6], [1, 2], top2) is None and not asked  # equal: nothing to ask
    assert divergence([4, 5, 7, 1], [4, 5, 6, 1], [1, 2], top2) == Divergence(2, 0.25)
    assert asked == [[1, 2, 4, 5]]  # the prompt and the reference's tokens before the split
