"""The batch cache over one KV pool: rows anywhere in the pool read as if alone, joining and leaving move no KV,
a row never writes outside its range, and what attention reads past a row's entries is always finite."""

import pytest
import torch

from lookahead.model import batch_cache
from lookahead.core.draft import DraftTree
from lookahead.model.runner import ModelRunner

from tests.lookahead.tiny_models import tiny

PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [2, 7], [6, 6, 6, 6], [8, 1, 8]]
TREES = [DraftTree([5, 6, 7], [-1, 0, 0], [0, 1, 1], [1.0] * 3), DraftTree([9], [-1], [0], [1.0]),
         DraftTree([4, 4], [-1, 0], [0, 1], [1.0] * 2), DraftTree([2], [-1], [0], [1.0])]


def alone(runner, prompt, tree):
    single = runner.new_cache(len(prompt) + 8)
    runner.prefill(single, prompt)
    return runner.verify(single, tree)


def filled(runner, rows, row_tokens=32, garbage=float("nan")):
    """A pool whose every slot holds `garbage` until written."""
    cache = runner.new_batch_cache(rows, row_tokens)
    for layer in cache.layers:
        layer.keys.fill_(garbage)
        layer.values.fill_(garbage)
    return cache


def admit(runner, cache, prompt):
    single = runner.new_cache(len(prompt) + 8)
    runner.prefill(single, prompt)
    return cache.admit(single, 16)


@pytest.mark.parametrize("read", ["in-place", "gathered"])
def test_rows_scattered_over_the_pool_read_as_if_alone_over_nan_garbage(read, monkeypatch):
    """In place: attention reads the pool at each row's offset (paged_attention). Gathered: the rows are copied into
    a [rows, heads, kv_len, dim] staging buffer first (no kernel: CUDA, or no compiler)."""
    if read == "gathered":
        monkeypatch.setattr(batch_cache, "kernel", lambda: None)
    runner = ModelRunner(tiny("qwen2"))
    runner.check_tree_masks()
    for ragged in (False, True):
        cache = filled(runner, 6)
        spacer = admit(runner, cache, [1, 1])  # rows start at different offsets, with a hole where it was
        rows = [admit(runner, cache, p) for p in PROMPTS]
        cache.release(spacer)  # the last row moves into its place: bookkeeping only
        order = [cache.lengths.index(len(p)) for p in PROMPTS]  # each prompt's row now
        assert sorted(order) == list(range(len(PROMPTS))) and len(rows) == 4
        trees = [None] * len(PROMPTS)
        for p_i, row in enumerate(order):
            trees[row] = TREES[p_i]
        logits = runner.verify_batch(cache, trees, 3, ragged=ragged)
        assert (cache.plan.read is not None) == (read == "in-place") == (cache.plan.src is None)
        for p_i, row in enumerate(order):
            n = len(TREES[p_i].tokens)
            assert torch.isfinite(logits[row][:n]).all()
            torch.testing.assert_close(logits[row][:n], alone(runner, PROMPTS[p_i], TREES[p_i]), atol=1e-4, rtol=1e-4)


def test_joining_and_leaving_move_no_kv_and_free_the_range():
    runner = ModelRunner(tiny("llama"))
    cache = runner.new_batch_cache(3, 32)
    rows = [admit(runner, cache, p) for p in PROMPTS[:3]]
    before = [l.keys.clone() for l in cache.layers]
    offsets = list(cache.offsets)
    assert cache.release(rows[0]) == 2  # the last row's bookkeeping moves into row 0
    assert cache.offsets == [offsets[2], offsets[1]] and cache.lengths == [len(PROMPTS[2]), len(PROMPTS[1])]
    for layer, old in zip(cache.layers, before):
        assert torch.equal(layer.keys.nan_to_num(), old.nan_to_num())  # not one entry moved
    assert cache.ledger.can_reserve(32)  # row 0's range is free again
    admit(runner, cache, PROMPTS[3])
    assert cache.offsets[-1] == offsets[0]  # first fit: the freed range


def test_a_forward_writes_only_inside_each_rows_range():
    runner = ModelRunner(tiny("llama"))
    cache = filled(runner, 3, garbage=7.0)
    for p in PROMPTS[:3]:
        admit(runner, cache, p)
    written = torch.zeros(cache.pool_tokens, dtype=torch.bool)
    for off, p in zip(cache.offsets, PROMPTS[:3]):
        written[off : off + len(p)] = True  # the prompts
    runner.verify_batch(cache, TREES[:3], 3, ragged=False)  # padded: every row writes 3 slots
    for off, l in zip(cache.offsets, cache.lengths):
        written[off + l : off + l + 3] = True
    for layer in cache.layers:
        untouched = (layer.keys == 7.0).all(-1).all(-1)  # [pool_tokens]
        assert torch.equal(untouched, ~written)


def test_a_dropped_pool_is_reused_by_the_next_cache_of_its_layout():
    """Engines built one after another in a process write into memory already touched (no first-touch faults)."""
    runner = ModelRunner(tiny("llama"))
    first = runner.new_batch_cache(4, 32)
    memory = first.layers[0].keys.data_ptr()
    admit(runner, first, PROMPTS[0])
    del first  # no cycle holds it: it goes at once, its pool to the spare
    second = runner.new_batch_cache(2, 32)  # smaller: a view of the spare
    assert second.layers[0].keys.data_ptr() == memory and second.layers[0].keys.shape[0] == second.pool_tokens
    third = runner.new_batch_cache(8, 32)  # the spare is taken, and too small anyway: memory of its own
    assert third.layers[0].keys.data_ptr() != memory
    admit(runner, second, PROMPTS[1])
    torch.testing.assert_close(runner.verify_batch(second, TREES[1:2], 1)[0][:1], alone(runner, PROMPTS[1], TREES[1]),
                               atol=1e-4, rtol=1e-4)


def test_the_read_staging_doubles_but_never_past_what_the_budget_measured():
    """Staging grows by doubling (a context grows a token a step), but no further than `staging_entries`, the
    most one gathered read can need: what the KV budget's activation probe measured, and no more."""
    runner = ModelRunner(tiny("llama"))
    layout = runner.pool_layout()
    cache = batch_cache.BatchKVCache(layout, batch_cache.KVLedger.for_rows(runner.kv_shape, 2, 16),
                                     staging_entries=100)
    like = torch.empty(1, layout.kv_heads, layout.head_dim)
    sizes = [cache.staging(like, n)[0].shape[0] for n in (10, 11, 30, 70, 99)]
    assert sizes == [10, 11, 30, 70, 99]  # each read gets what it asked for...
    assert cache._staging[like.device][0].shape[0] == 100  # ...from a buffer that stopped at the bound (not 160)
    free = batch_cache.BatchKVCache(layout, batch_cache.KVLedger.for_rows(runner.kv_shape, 2, 16))
    for n in (10, 11, 30, 70, 99):
        free.staging(like, n)
    assert free._staging[like.device][0].shape[0] == 160  # unbounded: 10, 20, 40, 80, 160
