"""Prompt KV reuse: prefix matching, the byte bound, equality with a fresh prefill, and lossless engine output."""

import random

import pytest
import torch

from lookahead import LookaheadConfig, StopCriteria
from lookahead.prefix_cache import PrefixCache, common_prefix_length
from lookahead.runner import ModelRunner

from .test_engine import drain, make_engine
from .test_lossless_architectures import hf_greedy
from .tiny_models import tiny


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


def prefilled(runner, tokens, capacity=None):
    cache = runner.new_cache(capacity or len(tokens) + 8)
    runner.prefill(cache, tokens)
    return cache


def test_reused_prefix_equals_a_fresh_prefill():
    runner = ModelRunner(tiny("qwen2"))
    doc = list(range(3, 83))  # an 80-token "document"
    first, second = doc + [90, 91], doc + [92, 93, 94]
    pc = PrefixCache(max_bytes=2**24, min_tokens=16)
    pc.store(prefilled(runner, first), first)
    assert len(pc) == 1

    cache = runner.new_cache(len(second) + 8)
    n = pc.load_into(cache, second)
    assert n == len(doc) and cache.length == n
    runner.prefill(cache, second[n:])
    fresh = prefilled(runner, second)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys[:, :, : len(second)], ref.keys[:, :, : len(second)], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values[:, :, : len(second)], ref.values[:, :, : len(second)],
                                   atol=1e-5, rtol=1e-4)
    assert pc.hits == 1 and pc.reused_tokens == len(doc)


def test_short_matches_and_a_disabled_cache_reuse_nothing():
    runner = ModelRunner(tiny("llama"))
    prompt = list(range(3, 43))
    pc = PrefixCache(max_bytes=2**24, min_tokens=32)
    pc.store(prefilled(runner, prompt), prompt)
    assert pc.load_into(runner.new_cache(64), prompt[:20] + [1, 2, 3]) == 0  # 20 shared < 32
    off = PrefixCache(max_bytes=0)
    off.store(prefilled(runner, prompt), prompt)
    assert len(off) == 0 and off.load_into(runner.new_cache(64), prompt) == 0


def test_byte_bound_evicts_least_recently_used_and_extensions_replace():
    runner = ModelRunner(tiny("llama"))
    prompts = [[k] * 40 for k in (3, 4, 5)]
    one = PrefixCache(max_bytes=2**30, min_tokens=8)
    one.store(prefilled(runner, prompts[0]), prompts[0])
    size = one.bytes
    pc = PrefixCache(max_bytes=2 * size, min_tokens=8)  # room for two 40-token prompts
    pc.store(prefilled(runner, prompts[0]), prompts[0])
    pc.store(prefilled(runner, prompts[1]), prompts[1])
    assert pc.load_into(runner.new_cache(64), prompts[0]) == 40  # touch prompt 0: prompt 1 is now the oldest
    pc.store(prefilled(runner, prompts[2]), prompts[2])
    assert len(pc) == 2 and pc.bytes <= pc.max_bytes
    assert pc.load_into(runner.new_cache(64), prompts[1]) == 0
    assert pc.load_into(runner.new_cache(64), prompts[0]) == 40

    longer = prompts[0] + [6] * 8  # extends prompt 0: replaces it rather than keeping both
    big = PrefixCache(max_bytes=2**30, min_tokens=8)
    big.store(prefilled(runner, prompts[0]), prompts[0])
    big.store(prefilled(runner, longer), longer)
    assert len(big) == 1 and big.load_into(runner.new_cache(64), longer) == 48
    big.store(prefilled(runner, prompts[0]), prompts[0])  # already covered by the longer one
    assert len(big) == 1


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
