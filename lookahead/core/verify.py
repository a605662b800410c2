"""The acceptance walk: which drafts the model agrees with.

Starting at the root, ask the model for its next token at the current row (the
argmax for greedy; a sample from the processed distribution when sampling).
If a child of the row carries that token, it is accepted and the walk moves to
it; otherwise the walk stops and the model's token is the bonus token. Every
emitted token is therefore exactly what the model would have produced one step
at a time from the same context: greedy output is identical, and a sampled
token is drawn from the same conditional distribution, so lossless in
distribution too (Lookahead, KDD 2024; cf. SpecInfer's multi-branch rule with
a deterministic proposer).

Pure Python; `choose(row)` hides whether the model's token is an argmax or a
sample.
"""

from collections.abc import Callable
from dataclasses import dataclass

from lookahead.core.draft import DraftTree


@dataclass
class Acceptance:
    rows: list[int]  # accepted draft rows, root excluded, in path order
    tokens: list[int]  # emitted tokens: accepted drafts then the bonus token


def accept(tree: DraftTree, choose: Callable[[int, list[int]], int]) -> Acceptance:
    """`choose(row, path_tokens)` returns the model's token after `row`; path_tokens are the accepted drafts so far."""
    kids = tree.children()
    row, rows, tokens = 0, [], []
    while True:
        tok = choose(row, tokens)
        tokens.append(tok)
        nxt = kids[row].get(tok)
        if nxt is None:
            return Acceptance(rows, tokens)
        rows.append(nxt)
        row = nxt
