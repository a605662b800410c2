"""The scheduler on its own: FIFO admission, one chunked prefill at a time, the batch's row limit, admission by
KV memory (reserve the worst case, evict from the prefix cache first, wait otherwise), and rows leaving.

Pure bookkeeping, no model: the requests are real `Sequence`s (only their prompt, context and max_tokens
matter here) and each prefill chunk is marked done by hand, as the engine does after its forward.
"""

import pytest

from lookahead.config import LookaheadConfig
from lookahead.model.kv_memory import SPARE_SLOTS, Budget, KVLedger, KVShape
from lookahead.model.sampling import SamplingParams
from lookahead.engine.scheduler import Prefill, Scheduler, SchedulerConfig
from lookahead.engine.sequence import Sequence, StopCriteria

BLOCK = 16
SHAPE = KVShape(layers=1, kv_heads=1, head_dim=1, dtype_bytes=4)  # 8 bytes a token: budgets read in blocks


def req(prompt_tokens: int, new_tokens: int = 8) -> Sequence:
    return Sequence([1] * prompt_tokens, StopCriteria(new_tokens), SamplingParams(), LookaheadConfig())


def ledger(blocks: int) -> KVLedger:
    return KVLedger(SHAPE, Budget((blocks * BLOCK + SPARE_SLOTS) * SHAPE.token_bytes, "test"), block_tokens=BLOCK)


def scheduler(max_batch_size: int = 4, prefill_chunk: int = 512, **kw) -> Scheduler:
    return Scheduler(SchedulerConfig(max_batch_size=max_batch_size, max_tokens_per_step=64,
                                     prefill_chunk=prefill_chunk), **kw)


def start_and_admit(s: Scheduler) -> Sequence | None:
    """One request from the queue through its whole prefill into the batch, as the engine's steps would take
    it; None when the scheduler starts nothing."""
    chunk = s.next_prefill_chunk()
    if chunk is None:
        return None
    while True:
        p, _, end = chunk
        p.done = end
        if s.can_admit():
            return s.admit()
        chunk = s.next_prefill_chunk()


def test_requests_are_admitted_in_arrival_order_one_prefill_at_a_time():
    # FIFO: the batch's rows are filled in the order the requests came, and a second prefill never starts
    # while one is under way (the queue keeps the others).
    s = scheduler()
    a, b, c = req(5), req(3), req(9)
    for q in (a, b, c):
        s.add(q)
    first = s.next_prefill_chunk()
    assert first[0].seq is a and list(s.waiting) == [b, c]
    assert s.next_prefill_chunk()[0] is first[0]  # still `a`'s prefill (not finished): `b` does not start
    assert list(s.waiting) == [b, c]
    first[0].done = first[0].total
    assert s.admit() is a
    assert start_and_admit(s) is b and start_and_admit(s) is c
    assert s.running == [a, b, c] and not s.waiting and s.prefilling is None


def test_a_long_prompt_is_prefilled_in_chunks_and_joins_only_when_done():
    # A 1,201-token prompt with 512-token chunks: three chunks (the last prompt token is the first decode
    # step's root, so 1,200 are prefilled), and the request may join the batch only after the third.
    s = scheduler(prefill_chunk=512)
    long = req(1201)
    s.add(long)
    ranges = []
    while True:
        p, start, end = s.next_prefill_chunk()
        ranges.append((start, end))
        assert not s.can_admit()  # the chunk is not done yet
        p.done = end
        if s.can_admit():
            break
    assert ranges == [(0, 512), (512, 1024), (1024, 1200)]
    assert s.admit() is long and s.running == [long]


def test_a_one_token_prompt_needs_no_prefill_and_joins_at_once():
    # Nothing to prefill (its only token is the first root): an empty chunk, already finished.
    s = scheduler()
    one = req(1)
    s.add(one)
    p, start, end = s.next_prefill_chunk()
    assert (start, end) == (0, 0) and p.finished and s.can_admit()
    assert s.admit() is one


