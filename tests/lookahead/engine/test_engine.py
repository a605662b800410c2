"""The batching engine: joins, leaves, cancels, chunked prefill, bounded KV, and lossless batched output."""

import asyncio
import time

import pytest

import torch

from lookahead import LookaheadConfig, LookaheadDecoder, SamplingParams, StopCriteria
from lookahead.engine.engine import Engine, EngineStopped, ExceedsBudget
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner
from lookahead.model.kv_memory import SPARE_SLOTS
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.engine.sequence import Sequence

from tests.lookahead.engine.test_lossless_architectures import hf_greedy
from tests.lookahead.tiny_models import tiny

PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 2, 7], [3, 4, 3, 4, 8, 8, 8, 1], list(range(10, 40)), [7, 7, 7], [2, 9, 2, 9, 2, 9, 2]]


def make_engine(family="llama", adaptive=False, **sched):
    model = tiny(family)
    la = LookaheadConfig(decoding_length=16, branch_length=6, adaptive=adaptive)
    dec = LookaheadDecoder(ModelRunner(model), la, table=None if adaptive else StepTable.flat())
    return model, Engine(dec, SchedulerConfig(**{"max_batch_size": 4, "max_tokens_per_step": 64, **sched}))


def drain(engine, handles, max_steps=2000):
    for _ in range(max_steps):
        if all(h._finished.is_set() for h in handles):
            return [h.result() for h in handles]
        engine.step()
    raise AssertionError("requests did not finish")


def test_requests_join_and_leave_mid_stream_and_stay_lossless():
    model, engine = make_engine()
    a = engine.add_request(PROMPTS[2], stop=StopCriteria(40))
    for _ in range(5):
        engine.step()
    assert len(engine.scheduler.running) == 1 and a.seq.tokens  # A is decoding
    b = engine.add_request(PROMPTS[0], stop=StopCriteria(10))  # B joins while A runs, and leaves first
    c = engine.add_request(PROMPTS[1], stop=StopCriteria(30))
    saw_batch = False
    while not a._finished.is_set():
        engine.step()
        saw_batch |= len(engine.scheduler.running) > 1
    assert saw_batch
    for h, prompt, n in [(a, PROMPTS[2], 40), (b, PROMPTS[0], 10), (c, PROMPTS[1], 30)]:
        assert drain(engine, [h])[0].tokens == hf_greedy(model, prompt, n)
    assert engine.cache.rows == 0 and engine.scheduler.idle()


@pytest.mark.parametrize("ragged", [True, False])
def test_diverging_kv_lengths_are_lossless_with_drafts_accepted(ragged):
    model, engine = make_engine(ragged=ragged)
    assert engine.ragged == ragged
    # Prime the memory with every reference output, so drafts are accepted and rows advance unevenly.
    refs = [hf_greedy(model, p, 40) for p in PROMPTS]
    for r in refs:
        engine.decoder.memory.add_sequence(r)
    handles = [engine.add_request(p, stop=StopCriteria(40)) for p in PROMPTS]
    uneven = False
    for _ in range(3000):
        if all(h._finished.is_set() for h in handles):
            break
        engine.step()
        lengths = engine.cache.lengths
        uneven |= len(set(lengths)) > 1
    assert uneven
    results = [h.result() for h in handles]
    assert [r.tokens for r in results] == refs
    assert sum(r.stats.accepted_drafts for r in results) > 0
    # off CUDA the forward's device time is its wall time (runner.DeviceClock)
    assert all(r.stats.forward_ms > 0 and r.stats.device_ms == pytest.approx(r.stats.forward_ms) for r in results)


def test_cancel_frees_the_row_and_others_continue():
    model, engine = make_engine()
    a = engine.add_request(PROMPTS[0], stop=StopCriteria(60))
    b = engine.add_request(PROMPTS[1], stop=StopCriteria(30))
    for _ in range(6):
        engine.step()
    assert engine.cache.rows == 2
    a.cancel()
    engine.step()
    assert a.result(timeout=0).finish_reason == "cancelled"
    assert engine.cache.rows == 1
    assert drain(engine, [b])[0].tokens == hf_greedy(model, PROMPTS[1], 30)


