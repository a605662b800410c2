"""Prompt KV reuse: prefix matching, the byte bound, equality with a fresh prefill, and lossless engine output."""

import random

import pytest
import torch

from lookahead import LookaheadConfig, StopCriteria
from lookahead.model.prefix_cache import PrefixCache, common_prefix_length
from lookahead.model.runner import ModelRunner

from tests.lookahead.engine.test_engine import drain, make_engine
from tests.lookahead.engine.test_lossless_architectures import hf_greedy
from tests.lookahead.tiny_models import tiny


def naive_common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_length_matches_a_token_by_token_count():
    rng = random.Random(0)
    for _ in range(300):
        base = [rng.randrange(5) for _ in range(rng.randrange(0, 300))]
        cut = rng.randrange(0, len(base) + 1)
        other = base[:cut] + [rng.randrange(5) for _ in range(rng.randrange(0, 100))]
        assert common_prefix_length(base, other) == naive_common(base, other)


def prefilled(runner, pool, tokens):
    """A request range of `pool` with `tokens` prefilled into it; its first slot."""
    key = object()
    pool.ledger.reserve(key, len(tokens) + 8)
    runner.prefill(pool.row_cache(key), tokens)
    return pool.ledger.offset(key)


def empty_range(pool, tokens=64):
    key = object()
    pool.ledger.reserve(key, tokens)
    return key, pool.ledger.offset(key)


def test_reused_prefix_equals_a_fresh_prefill():
    runner = ModelRunner(tiny("qwen2"))
    pool = runner.new_batch_cache(4, 128)
    doc = list(range(3, 83))  # an 80-token "document"
    first, second = doc + [90, 91], doc + [92, 93, 94]
    pc = PrefixCache(pool, max_bytes=2**24, min_tokens=16)
    pc.store(prefilled(runner, pool, first), first)
    assert len(pc) == 1 and pc.bytes == pool.ledger.blocks_for(len(first)) * pool.ledger.block_bytes

    key, dst = empty_range(pool, len(second) + 8)
    n = pc.load_into(dst, second)
    assert n == len(doc)
    cache = pool.row_cache(key)
    cache.length = n
    runner.prefill(cache, second[n:])
    fresh = runner.new_cache(len(second) + 8)
    runner.prefill(fresh, second)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys[:, :, : len(second)], ref.keys[:, :, : len(second)], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values[:, :, : len(second)], ref.values[:, :, : len(second)],
                                   atol=1e-5, rtol=1e-4)
    assert pc.hits == 1 and pc.reused_tokens == len(doc)


def test_short_matches_and_a_disabled_cache_reuse_nothing():
    runner = ModelRunner(tiny("llama"))
    pool = runner.new_batch_cache(4, 64)
    prompt = list(range(3, 43))
    pc = PrefixCache(pool, max_bytes=2**24, min_tokens=32)
    pc.store(prefilled(runner, pool, prompt), prompt)
    assert pc.load_into(empty_range(pool)[1], prompt[:20] + [1, 2, 3]) == 0  # 20 shared < 32
    off = PrefixCache(pool, max_bytes=0)
    off.store(prefilled(runner, pool, prompt), prompt)
    assert len(off) == 0 and off.load_into(0, prompt) == 0


def test_byte_bound_evicts_least_recently_used_and_extensions_replace():
    runner = ModelRunner(tiny("llama"))
    pool = runner.new_batch_cache(12, 64)
    prompts = [[k] * 40 for k in (3, 4, 5)]
    size = pool.ledger.blocks_for(40) * pool.ledger.block_bytes
    pc = PrefixCache(pool, max_bytes=2 * size, min_tokens=8)  # room for two 40-token prompts
    pc.store(prefilled(runner, pool, prompts[0]), prompts[0])
    pc.store(prefilled(runner, pool, prompts[1]), prompts[1])
    assert pc.load_into(empty_range(pool)[1], prompts[0]) == 40  # touch prompt 0: prompt 1 is now the oldest
    pc.store(prefilled(runner, pool, prompts[2]), prompts[2])
    assert len(pc) == 2 and pc.bytes <= pc.max_bytes
    assert pc.load_into(empty_range(pool)[1], prompts[1]) == 0
    assert pc.load_into(empty_range(pool)[1], prompts[0]) == 40

    longer = prompts[0] + [6] * 8  # extends prompt 0: replaces it rather than keeping both
    pool = runner.new_batch_cache(8, 64)
    big = PrefixCache(pool, max_bytes=2**30, min_tokens=8)
    big.store(prefilled(runner, pool, prompts[0]), prompts[0])
    big.store(prefilled(runner, pool, longer), longer)
    assert len(big) == 1 and big.load_into(empty_range(pool)[1], longer) == 48
    big.store(prefilled(runner, pool, prompts[0]), prompts[0])  # already covered by the longer one
    assert len(big) == 1


def test_entries_live_in_the_budget_and_give_way_to_requests():
    runner = ModelRunner(tiny("llama"))
    pool = runner.new_batch_cache(3, 48)  # three 48-token ranges in all
    led = pool.ledger
    pc = PrefixCache(pool, max_bytes=2**30, min_tokens=8)
    prompts = [[k] * 40 for k in (3, 4)]
    first = prefilled(runner, pool, prompts[0])  # the request's range: one of three
    pc.store(first, prompts[0])
    assert len(pc) == 1 and led.used_bytes >= pc.bytes  # the entry is held in the same ledger as the requests
    second = prefilled(runner, pool, prompts[1])  # the third range: the pool is full
    assert not led.can_reserve(1)
    pc.store(second, prompts[1])  # no room but the older entry's: least recently used, it makes way
    assert len(pc) == 1 and pc.load_into(first, prompts[0]) == 0 and pc.load_into(first, prompts[1]) == 40
    assert pc.evict_one() and len(pc) == 0 and pc.bytes == 0 and led.can_reserve(48)
    assert not pc.evict_one()


@pytest.mark.parametrize("lookahead_on", [True, False])
def test_engine_reuses_shared_prompts_and_stays_lossless(lookahead_on):
    model, engine = make_engine(prefix_cache_mb=64)
    doc = [5, 9, 11, 5, 9, 12] * 8  # 48 tokens of shared context
    prompts = [doc + [20, 21], doc + [22], doc + [20, 21], [7, 7, 7]]
    la = None if lookahead_on else LookaheadConfig(enabled=False)
    results = []
    for p in prompts:  # one after another: each finds what the earlier ones left
        results += drain(engine, [engine.add_request(p, stop=StopCriteria(24), lookahead=la)])
    assert [r.tokens for r in results] == [hf_greedy(model, p, 24) for p in prompts]
    cached = [r.stats.cached_prompt_tokens for r in results]
    assert cached[0] == 0 and cached[1] == len(doc) and cached[2] == len(prompts[2]) - 1 and cached[3] == 0
    assert engine.prefixes.hits == 2


def test_engine_without_a_prefix_cache_prefills_everything():
    model, engine = make_engine(prefix_cache_mb=0)
    doc = list(range(10, 60))
    results = [drain(engine, [engine.add_request(doc + [k], stop=StopCriteria(8))])[0] for k in (3, 4)]
    assert all(r.stats.cached_prompt_tokens == 0 for r in results)
    assert [r.tokens for r in results] == [hf_greedy(model, doc + [k], 8) for k in (3, 4)]
