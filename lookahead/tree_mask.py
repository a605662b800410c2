"""DraftTree -> the tensors of one verification forward.

Row r of the forward may attend to every committed context entry and to the
rows on its own root path (its ancestors and itself), never to siblings or
cousins. Its position is the committed length plus its depth, so a draft at
depth d is embedded exactly as the d-th token after the root would be.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .draft import DraftTree


@dataclass
class TreeInputs:
    input_ids: torch.Tensor  # [1, q] root + draft tokens
    position_ids: torch.Tensor  # [1, q] committed length + depth
    attention_mask: torch.Tensor | None  # [1, 1, q, committed + q] bool, True = may attend


def ancestor_matrix(parents: list[int]) -> np.ndarray:
    """anc[i, j] is True when row j is row i or one of its ancestors."""
    q = len(parents)
    anc = np.zeros((q, q), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            assert p < i, "a parent row must come before its child"
            anc[i, : p + 1] = anc[p, : p + 1]
        anc[i, i] = True
    return anc


def tree_inputs(tree: DraftTree, committed: int, device: torch.device) -> TreeInputs:
    q = len(tree.tokens)
    mask = torch.ones((1, 1, q, committed + q), dtype=torch.bool)
    if q > 1:
        mask[0, 0, :, committed:] = torch.from_numpy(ancestor_matrix(tree.parents))
    return TreeInputs(
        input_ids=torch.tensor([tree.tokens], device=device),
        position_ids=(torch.tensor([tree.depths]) + committed).to(device),
        attention_mask=mask.to(device),
    )


def causal_inputs(tokens: list[int], committed: int, device: torch.device) -> TreeInputs:
    """A plain causal chunk (prefill): each token attends to the context and the tokens before it."""
    q = len(tokens)
    mask = torch.ones((1, 1, q, committed + q), dtype=torch.bool)
    mask[0, 0, :, committed:] = torch.ones((q, q), dtype=torch.bool).tril()
    return TreeInputs(
        input_ids=torch.tensor([tokens], device=device),
        position_ids=torch.arange(committed, committed + q, device=device)[None],
        attention_mask=mask.to(device),
    )


def batch_tree_inputs(trees: list[DraftTree], lengths: list[int], width: int, device: torch.device) -> TreeInputs:
    """One forward for many rows: row b's tree sits at [lengths[b], lengths[b] + width) of its KV row.

    Trees narrower than `width` are padded with copies of their root that attend
    only to themselves; their outputs are ignored. Columns past a row's own
    entries (other rows are longer) are masked out.
    """
    n = len(trees)
    kv_len = max(lengths) + width
    ids = torch.zeros((n, width), dtype=torch.long)
    pos = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, 1, width, kv_len), dtype=torch.bool)
    for b, (tree, base) in enumerate(zip(trees, lengths)):
        q = len(tree.tokens)
        assert q <= width
        ids[b, :q] = torch.tensor(tree.tokens)
        ids[b, q:] = tree.tokens[0]
        pos[b, :q] = torch.tensor(tree.depths) + base
        pos[b, q:] = base
        mask[b, 0, :q, :base] = True
        mask[b, 0, :q, base : base + q] = torch.from_numpy(ancestor_matrix(tree.parents))
        pad = torch.arange(q, width)
        mask[b, 0, pad, base + pad] = True
    return TreeInputs(ids.to(device), pos.to(device), mask.to(device))
