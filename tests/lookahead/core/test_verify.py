from lookahead.core.draft import DraftTree
from lookahead.core.verify import accept

# root -> 11(1) -> 13(3) -> 15(4);  root -> 12(2)
TREE = DraftTree(tokens=[10, 11, 12, 13, 15], parents=[-1, 0, 0, 1, 3], depths=[0, 1, 1, 2, 3], probs=[1] * 5)


def model_says(preds):
    return lambda row, path: preds[row]


def test_accepts_longest_agreeing_path_plus_bonus():
    acc = accept(TREE, model_says({0: 11, 1: 13, 3: 15, 4: 99}))
    assert acc.rows == [1, 3, 4] and acc.tokens == [11, 13, 15, 99]


def test_takes_the_sibling_the_model_picks():
    acc = accept(TREE, model_says({0: 12, 2: 7}))
    assert acc.rows == [2] and acc.tokens == [12, 7]


def test_rejecting_everything_still_emits_the_models_token():
    acc = accept(TREE, model_says({0: 42}))
    assert acc.rows == [] and acc.tokens == [42]


def test_path_tokens_are_passed_to_the_chooser():
    seen = []

    def choose(row, path):
        seen.append(list(path))
        return {0: 11, 1: 13, 3: 0}[row]

    accept(TREE, choose)
    assert seen == [[], [11], [11, 13]]
