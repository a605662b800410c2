import numpy as np
import torch

from lookahead.core.draft import DraftTree
from lookahead.model.tree_mask import ancestor_matrix, batch_tree_inputs, causal_inputs, tree_inputs

# root(0) -> a(1) -> b(3);  root -> c(2)
TREE = DraftTree(tokens=[10, 11, 12, 13], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2], probs=[1, 0.5, 0.4, 0.3])


def test_ancestor_matrix_sees_only_the_root_path():
    anc = ancestor_matrix(TREE.parents)
    expected = np.array(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 1, 0],  # c does not see its sibling a
            [1, 1, 0, 1],  # b sees root and a, not c
        ],
        dtype=bool,
    )
    assert (anc == expected).all()


def test_tree_inputs_positions_and_context_columns():
    ti = tree_inputs(TREE, committed=5, device=torch.device("cpu"))
    assert ti.input_ids.tolist() == [[10, 11, 12, 13]]
    assert ti.position_ids.tolist() == [[5, 6, 6, 7]]  # siblings share a position
    assert ti.attention_mask.shape == (1, 1, 4, 9)
    assert ti.attention_mask[0, 0, :, :5].all()  # every row sees the whole committed context


def test_causal_inputs_is_lower_triangular_over_new_tokens():
    ci = causal_inputs([1, 2, 3], committed=2, device=torch.device("cpu"))
    m = ci.attention_mask[0, 0]
    assert m[:, :2].all() and torch.equal(m[:, 2:], torch.ones(3, 3, dtype=torch.bool).tril())
    assert ci.position_ids.tolist() == [[2, 3, 4]]


def _on_root_path(tree: DraftTree, i: int, j: int) -> bool:
    while i >= 0:
        if i == j:
            return True
        i = tree.parents[i]
    return False


def test_batch_tree_inputs_follow_the_definition_row_by_row():
    """Row b, query i may see column c iff c is committed context of row b, or c holds a tree row on i's root
    path; padding queries see only their own slot. Checked entry by entry against that definition."""
    chain = DraftTree([4, 5, 6], [-1, 0, 1], [0, 1, 2], [1.0] * 3)
    root = DraftTree([9], [-1], [0], [1.0])
    trees, lengths, width = [TREE, root, chain], [5, 2, 7], 5
    ti = batch_tree_inputs(trees, lengths, width, torch.device("cpu"))
    kv_len = max(lengths) + width
    assert ti.attention_mask.shape == (3, 1, width, kv_len)
    for b, (tree, base) in enumerate(zip(trees, lengths)):
        q = len(tree.tokens)
        assert ti.input_ids[b].tolist() == tree.tokens + [tree.tokens[0]] * (width - q)
        assert ti.position_ids[b].tolist() == [base + d for d in tree.depths] + [base] * (width - q)
        for i in range(width):
            for c in range(kv_len):
                if i < q:
                    want = c < base or (base <= c < base + q and _on_root_path(tree, i, c - base))
                else:
                    want = c == base + i
                assert bool(ti.attention_mask[b, 0, i, c]) == want, (b, i, c)
