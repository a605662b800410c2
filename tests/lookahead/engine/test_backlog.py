"""The learning backlog (lookahead/engine/backlog.py): outputs learnt in chunks while the device is busy count every
n-gram once, as learning each at once does; nothing is learnt in the shadow of an idle device; the backlog stays
within its bound; and an engine whose device runs asynchronously (a stand-in for CUDA's event query) learns in
the forward's shadow, emits the tokens of an engine that learns at once, and ends with the same memory."""

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.core.step_table import StepTable
from lookahead.core.trie import TokenTrie
from lookahead.engine.backlog import CHUNK_TOKENS, LearnBacklog
from lookahead.engine.engine import Engine
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model.runner import ModelRunner
from tests.lookahead.core.test_trie import paths
from tests.lookahead.tiny_models import tiny

# Outputs longer than a chunk, so an output is learnt across several looks at the device; they share n-grams
OUTPUTS = [[(i * 7 + k) % 23 for i in range(3 * CHUNK_TOKENS + 5)] for k in range(3)] + [[1, 2, 3, 1, 2]]


def learnt_at_once(outputs: list[list[int]]) -> TokenTrie:
    trie = TokenTrie(5)
    for out in outputs:
        trie.add_sequence(out)
    return trie


def looks(n: int):
    """busy() for `n` looks, then idle: a forward that takes n chunks' time."""
    left = [n]

    def busy() -> bool:
        left[0] -= 1
        return left[0] >= 0

    return busy


def test_chunks_learnt_in_the_shadow_count_every_ngram_once():
    backlog = LearnBacklog(TokenTrie(5), deferred=True, max_outputs=8)
    for out in OUTPUTS:
        backlog.add_sequence(out)
    assert backlog.memory.node_count == 0 and len(backlog) == 4  # held for the device's shadow
    backlog.run(looks(2))  # two chunks of the first output, then the device is done
    assert len(backlog) == 4 and backlog.pending_tokens == sum(map(len, OUTPUTS)) - 2 * CHUNK_TOKENS
    while len(backlog):
        backlog.run(looks(1))
    assert paths(backlog.memory) == paths(learnt_at_once(OUTPUTS))
    assert backlog.stats.in_shadow == sum(map(len, OUTPUTS)) and backlog.stats.at_once == 0


def test_an_idle_device_gives_no_shadow_and_a_drain_learns_the_rest():
    backlog = LearnBacklog(TokenTrie(5), deferred=True, max_outputs=8)
    for out in OUTPUTS:
        backlog.add_sequence(out)
    backlog.run(lambda: False)
    assert backlog.memory.node_count == 0
    backlog.run(looks(1))
    backlog.drain()
    assert len(backlog) == 0 and paths(backlog.memory) == paths(learnt_at_once(OUTPUTS))
    assert backlog.stats.in_shadow == CHUNK_TOKENS and backlog.stats.at_once == sum(map(len, OUTPUTS)) - CHUNK_TOKENS


def test_the_backlog_holds_at_most_its_bound_and_learns_at_once_where_the_device_is_synchronous():
    bounded = LearnBacklog(TokenTrie(5), deferred=True, max_outputs=2)
    for out in OUTPUTS:
        bounded.add_sequence(out)
    assert len(bounded) == 2  # the two oldest were learnt at once, whole
    assert paths(bounded.memory) == paths(learnt_at_once(OUTPUTS[:2]))
    sync = LearnBacklog(TokenTrie(5), deferred=False, max_outputs=2)
    sync.add_sequence(OUTPUTS[0])
    assert len(sync) == 0 and paths(sync.memory) == paths(learnt_at_once(OUTPUTS[:1]))


PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 2, 7], [3, 4, 3, 4, 8, 8, 8, 1], list(range(10, 40)), [2, 9, 2, 9, 2, 9, 2]]


def engine(asynchronous: bool, monkeypatch) -> Engine:
    runner = ModelRunner(tiny("qwen2"))
    la = LookaheadConfig(decoding_length=16, branch_length=6, adaptive=False)
    e = Engine(LookaheadDecoder(runner, la, table=StepTable.flat()),
               SchedulerConfig(max_batch_size=2, max_tokens_per_step=64))
    if asynchronous:  # as CUDA: the forward still runs for two looks after it is queued
        e.backlog.deferred = True
        calls = []

        def busy() -> bool:
            calls.append(1)
            return len(calls) % 3 != 0

        monkeypatch.setattr(runner.clock, "busy", busy)
    return e


@pytest.mark.parametrize("max_tokens", [24, 80])
def test_an_engine_learning_in_the_shadow_emits_the_same_tokens_and_ends_with_the_same_memory(max_tokens, monkeypatch):
    # Four requests through two rows, twice (the second round drafts from the first's outputs): requests finish
    # while others run, so their outputs wait in the backlog and are learnt during later forwards.
    results = {}
    for asynchronous in (False, True):
        e = engine(asynchronous, monkeypatch)
        out = []
        for _ in range(2):
            handles = [e.add_request(p, stop=StopCriteria(max_tokens)) for p in PROMPTS]
            while not all(h.done for h in handles):
                e.step()
            out += [h.result().tokens for h in handles]
            assert len(e.backlog) == 0  # the engine went idle: every output is in the memory
        results[asynchronous] = (out, paths(e.decoder.memory), e.backlog.stats)
    (sync_out, sync_mem, sync_stats), (async_out, async_mem, async_stats) = results[False], results[True]
    assert async_out == sync_out
    assert async_mem == sync_mem
    assert sync_stats.in_shadow == 0 and sync_stats.at_once == sum(map(len, sync_out))
    assert async_stats.in_shadow > 0 and async_stats.in_shadow + async_stats.at_once == sum(map(len, async_out))


def test_a_call_between_steps_sees_every_finished_output(monkeypatch):
    e = engine(True, monkeypatch)
    monkeypatch.setattr(e.runner.clock, "busy", lambda: False)  # no shadow: outputs stay in the backlog
    first = e.add_request(PROMPTS[0], stop=StopCriteria(8))
    second = e.add_request(PROMPTS[2], stop=StopCriteria(60))
    while not first.done:
        e.step()
    assert len(e.backlog) == 1 and not second.done
    assert e.call_between_steps(lambda: e.decoder.memory.node_count).result() > 0  # drained before the call
    assert len(e.backlog) == 0