def test_cancelling_one_of_two_identical_queued_requests_leaves_the_other_served():
    """Two requests with the same prompt and settings are two requests. Sequences once compared by value, so
    the queue's `remove` of the cancelled one took its twin: the twin was lost and the next step's lookup of
    the cancelled one's handle killed the engine thread (a reliability run's replica failed its health check)."""
    model, engine = make_engine(max_batch_size=1)
    running = engine.add_request(PROMPTS[1], stop=StopCriteria(20))
    engine.step()
    first, second = (engine.add_request(PROMPTS[0], stop=StopCriteria(12)) for _ in range(2))
    engine.step()
    assert [id(q) for q in engine.scheduler.waiting] == [id(first.seq), id(second.seq)]  # both queued
    second.cancel()
    engine.step()
    assert second.result(timeout=0).finish_reason == "cancelled"
    assert [id(q) for q in engine.scheduler.waiting] == [id(first.seq)]  # the cancelled one left, not its twin
    out = drain(engine, [running, first])[1]
    assert out.finish_reason == "length" and out.tokens == hf_greedy(model, PROMPTS[0], 12)
    assert engine.scheduler.idle()


def test_a_bug_in_the_engine_thread_fails_its_requests_and_stops_it(monkeypatch):
    _, engine = make_engine()
    handles = [engine.add_request(p, stop=StopCriteria(8)) for p in PROMPTS[:2]]
    monkeypatch.setattr(engine, "_drop_cancelled", lambda: 1 / 0)
    engine.start()
    for h in handles:
        with pytest.raises(ZeroDivisionError):
            h.result(timeout=30)  # an error, not a wait for a thread that is gone
    assert not engine.alive and isinstance(engine.fatal, ZeroDivisionError)
    with pytest.raises(EngineStopped):
        engine.add_request(PROMPTS[0], stop=StopCriteria(8))
    engine.shutdown()


def test_chunked_prefill_does_not_stall_running_requests():
    model, engine = make_engine(prefill_chunk=8)
    a = engine.add_request(PROMPTS[0], stop=StopCriteria(40))
    for _ in range(3):
        engine.step()
    long_prompt = list(range(1, 90))  # 88 tokens to prefill = 11 chunks of 8
    b = engine.add_request(long_prompt, stop=StopCriteria(5))
    before = len(a.seq.tokens)
    engine.step()
    chunks = 1
    while engine.scheduler.prefilling is not None:
        engine.step()
        chunks += 1
    assert chunks >= 11
    assert len(a.seq.tokens) - before >= 10  # A kept emitting during B's prefill
    assert drain(engine, [a, b])[1].tokens == hf_greedy(model, long_prompt, 5)


def test_lookahead_off_per_request_in_the_same_engine():
    model, engine = make_engine()
    on = engine.add_request(PROMPTS[0], stop=StopCriteria(30))
    off = engine.add_request(PROMPTS[0], stop=StopCriteria(30), lookahead=LookaheadConfig(enabled=False))
    r_on, r_off = drain(engine, [on, off])
    assert r_on.tokens == r_off.tokens == hf_greedy(model, PROMPTS[0], 30)
    assert r_off.stats.draft_tokens == 0


