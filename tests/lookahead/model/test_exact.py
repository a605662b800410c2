"""Exact forwards for half-precision models: a token's logits are the same bits alone, in a tree, or in a batch."""

import pytest
import torch

from lookahead.model import attention
from lookahead.config import LookaheadConfig
from lookahead.core.draft import DraftTree
from lookahead.engine.engine import Engine
from lookahead.model.fast_linear import FixedRowsLinear, Float64Linear, NativeLinear, _exact_linear
from lookahead.engine.generate import LookaheadDecoder
from lookahead.model.runner import ModelRunner
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.engine.sequence import StopCriteria

from tests.lookahead.tiny_models import tiny


def _linear(in_f: int, out_f: int, path: str) -> torch.nn.Linear:
    torch.manual_seed(0)
    mod = torch.nn.Linear(in_f, out_f, bias=True).to(torch.bfloat16)
    paths = {"native": NativeLinear, "float64": Float64Linear, "fixed rows": lambda m: FixedRowsLinear(rows=16)}
    mod._lookahead_exact = paths[path](mod)  # float64: where the native kernel cannot be built; fixed rows: GPUs
    return mod


@pytest.mark.parametrize("path", ["native", "float64", "fixed rows"])
@pytest.mark.parametrize("in_f,out_f", [(1536, 576), (576, 1536), (96, 40)])
def test_an_exact_linear_gives_each_row_the_bits_it_gets_alone(in_f, out_f, path):
    mod = _linear(in_f, out_f, path)
    x = torch.randn(40, in_f).to(torch.bfloat16)
    alone = torch.cat([_exact_linear(x[i : i + 1], mod) for i in range(40)])
    for m in (2, 3, 9, 17, 40):
        assert torch.equal(_exact_linear(x[:m], mod), alone[:m]), m
    assert torch.equal(_exact_linear(x[None, 5:12], mod)[0], alone[5:12])  # any leading shape, any position
    # and it is the layer's own product, to bf16 rounding
    torch.testing.assert_close(alone.float(), torch.nn.functional.linear(x, mod.weight, mod.bias).float(),
                               atol=0.05, rtol=0.02)


def test_exact_attention_gives_a_query_what_it_gets_alone_over_its_own_keys():
    torch.manual_seed(0)
    heads, kv_heads, d, context, q = 6, 2, 16, 300, 7
    query = torch.randn(1, heads, q, d).to(torch.bfloat16)
    key = torch.randn(1, kv_heads, context + q + 9, d).to(torch.bfloat16)  # 9 padded keys past the tree
    value = torch.randn_like(key)
    mask = torch.zeros(1, 1, q, context + q + 9, dtype=torch.bool)
    mask[..., :context] = True
    for i in range(q):  # a chain: query i sees the context and tree rows 0..i
        mask[0, 0, i, context : context + i + 1] = True
    tree, _ = attention.exact_sdpa(None, query, key, value, mask)
    for i in range(q):
        n = context + i + 1
        alone, _ = attention.exact_sdpa(None, query[:, :, i : i + 1], key[:, :, :n], value[:, :, :n],
                                        torch.ones(1, 1, 1, n, dtype=torch.bool))
        assert torch.equal(alone[0, 0], tree[0, i]), i
    causal, _ = attention.exact_sdpa(None, query, key[:, :, : context + q], value[:, :, : context + q], None)
    explicit, _ = attention.exact_sdpa(None, query, key[:, :, : context + q], value[:, :, : context + q],
                                       mask[..., : context + q])
    assert torch.equal(causal, explicit)  # no mask: causal over the last q keys


