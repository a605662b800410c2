import numpy as np
import torch

from lookahead.draft import DraftTree
from lookahead.tree_mask import ancestor_matrix, causal_inputs, tree_inputs

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