def test_kv_memory_is_the_tokens_held_within_the_budget_and_all_comes_back():
    probe = make_engine()[1]
    token_bytes, headroom = probe.ledger.shape.token_bytes, probe.headroom
    worst = max(len(p) * 4 for p in PROMPTS) + 20 + headroom  # the longest request below, in KV entries
    budget_gb = 2.5 * worst * token_bytes / 2**30  # two of the longest at once, not four: memory binds, not rows
    model, engine = make_engine(kv_cache_gb=budget_gb, prefix_cache_mb=0)
    led = engine.ledger
    handles, memory_bound = [], False
    for i in range(60):  # a long run of joins and leaves
        prompt = PROMPTS[i % len(PROMPTS)] * (1 + i % 4)
        handles.append(engine.add_request(prompt, stop=StopCriteria(8 + i % 13)))
        engine.step()
        s = engine.scheduler
        running = s.running
        memory_bound |= bool(s.waiting) and s.prefilling is None and len(running) < 4  # a free row, but no room
        held = sum(led.blocks_for(l) for l in engine.cache.lengths) * led.block_bytes
        assert led.used_bytes >= held  # every row's committed entries are counted, in whole blocks
        assert sum(led.reserved_tokens(id(q)) for q in running) <= led.token_capacity
    results = drain(engine, handles, max_steps=5000)
    assert led.peak_bytes <= led.capacity_bytes
    assert memory_bound  # at times the budget, not the four rows, bounded the batch
    assert led.used_bytes == 0 and led.free_blocks == led.blocks  # every range came back, coalesced
    for i in range(0, 60, 7):
        prompt = PROMPTS[i % len(PROMPTS)] * (1 + i % 4)
        assert results[i].tokens == hf_greedy(model, prompt, 8 + i % 13)


def test_a_request_that_could_never_fit_the_budget_is_refused_naming_it():
    probe = make_engine()[1]
    budget_gb = (64 + SPARE_SLOTS) * probe.ledger.shape.token_bytes / 2**30  # 4 blocks and the trash slot
    _, engine = make_engine(kv_cache_gb=budget_gb)
    with pytest.raises(ExceedsBudget, match="KV budget holds 64"):
        engine.add_request(list(range(1, 40)), stop=StopCriteria(30))
    assert engine.scheduler.idle()


def test_background_thread_serves_asyncio_clients():
    model, engine = make_engine(adaptive=True)
    engine.start()

    async def client(prompt):
        h = engine.add_request(prompt, stop=StopCriteria(25))
        out = []
        async for tokens in h.stream():
            out += tokens
        return out

    async def main():
        return await asyncio.gather(*(client(p) for p in PROMPTS))

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert outs == [hf_greedy(model, p, 25) for p in PROMPTS]


def test_decoding_length_above_the_engine_bound_is_refused():
    _, engine = make_engine()
    try:
        engine.add_request(PROMPTS[0], lookahead=LookaheadConfig(decoding_length=999))
    except ValueError as e:
        assert "decoding_length=999" in str(e)
    else:
        raise AssertionError("accepted an out-of-bounds decoding_length")


def test_batched_sampling_keeps_the_exact_distribution():
    """Sampled requests batched four at a time, each with its own seed, against the model's exact distribution."""
    from lookahead import SamplingParams

    from tests.lookahead.model.test_sampling import PROMPT, VOCAB, chi2_pvalue, exact_two_token_distribution

    model = tiny("llama", vocab_size=VOCAB)
    with torch.no_grad():
        model.lm_head.weight.div_(4.0)
    la = LookaheadConfig(decoding_length=16, branch_length=3, max_query_length=1, adaptive=False)
    dec = LookaheadDecoder(ModelRunner(model), la, table=StepTable.flat())
    import random

    rng = random.Random(0)
    dec.memory.add_sequence([rng.randrange(VOCAB) for _ in range(400)])
    engine = Engine(dec, SchedulerConfig(max_batch_size=4, max_tokens_per_step=64))
    params = SamplingParams(do_sample=True, temperature=0.9, top_p=0.95)
    draws, counts, accepted = 2000, {}, 0
    for start in range(0, draws, 4):
        handles = [engine.add_request(PROMPT, stop=StopCriteria(2),
                                      sampling=SamplingParams(**{**params.__dict__, "seed": start + i}))
                   for i in range(4)]
        for g in drain(engine, handles):
            counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
            accepted += g.stats.accepted_drafts
    assert accepted > draws // 4
    assert chi2_pvalue(counts, exact_two_token_distribution(model, params), draws) > 1e-3


