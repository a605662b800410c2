import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lookahead.core.draft import DraftTree
from lookahead.model.runner import ModelRunner


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def reference_logits(model, tokens):
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0, -1]


def test_commit_contiguous_path_is_a_crop():
    runner = ModelRunner(tiny_llama())
    cache = runner.new_cache(32)
    runner.prefill(cache, [1, 2, 3])
    chain = DraftTree([4, 5, 6], [-1, 0, 1], [0, 1, 2], [1, 1, 1])
    runner.verify(cache, chain)
    cache.commit(3, [0, 1])  # keep root 4 and draft 5, drop 6
    assert cache.length == 5
    out = runner.verify(cache, DraftTree([9], [-1], [0], [1]))[0]
    assert torch.allclose(out, reference_logits(runner.model, [1, 2, 3, 4, 5, 9]), atol=1e-5)


def test_commit_gathers_a_non_contiguous_path():
    runner = ModelRunner(tiny_llama())
    cache = runner.new_cache(32)
    runner.prefill(cache, [1, 2, 3])
    # root 4 -> 7 (row 1), root -> 8 (row 2) -> 5 (row 3): accept rows 2, 3 (skipping row 1)
    tree = DraftTree([4, 7, 8, 5], [-1, 0, 0, 2], [0, 1, 1, 2], [1, 1, 1, 1])
    runner.verify(cache, tree)
    cache.commit(3, [0, 2, 3])
    assert cache.length == 6
    out = runner.verify(cache, DraftTree([9], [-1], [0], [1]))[0]
    assert torch.allclose(out, reference_logits(runner.model, [1, 2, 3, 4, 8, 5, 9]), atol=1e-5)


def test_cache_grows_past_its_capacity():
    runner = ModelRunner(tiny_llama())
    cache = runner.new_cache(2)
    runner.prefill(cache, list(range(1, 10)))
    out = runner.verify(cache, DraftTree([11], [-1], [0], [1]))[0]
    assert cache.capacity >= 10
    assert torch.allclose(out, reference_logits(runner.model, list(range(1, 10)) + [11]), atol=1e-5)
