"""Mixed batches on the real SmolLM2 weights: every request equals `generate` of that request alone."""

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.engine.engine import Engine
from lookahead.model.reference import hf_generate
from lookahead.model.runner import ModelRunner
from lookahead.engine.scheduler import SchedulerConfig

from tests.lookahead.engine.test_lossless_smollm2 import real_prompts

pytestmark = pytest.mark.slow


def test_mixed_batch_is_lossless_on_real_weights(smollm2):
    tok, eos = smollm2.tokenizer, frozenset(smollm2.eos_token_ids)
    prompts = real_prompts(tok, per_set=2)  # 8 prompts, 50 to ~700 tokens
    plans = [  # (max_new_tokens, lookahead on?)
        (40, True), (24, True), (40, False), (32, True), (16, True), (40, False), (28, True), (40, True),
    ]
    dec = LookaheadDecoder(ModelRunner(smollm2.model), LookaheadConfig(decoding_length=32), tok, eos_token_ids=eos)
    engine = Engine(dec, SchedulerConfig(max_batch_size=4, max_tokens_per_step=96, prefill_chunk=256))
    handles = []
    for (pid, ids), (n, on) in zip(prompts, plans):
        la = None if on else LookaheadConfig(enabled=False)
        handles.append((pid, ids, n, engine.add_request(ids, stop=StopCriteria(n, eos), lookahead=la)))
    # A stop-string request joins mid-run: it must end at the string, on generate's tokens.
    pid, ids = prompts[0]
    ref0 = hf_generate(smollm2.model, ids, 40, list(eos)).tokens
    word = tok.decode(ref0).split()[4]
    for _ in range(10):
        engine.step()
    late = engine.add_request(ids, stop=StopCriteria(40, eos, stop_strings=(word,)))
    max_rows = 0
    while not all(h._finished.is_set() for *_, h in handles) or not late._finished.is_set():
        engine.step()
        max_rows = max(max_rows, len(engine.scheduler.running))
    assert max_rows == 4
    accepted = 0
    for pid, ids, n, h in handles:
        g = h.result()
        assert g.tokens == hf_generate(smollm2.model, ids, n, list(eos)).tokens, pid
        accepted += g.stats.accepted_drafts
    assert accepted > 0
    g = late.result()
    assert g.finish_reason == "stop" and g.tokens == ref0[: len(g.tokens)] and word in tok.decode(g.tokens)


def test_smollm2_in_bf16_starts_and_serves_through_the_engine(smollm2):
    """bf16, the GPU dtype, passes the start-up mask checks (a tolerance that fits the dtype) and serves a
    batch, token for token what the same engine's plain decoding gives (the runner's exact forwards; equality
    with HF `generate`, whose stock kernels round differently, cannot be forced and is not asserted)."""
    import torch

    from lookahead.model.models import load_model

    lm = load_model("smollm2-135m-instruct", dtype="bfloat16", device="cpu")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    runner = ModelRunner(lm.model)
    runner.check_tree_masks()  # raises UnsupportedModelError on a leak; fp32 tolerances refused bf16 on a GPU
    assert runner.ragged  # the ragged-vs-padded check passes in bf16 too
    eos = frozenset(lm.eos_token_ids)
    # a fixed budget: every row verifies its trees whatever the step table says drafts cost on this machine
    dec = LookaheadDecoder(runner, LookaheadConfig(decoding_length=16, adaptive=False), lm.tokenizer, eos_token_ids=eos)
    engine = Engine(dec, SchedulerConfig(max_batch_size=2, max_tokens_per_step=32))
    prompts = real_prompts(lm.tokenizer, per_set=1)[:2]
    for _, ids in prompts:  # what the engine learns from the first pass it drafts from in the second
        dec.memory.add_sequence(hf_generate(lm.model, ids, 48, list(eos)).tokens)
    assert runner.exact

    def serve(la=None):
        handles = [engine.add_request(ids, stop=StopCriteria(48, eos), lookahead=la) for _, ids in prompts]
        while not all(h.done for h in handles):
            engine.step()
        return [h.result() for h in handles]

    results = serve()
    assert all(r.finish_reason in ("length", "eos") and r.tokens for r in results)
    assert sum(r.stats.accepted_drafts for r in results) > 0  # drafts were verified and accepted in bf16
    assert [r.tokens for r in results] == [r.tokens for r in serve(LookaheadConfig(enabled=False))]
