"""settle(): what is alive is frozen, later full passes do not walk it, and frozen objects are still freed."""

import gc
import weakref

from lookahead.core import heap


class Node:  # a container the collector tracks, like a trie node
    def __init__(self, children=None):
        self.children = children or {}


def test_settled_objects_are_left_out_of_later_passes_and_still_freed_by_reference_count():
    kept = [Node({i: Node()}) for i in range(50_000)]  # a loaded model's worth of long-lived containers
    try:
        frozen, _ = heap.settle()
        assert frozen >= 100_000  # every node and its dict, at least
        walked = {id(o) for o in gc.get_objects(2)}  # what a full pass walks
        assert not any(id(o) in walked for o in kept[:3]) and gc.is_tracked(kept[0])
        probe = Node()
        ref = weakref.ref(probe)
        kept.append(probe)
        heap.settle()
        kept.pop()
        del probe
        assert ref() is None  # frozen, yet freed when its last reference went
    finally:
        gc.unfreeze()  # the test process loads many models: leave nothing frozen behind
