"""The drafting core: the trie and n-gram index that propose drafts, the draft tree, the acceptance walk,
the step planner and its price table. Pure Python over token lists: it imports no torch
(tests/lookahead/core/test_torch_free.py holds it to that)."""