def test_no_more_rows_than_max_batch_size_and_the_next_starts_when_one_leaves():
    # With two rows, the third request waits in the queue (its prefill does not even start, so it holds no
    # KV), and starts as soon as a row is free.
    s = scheduler(max_batch_size=2)
    a, b, c = req(4), req(4), req(4)
    for q in (a, b, c):
        s.add(q)
    assert start_and_admit(s) is a and start_and_admit(s) is b
    assert s.next_prefill_chunk() is None
    assert list(s.waiting) == [c] and s.prefilling is None
    s.remove_row(0)  # `a` finished
    assert start_and_admit(s) is c
    assert s.running == [b, c]  # `b`, the last row, moved into row 0; `c` took the next row


def test_removing_a_row_moves_the_last_row_into_its_place():
    # The batch KV cache moves its last row into a freed one (BatchKVCache.release): the scheduler's rows must
    # match it, row for row, or a request would decode with another's KV.
    s = scheduler(max_batch_size=4)
    a, b, c, d = (req(2) for _ in range(4))
    for q in (a, b, c, d):
        s.add(q)
    while start_and_admit(s) is not None:
        pass
    assert s.running == [a, b, c, d]
    s.remove_row(1)
    assert s.running == [a, d, c]
    s.remove_row(2)  # the last row: nothing moves
    assert s.running == [a, d]
    s.remove_row(0)
    assert s.running == [d]


def test_admission_reserves_the_worst_case_in_whole_blocks():
    # The reservation is prompt + max_new_tokens + the tree headroom, rounded up to blocks, taken when the
    # prefill starts (not when the request is queued), and given back when its row leaves.
    led = ledger(blocks=10)
    s = scheduler(ledger=led, headroom=5)
    q = req(20, new_tokens=10)  # worst case 35 tokens: 3 blocks of 16
    assert s.worst_case(q) == 35
    s.add(q)
    assert led.free_blocks == 10  # queued: nothing reserved yet
    start_and_admit(s)
    assert led.reserved_tokens(id(q)) == 48 and led.free_blocks == 7
    s.remove_row(0)
    assert led.free_blocks == 10


def test_the_head_waits_for_memory_and_starts_once_a_running_request_frees_it():
    # 8 blocks; each request's worst case is 4 blocks (50 + 10 + 4 = 64 tokens): two run, the third waits in
    # the queue (not prefilling, nothing reserved) although a batch row is free, and starts when one leaves.
    led = ledger(blocks=8)
    s = scheduler(max_batch_size=4, ledger=led, headroom=4)
    a, b, c = req(50, 10), req(50, 10), req(50, 10)
    for q in (a, b, c):
        s.add(q)
    assert start_and_admit(s) is a and start_and_admit(s) is b
    assert s.next_prefill_chunk() is None
    assert list(s.waiting) == [c] and s.prefilling is None and led.free_blocks == 0
    s.remove_row(1)  # `b` leaves: its 4 blocks are free again
    assert start_and_admit(s) is c and s.running == [a, c]


def test_a_short_request_does_not_jump_a_long_one_waiting_for_memory():
    # FIFO under memory pressure: the small request behind a big one that does not fit waits too, so the big
    # one is never starved by a stream of small ones.
    led = ledger(blocks=6)
    s = scheduler(ledger=led)
    running, big, small = req(40, 8), req(60, 4), req(2, 2)  # 3 blocks; 4 blocks; 1 block
    for q in (running, big, small):
        s.add(q)
    assert start_and_admit(s) is running  # 3 of 6 blocks left: `small` would fit, `big` does not
    assert s.next_prefill_chunk() is None and list(s.waiting) == [big, small]
    s.remove_row(0)
    assert start_and_admit(s) is big and start_and_admit(s) is small


