"""DraftTree -> the tensors of one verification forward.

Row r of the forward may attend to every committed context entry and to the
rows on its own root path (its ancestors and itself), never to siblings or
cousins. Its position is the committed length plus its depth, so a draft at
depth d is embedded exactly as the d-th token after the root would be.
"""

from dataclasses import dataclass

import numpy as np
import torch

from lookahead.core.draft import DraftTree


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


def pack_trees(trees: list[DraftTree], ids: np.ndarray, depths: np.ndarray, anc: np.ndarray, sizes: np.ndarray
               ) -> None:
    """Row b's tree into ids[b], depths[b], anc[b] and sizes[b] ([rows, width], [rows, width], [rows, width,
    width], [rows]; depths and anc zero past the trees beforehand), padded to the width with copies of its
    root that see only themselves: the host half of a batch's inputs (here and static_step.py)."""
    width = ids.shape[1]
    for b, tree in enumerate(trees):
        q = len(tree.tokens)
        assert q <= width
        ids[b, :q], ids[b, q:] = tree.tokens, tree.tokens[0]
        depths[b, :q] = tree.depths
        anc[b, :q, :q] = ancestor_matrix(tree.parents)
        anc[b, np.arange(q, width), np.arange(q, width)] = True
        sizes[b] = q


def batch_tree_inputs(trees: list[DraftTree], lengths: list[int], width: int, device: torch.device) -> TreeInputs:
    """One forward for many rows: row b's tree sits at [lengths[b], lengths[b] + width) of its KV row.

    Trees narrower than `width` are padded with copies of their root that attend
    only to themselves; their outputs are ignored. Columns past a row's own
    entries (other rows are longer) are masked out.

    Only small per-row index arrays go to the device (tokens, depths, each
    tree's width x width ancestry, lengths); the [rows, 1, width, kv_len]
    mask and the positions are built there, so a step copies kilobytes to a
    GPU, not a mask that grows with the context.
    """
    n = len(trees)
    ids = np.empty((n, width), dtype=np.int64)
    depths = np.zeros((n, width), dtype=np.int64)
    anc = np.zeros((n, width, width), dtype=bool)  # [rows, width, width]: own root path; padding sees itself
    sizes = np.empty(n, dtype=np.int64)  # [rows] tree tokens, root included
    pack_trees(trees, ids, depths, anc, sizes)
    to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    base = torch.tensor(lengths, dtype=torch.long, device=device)  # [rows]
    mask = device_mask(to(anc), to(sizes), base, max(lengths) + width)
    return TreeInputs(to(ids), base[:, None] + to(depths), mask)


def device_mask(anc: torch.Tensor, sizes: torch.Tensor, lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The [rows, 1, width, kv_len] bool mask, made where `anc` [rows, width, width] (each tree's ancestry,
    padding seeing itself), `sizes` [rows] (tree tokens; 0: a padding row) and `lengths` [rows] are: row b's
    tree rows see its first lengths[b] columns and their own root path after them; padding sees only itself.
    Shapes alone decide the ops, so a CUDA graph replays it (static_step.py)."""
    n, width = anc.shape[0], anc.shape[1]
    dev = anc.device
    rel = torch.arange(kv_len, device=dev)[None, :] - lengths[:, None]  # [rows, kv_len]: column less the row's length
    real = torch.arange(width, device=dev)[None, :] < sizes[:, None]  # [rows, width]: a tree row, not padding
    in_tree = anc.gather(2, rel.clamp(0, width - 1)[:, None, :].expand(n, width, kv_len))  # [rows, width, kv_len]
    mask = ((rel < 0)[:, None, :] & real[:, :, None]) | (((rel >= 0) & (rel < width))[:, None, :] & in_tree)
    return mask[:, None]