def test_exact_attention_over_many_rows_in_turns_gives_each_row_its_bits(monkeypatch):
    """Rows are taken a few at a time past EXACT_CALL_BYTES (the float64 working set the KV budget leaves
    room for); each row's result is the one it gets in a single call, with a mask per row or one for all."""
    torch.manual_seed(1)
    b, heads, kv_heads, d, kv_len, q = 7, 4, 2, 16, 40, 3
    query = torch.randn(b, heads, q, d).to(torch.bfloat16)
    key, value = (torch.randn(b, kv_heads, kv_len, d).to(torch.bfloat16) for _ in range(2))
    per_row = torch.rand(b, 1, q, kv_len) > 0.3
    per_row[..., 0] = True
    shared = per_row[:1]
    whole = [attention.exact_sdpa(None, query, key, value, m)[0] for m in (per_row, shared, None)]
    row = 8 * (2 * kv_heads * kv_len * d + 3 * heads * q * kv_len + heads * q * d)
    monkeypatch.setattr(attention, "EXACT_CALL_BYTES", 3 * row)  # three rows a call: 3 + 3 + 1
    calls = []
    real = attention._exact_rows
    monkeypatch.setattr(attention, "_exact_rows", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for m, ref in zip((per_row, shared, None), whole):
        calls.clear()
        assert torch.equal(attention.exact_sdpa(None, query, key, value, m)[0], ref)
        assert calls == [3, 3, 1]


def test_half_precision_runners_are_exact_and_fp32_ones_are_not():
    bf16 = tiny("llama").to(torch.bfloat16)
    assert ModelRunner(bf16).exact
    linears = [m for m in bf16.modules() if type(m) is torch.nn.Linear]
    assert linears and all(isinstance(m._lookahead_exact, NativeLinear) for m in linears)  # no weight copies
    assert not ModelRunner(tiny("llama")).exact
    model = tiny("qwen2").to(torch.bfloat16)
    ModelRunner(model)
    with pytest.raises(ValueError, match="one runner per model"):
        ModelRunner(model, exact=False)


def _plain_steps(runner, prompt, tokens):
    """Logits of `prompt[-1]` then each of `tokens`, one-token forwards committed one by one."""
    cache = runner.new_cache(len(prompt) + len(tokens) + 2)
    runner.prefill(cache, prompt[:-1])
    out = []
    for t in [prompt[-1], *tokens]:
        out.append(runner.verify(cache, DraftTree([t], [-1], [0], [1.0]))[0])
        cache.length += 1
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3", "glm"])
def test_tree_and_batch_rows_are_bitwise_the_plain_steps(family):
    runner = ModelRunner(tiny(family).to(torch.bfloat16))
    runner.check_tree_masks()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1], [6, 6, 6, 6, 5]]
    drafts = [[5, 3, 5, 8], [], [9, 7]]
    trees = [DraftTree([p[-1], *d], list(range(-1, len(d))), list(range(len(d) + 1)), [1.0] * (len(d) + 1))
             for p, d in zip(prompts, drafts)]
    cache = runner.new_batch_cache(len(prompts), max(len(p) for p in prompts) + 8)
    for p in prompts:
        single = runner.new_cache(len(p) + 8)
        runner.prefill(single, p[:-1])
        cache.admit(single, 8)
    width = max(len(t.tokens) for t in trees)
    for ragged in (True, False):
        batch_cache = cache if ragged else runner.new_batch_cache(len(prompts), max(len(p) for p in prompts) + 8)
        if not ragged:
            for p in prompts:
                single = runner.new_cache(len(p) + 8)
                runner.prefill(single, p[:-1])
                batch_cache.admit(single, 8)
        logits = runner.verify_batch(batch_cache, trees, width, ragged=ragged)
        for b, (p, d) in enumerate(zip(prompts, drafts)):
            plain = _plain_steps(runner, p, d)
            for i, ref in enumerate(plain):
                assert torch.equal(logits[b][i], ref), (family, ragged, b, i)


EXACT_PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6] * 3, [7, 7, 8, 9] * 5, [2, 4, 6, 8, 10, 12] * 3, [5, 4, 3] * 6]


def lookahead_and_plain(runner: ModelRunner, new_tokens: int, table=None):
    """The same engine's outputs for EXACT_PROMPTS, four at once: (lookahead with fixed budgets, so every tree is
    verified; plain decoding)."""
    stop = StopCriteria(new_tokens, frozenset())

    def run(la: LookaheadConfig):
        dec = LookaheadDecoder(runner, LookaheadConfig(decoding_length=16, adaptive=False), table)
        engine = Engine(dec, SchedulerConfig(max_batch_size=4, max_tokens_per_step=64))
        handles = [engine.add_request(p, stop=stop, lookahead=la) for p in EXACT_PROMPTS]
        while not all(h.done for h in handles):
            engine.step()
        return [h.result() for h in handles]

    plain = run(LookaheadConfig(enabled=False))
    return run(LookaheadConfig(decoding_length=16, adaptive=False)), plain


def test_bf16_lookahead_decodes_exactly_what_plain_decoding_does():
    """Through the engine, four requests at once, fixed budgets (every tree verified): in bf16 the tokens equal
    the same engine's plain decoding, request by request, and drafts were accepted on the way."""
    model = tiny("llama").to(torch.bfloat16)
    runner = ModelRunner(model)
    runner.check_tree_masks()
    drafted, plain = lookahead_and_plain(runner, 40)
    assert [g.tokens for g in drafted] == [g.tokens for g in plain]
    assert sum(g.stats.accepted_drafts for g in drafted) > 0


def test_each_device_gets_its_exact_linear():
    from lookahead.model.fast_linear import exact_path

    cpu = torch.nn.Linear(32, 8).to(torch.bfloat16)
    assert isinstance(exact_path(cpu), NativeLinear)  # the compiler is there in CI; test_native covers its absence
    gpu_like = torch.nn.Linear(32, 8, device="meta", dtype=torch.bfloat16)  # any non-CPU device: cuBLAS, one shape
    path = exact_path(gpu_like)
    assert isinstance(path, FixedRowsLinear) and path.rows == 128
