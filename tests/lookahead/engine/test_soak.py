"""A long run through the engine: 10,000 short requests, with cancellations, in the background thread.

Along the way: the output memory stays under its node bound; after warm-up
the process's resident memory grows by less than ALLOWED_RSS_GROWTH; no KV
row, handle or queued call is left behind by finished or cancelled requests;
and no thread is left over. The model is tiny (its weights are beside the
point); the engine, scheduler, caches and tries are the real ones.
"""

import os
import random
import threading

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.engine.engine import Engine
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner
from lookahead.engine.scheduler import SchedulerConfig

from tests.lookahead.tiny_models import tiny

REQUESTS = 10_000
WARM_UP = 1_000
IN_FLIGHT = 16
MEMORY_BOUND = 3_000
ALLOWED_RSS_GROWTH = 40 * 2**20  # after warm-up


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_ten_thousand_requests_leave_nothing_behind():
    rng = random.Random(0)
    la = LookaheadConfig(decoding_length=8, branch_length=4, adaptive=False, memory_max_nodes=MEMORY_BOUND)
    decoder = LookaheadDecoder(ModelRunner(tiny("llama")), la, table=StepTable.flat())
    threads_before = threading.active_count()
    engine = Engine(decoder, SchedulerConfig(max_batch_size=IN_FLIGHT, max_tokens_per_step=128)).start()
    outcomes = {"length": 0, "cancelled": 0, "other": 0}
    peak_nodes = 0
    base = None
    try:
        live = []
        for i in range(REQUESTS):
            prompt = [rng.randrange(3, 96) for _ in range(rng.randrange(2, 12))]
            h = engine.add_request(prompt, stop=StopCriteria(rng.randrange(1, 6)))
            if rng.random() < 0.05:
                h.cancel()
            live.append(h)
            if len(live) >= IN_FLIGHT:
                for done in live:
                    reason = done.result(timeout=60).finish_reason
                    outcomes[reason if reason in outcomes else "other"] += 1
                live = []
                peak_nodes = max(peak_nodes, decoder.memory.node_count)
            if i == WARM_UP:
                base = rss()
        for done in live:
            done.result(timeout=60)
        assert decoder.memory.node_count <= MEMORY_BOUND and peak_nodes <= MEMORY_BOUND
        assert decoder.memory.evictions > 0  # the bound was reached and enforced, not merely never hit
        growth = rss() - base
        print(f"\nsoak: {REQUESTS} requests {outcomes}; memory nodes peak {peak_nodes} (bound {MEMORY_BOUND}, "
              f"{decoder.memory.evictions} evictions); RSS growth after warm-up {growth / 2**20:.1f} MiB")
        assert growth < ALLOWED_RSS_GROWTH, f"RSS grew {growth / 2**20:.1f} MiB after warm-up"
        assert engine.active_requests == 0 and engine.cache.rows == 0 and not engine._handles
        assert not engine._calls and engine.scheduler.idle()
        assert outcomes["length"] > 9_000 and outcomes["cancelled"] > 0 and outcomes["other"] == 0, outcomes
    finally:
        engine.shutdown()
    assert threading.active_count() == threads_before