def test_a_failed_forward_fails_only_the_requests_in_flight(monkeypatch):
    model, engine = make_engine(max_batch_size=2)
    a = engine.add_request(PROMPTS[0], stop=StopCriteria(20))
    b = engine.add_request(PROMPTS[1], stop=StopCriteria(20))
    queued = engine.add_request(PROMPTS[2], stop=StopCriteria(20))  # waits: only two rows
    for _ in range(4):
        engine.step()
    real = engine.runner.verify_batch

    def boom(*args, **kwargs):
        monkeypatch.setattr(engine.runner, "verify_batch", real)  # fail once
        raise RuntimeError("simulated device fault")

    monkeypatch.setattr(engine.runner, "verify_batch", boom)
    engine.step()
    for h in (a, b):
        try:
            h.result(timeout=0)
        except RuntimeError as e:
            assert "simulated device fault" in str(e)
        else:
            raise AssertionError("an in-flight request survived a failed forward silently")
    assert engine.cache.rows == 0
    assert drain(engine, [queued])[0].tokens == hf_greedy(model, PROMPTS[2], 20)  # the engine kept serving


def test_a_fatal_device_error_stops_the_engine_and_fails_everything(monkeypatch):
    """A CUDA error other than out-of-memory poisons the device for good: the engine must stop (its replica's
    health check then fails and Ray replaces it) rather than fail every later request one by one."""
    model, engine = make_engine(max_batch_size=1)
    engine.start()
    running = engine.add_request(PROMPTS[0], stop=StopCriteria(10**4), lookahead=LookaheadConfig(enabled=False))
    queued = engine.add_request(PROMPTS[1], stop=StopCriteria(20))

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(engine.runner, "verify_batch", boom)
    for h in (running, queued):
        with pytest.raises(RuntimeError, match="illegal memory access"):
            h.result(timeout=60)
    assert not engine.alive
    with pytest.raises(EngineStopped):
        engine.add_request(PROMPTS[2], stop=StopCriteria(5))
    engine.shutdown()


def test_out_of_memory_in_a_step_fails_that_step_only(monkeypatch):
    model, engine = make_engine(max_batch_size=2)
    a = engine.add_request(PROMPTS[0], stop=StopCriteria(20))
    for _ in range(3):
        engine.step()
    real = engine.runner.verify_batch

    def oom(*args, **kwargs):
        monkeypatch.setattr(engine.runner, "verify_batch", real)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine.runner, "verify_batch", oom)
    engine.step()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        a.result(timeout=0)
    assert engine.fatal is None and engine.cache.rows == 0
    b = engine.add_request(PROMPTS[1], stop=StopCriteria(10))
    assert drain(engine, [b])[0].tokens == hf_greedy(model, PROMPTS[1], 10)


def test_where_drafts_measurably_lose_the_batch_decodes_plainly_and_stays_lossless():
    model, engine = make_engine(adaptive=True)
    engine.payoff.probe_every = 10**6  # no probes in this test
    drafting, plain = engine.payoff.rates(2)
    # Measured at 2 rows: drafting steps delivered 1 token per 1000 s. Far below any real plain step, so the
    # real plain steps this test runs (they join the plain rate) cannot bring plain below it on a slow machine.
    for _ in range(engine.payoff.min_steps):
        drafting.add(1, 1000.0, engine.payoff.decay)
        plain.add(20, 1.0, engine.payoff.decay)
    refs = [hf_greedy(model, p, 30) for p in PROMPTS[:2]]
    for r in refs:
        engine.decoder.memory.add_sequence(r)  # drafts would be accepted: only the payoff check stops them
    handles = [engine.add_request(p, stop=StopCriteria(30)) for p in PROMPTS[:2]]
    results = drain(engine, handles)
    assert [r.tokens for r in results] == refs
    assert engine.payoff.rates(2)[0].steps == engine.payoff.min_steps  # no 2-row step verified a draft
    assert engine.payoff.rates(2)[1].steps > 5