def test_the_prefix_cache_gives_way_before_the_head_waits():
    # `make_room` (the prefix cache dropping its oldest entry) is called while the head does not fit, and no
    # more than needed: 2 blocks are free and three cached prompts hold 2 blocks each after them; the head
    # needs 5 blocks, so the two oldest go and the newest stays.
    led = ledger(blocks=8)
    led.reserve("gap", 2 * BLOCK)
    cached = [f"prefix-{i}" for i in range(3)]  # oldest first
    for key in cached:
        led.reserve(key, 2 * BLOCK)
    led.release("gap")  # blocks 0-1 free, then the three entries
    evicted = []

    def make_room() -> bool:
        if not cached:
            return False
        key = cached.pop(0)
        led.release(key)
        evicted.append(key)
        return True

    s = scheduler(ledger=led, make_room=make_room)
    q = req(70, 10)  # 80 tokens: 5 blocks
    s.add(q)
    assert start_and_admit(s) is q
    assert evicted == ["prefix-0", "prefix-1"] and cached == ["prefix-2"]
    assert led.offset(id(q)) == 0  # in the run the evictions freed


def test_when_nothing_is_evictable_the_head_waits_without_a_reservation():
    # An empty prefix cache (`make_room` answers False) cannot help: the request stays queued and holds nothing,
    # and asking again does not loop or reserve twice.
    led = ledger(blocks=4)
    calls = []

    def make_room() -> bool:
        calls.append(1)
        return False

    s = scheduler(ledger=led, make_room=make_room)
    led.reserve("other", 2 * BLOCK)
    q = req(40, 8)  # 3 blocks; 2 free
    s.add(q)
    assert s.next_prefill_chunk() is None and s.next_prefill_chunk() is None
    assert list(s.waiting) == [q] and s.prefilling is None and led.free_blocks == 2
    assert len(calls) == 2  # one try per attempt
    led.release("other")
    assert start_and_admit(s) is q


def test_a_request_cancelled_during_its_prefill_frees_its_reservation():
    # The engine drops a cancelled prefill with `release` and clears `prefilling`: the memory it reserved is free
    # again and the next request can start.
    led = ledger(blocks=4)
    s = scheduler(ledger=led)
    a, b = req(40, 8), req(40, 8)  # 3 blocks each: one at a time
    s.add(a)
    s.add(b)
    assert s.next_prefill_chunk()[0].seq is a
    assert s.next_prefill_chunk()[0].seq is a  # `b` cannot start while `a` is prefilling (nor fit beside it)
    s.release(a)
    s.prefilling = None
    assert led.free_blocks == 4
    assert start_and_admit(s) is b


def test_release_without_a_ledger_is_harmless():
    # Without a ledger rows are the only limit; releasing a request (finished, cancelled) must not fail.
    s = scheduler()
    q = req(3)
    s.add(q)
    start_and_admit(s)
    s.release(q)
    s.remove_row(0)
    assert s.running == [] and s.idle()


def test_idle_only_when_nothing_waits_prefills_or_runs():
    s = scheduler()
    assert s.idle()
    q = req(600)
    s.add(q)
    assert not s.idle()  # waiting
    s.next_prefill_chunk()
    assert not s.waiting and not s.idle()  # prefilling
    s.prefilling.done = s.prefilling.total
    s.admit()
    assert not s.idle()  # running
    s.remove_row(0)
    assert s.idle()


def test_prefill_total_leaves_the_last_token_for_the_first_step():
    p = Prefill(req(7))
    assert p.total == 6 and not p.finished
    p.done = 6
    assert p.finished


@pytest.mark.parametrize("bad", [
    {"max_batch_size": 0}, {"max_tokens_per_step": 0}, {"prefill_chunk": 0}, {"prefix_cache_mb": -1},
    {"kv_cache_gb": 0}, {"gpu_memory_utilization": 0}, {"gpu_memory_utilization": 1.5},
    {"max_batch_size": 32, "max_tokens_per_step": 16},  # fewer tokens a step than rows
])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SchedulerConfig(**bad)
