"""Lossless on the real SmolLM2-135M weights: greedy lookahead == model.generate on real prompts."""

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.model.models import encode
from lookahead.core.step_table import StepTable
from lookahead.model.reference import hf_generate
from lookahead.model.runner import ModelRunner

from tests.conftest import load_prompts

pytestmark = pytest.mark.slow
SETS = ["humaneval", "mtbench", "debian_faq_zh", "narrativeqa"]
NEW_TOKENS = 48


def real_prompts(tokenizer, per_set=3):
    """The shortest `per_set` of the first 20 prompts of each set (keeps CI's prefill time down)."""
    out = []
    for name in SETS:
        encoded = [(r["id"], encode(tokenizer, r["prompt"], chat=True)) for r in load_prompts(name, 20)]
        out += sorted(encoded, key=lambda x: len(x[1]))[:per_set]
    return out


@pytest.fixture(scope="module")
def references(smollm2):
    prompts = real_prompts(smollm2.tokenizer)
    return [(pid, ids, hf_generate(smollm2.model, ids, NEW_TOKENS, smollm2.eos_token_ids).tokens) for pid, ids in prompts]


@pytest.mark.parametrize("mode,adaptive", [("hier", True), ("hier", False), ("par", False), ("one", False)])
def test_greedy_identical_to_generate_on_real_prompts(smollm2, references, mode, adaptive):
    assert len(references) >= 10
    runner = ModelRunner(smollm2.model)
    cfg = LookaheadConfig(decoding_mode=mode, adaptive=adaptive, decoding_length=32 if adaptive else 16)
    # Adaptive: a draft costs a tenth of a plain step, so the planner cuts trees to their likely part; frozen,
    # and with the payoff check off, so what it drafts does not depend on how fast this machine is.
    table = StepTable.from_function((1, 4), (0, 64), lambda _, rows, drafts: 10.0 * rows + drafts)
    table.rate = 0.0
    dec = LookaheadDecoder(runner, cfg, smollm2.tokenizer, table=table if adaptive else StepTable.flat(),
                           eos_token_ids=smollm2.eos_token_ids)
    dec.single_engine().payoff.enabled = False
    stop = StopCriteria(NEW_TOKENS, frozenset(smollm2.eos_token_ids))
    accepted = 0
    for pid, ids, ref in references:
        g = dec.generate(ids, stop=stop)
        assert g.tokens == ref, f"{pid} ({mode}) differs from generate"
        accepted += g.stats.accepted_drafts
    assert accepted > 0


def test_stream_yields_what_generate_returns(smollm2, references):
    dec = LookaheadDecoder(ModelRunner(smollm2.model), LookaheadConfig(), smollm2.tokenizer, table=StepTable.flat(),
                           eos_token_ids=smollm2.eos_token_ids)
    pid, ids, ref = references[0]
    run = dec.stream(ids, stop=StopCriteria(NEW_TOKENS, frozenset(smollm2.eos_token_ids)))
    chunks = list(run)
    assert [t for c in chunks for t in c] == run.tokens == ref
    assert len(chunks) == run.stats.steps and all(chunks)


def test_stop_string_ends_generation_after_it(smollm2, references):
    dec = LookaheadDecoder(ModelRunner(smollm2.model), LookaheadConfig(), smollm2.tokenizer, table=StepTable.flat())
    pid, ids, ref = references[0]
    full = smollm2.tokenizer.decode(ref)
    word = full.split()[3]  # a word the model is known to produce
    g = dec.generate(ids, stop=StopCriteria(NEW_TOKENS, stop_strings=(word,)))
    assert g.finish_reason == "stop"
    assert word in smollm2.tokenizer.decode(g.tokens)
    assert word not in smollm2.tokenizer.decode(g.tokens[:-1])
    assert g.tokens == ref[: len(g.tokens)]


def test_eos_and_length_finish_reasons(smollm2):
    dec = LookaheadDecoder(ModelRunner(smollm2.model), LookaheadConfig(), smollm2.tokenizer, table=StepTable.flat(),
                           eos_token_ids=smollm2.eos_token_ids)
    ids = encode(smollm2.tokenizer, "What is the capital of France? Answer in one short sentence.", chat=True)
    g = dec.generate(ids, stop=StopCriteria(200, frozenset(smollm2.eos_token_ids)))
    assert g.finish_reason == "eos" and g.tokens[-1] in smollm2.eos_token_ids
    assert "Paris" in smollm2.tokenizer.decode(g.tokens)
    short = dec.generate(ids, stop=StopCriteria(3, frozenset(smollm2.eos_token_ids)))
    assert short.finish_reason == "length" and len(short.tokens) == 3


def test_pia_decoding_kwargs_port_over(smollm2, references):
    dec = LookaheadDecoder(ModelRunner(smollm2.model), LookaheadConfig(), smollm2.tokenizer, table=StepTable.flat(),
                           eos_token_ids=smollm2.eos_token_ids)
    pid, ids, ref = references[1]
    kw = {"use_lookahead": True, "decoding_length": 8, "branch_length": 4, "decoding_mode": "one",
          "stop_words": [13], "debug_lookahead": False}
    g = dec.generate(ids, stop=StopCriteria(NEW_TOKENS, frozenset(smollm2.eos_token_ids)), decoding_kwargs=kw)
    assert g.tokens == ref and g.stats.mean_drafts <= 4
    off = dec.generate(ids, stop=StopCriteria(NEW_TOKENS, frozenset(smollm2.eos_token_ids)),
                       decoding_kwargs={"use_lookahead": False})
    assert off.tokens == ref and off.stats.draft_tokens == 0
    with pytest.raises(ValueError, match="unknown decoding_kwargs"):
        dec.generate(ids, decoding_kwargs={"decoding_lenght": 8})