def test_where_the_table_says_every_draft_costs_a_step_the_batch_decodes_plainly_and_stays_lossless():
    model, engine = make_engine(adaptive=True)
    refs = [hf_greedy(model, p, 40) for p in PROMPTS[:2]]
    for r in refs:
        engine.decoder.memory.add_sequence(r)  # every row holds likely drafts...
    engine.table = StepTable.from_function((1, 4), (0, 64), lambda _, rows, drafts: 10.0 * (rows + drafts))
    engine.table.rate = 0.0  # ...that no step can afford, and measuring does not change that
    handles = [engine.add_request(p, stop=StopCriteria(40)) for p in PROMPTS[:2]]
    assert [r.tokens for r in drain(engine, handles)] == refs
    assert engine.decode_steps["drafting"] == 0 and engine.decode_steps["plain"] > 0


def test_where_proposing_costs_more_than_its_drafts_give_the_rows_are_held_plain(monkeypatch):
    """The planner buys no draft (every one costs a whole step), yet each row still matches and builds a tree.
    That work comes before the plan, so the table leaves it out; the payoff check weighs whole steps, proposing
    included, against plain ones, and holds the rows plain. Proposing is made dear here (0.2 s a row), so its
    steps are slower than any plain one on any machine."""
    model, engine = make_engine(adaptive=True)
    engine.payoff.probe_every = 10**6  # no probes in this test
    refs = [hf_greedy(model, p, 40) for p in PROMPTS[:2]]
    for r in refs:
        engine.decoder.memory.add_sequence(r)  # every row finds likely drafts...
    engine.table = StepTable.from_function((1, 4), (0, 64), lambda _, rows, drafts: 10.0 * (rows + drafts))
    engine.table.rate = 0.0  # ...that no step can afford, so the planner keeps every step plain
    real = Sequence.propose

    def dear(self, *a, **k):
        time.sleep(0.2)
        return real(self, *a, **k)

    monkeypatch.setattr(Sequence, "propose", dear)
    handles = [engine.add_request(p, stop=StopCriteria(40)) for p in PROMPTS[:2]]
    assert [r.tokens for r in drain(engine, handles)] == refs
    proposing, held = engine.payoff.rates(2)
    assert engine.decode_steps["drafting"] == 0
    assert proposing.steps == engine.payoff.min_steps  # proposed only while being measured
    assert held.steps > engine.payoff.min_steps  # measured in turns with the proposing steps, then held


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled-unseeded"])
def test_a_decode_step_reads_back_from_the_device_once(monkeypatch, sampled):
    """Every row's token comes back in one transfer per step, however many rows and drafts: the argmax, and
    for unseeded sampled requests (two settings here, beside a greedy one) draws made on the device; on a
    GPU each read back waits for the device. Counted: every way a tensor's values reach Python."""
    model, engine = make_engine(max_batch_size=4)
    engine.payoff.enabled = False  # every step proposes: the counted one must verify drafts
    for p in PROMPTS[:3]:
        engine.decoder.memory.add_sequence(hf_greedy(model, p, 30))  # rows draft, and accept
    settings = [SamplingParams(), SamplingParams(do_sample=True), SamplingParams(do_sample=True, temperature=0.7,
                                                                                  top_k=20, top_p=0.9)]
    handles = [engine.add_request(p, stop=StopCriteria(30), sampling=settings[i] if sampled else SamplingParams())
               for i, p in enumerate(PROMPTS[:3])]
    while len(engine.scheduler.running) < 3:
        engine.step()
    reads = []
    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "numpy", "cpu", "__index__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, _name=name, **k:
                            reads.append(_name) or _real(self, *a, **k))
    before = engine.decode_steps["drafting"]
    engine._decode_step()
    drafted = engine.decode_steps["drafting"] - before
    monkeypatch.undo()
    assert drafted == 1  # the counted step verified drafts
    assert reads == ["tolist"], reads
    drain(engine, handles)
