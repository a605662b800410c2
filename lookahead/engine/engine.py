"""The batching engine: one model replica serving many requests, one forward per step.

    engine = Engine(decoder, SchedulerConfig(max_batch_size=16)); engine.start()
    handle = engine.add_request(prompt_ids, stop=StopCriteria(128, eos))
    for tokens in handle: ...            # or: async for tokens in handle.stream()

A step reads schedule -> plan -> forward -> accept -> commit:
- schedule: drop cancelled requests; prefill one chunk of the request being
  prefilled, after copying in whatever prefix of its prompt an earlier prompt
  left in the prefix cache, and admit it to the running batch when done;
- plan: every running row proposes its draft tree, and the planner
  (planner.py) decides how many drafts each row verifies from their
  calibrated probabilities and the measured step-time table (step_table.py);
- forward: every row's tree in one forward, its argmax read back once;
- accept: each row walks its tree with the model's tokens;
- commit: keep the accepted KV entries, stream the emitted tokens, time the
  whole step into the table. Finished requests leave at once and free their row.

Their outputs go to the output memory through a backlog (`backlog.py`): on
CUDA it is learnt between launching a step's forward and reading its tokens
back, while the device is busy; on the CPU at once.

Memory: the KV budget (`kv_memory.py`; from `kv_cache_gb`, or the device)
is one pool (`batch_cache.py`). A request is admitted when its worst case
fits what is free, and prefilled straight into its own range; the prefix
cache lives in the same pool and gives way first. A request that could
never fit the whole budget is refused at `add_request`.

A single stream (`LookaheadDecoder.generate`) is this step on a batch of one.

The engine runs in one background thread; `add_request` and `cancel` are
thread-safe, and handles deliver tokens to a thread or to an asyncio loop.
"""

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass

from lookahead.engine.backlog import LearnBacklog
from lookahead.engine.generate import LookaheadDecoder
from lookahead.model.batch_cache import BatchKVCache
from lookahead.model.kv_cache import KVCache
from lookahead.model.kv_memory import KVLedger
from lookahead.core.payoff import Payoff
from lookahead.core.planner import break_even, plan_step
from lookahead.model.prefix_cache import PrefixCache
from lookahead.model.runner import StepPath, is_fatal_device_error
from lookahead.engine.scheduler import Scheduler, SchedulerConfig
from lookahead.engine.sequence import Generation, Sequence
from lookahead.engine.stats import EngineTimes

log = logging.getLogger(__name__)


class EngineStopped(RuntimeError):
    """The engine no longer takes requests (a fatal device error): the replica is to be replaced."""


class ExceedsBudget(ValueError):
    """A request whose worst case (prompt + max_new_tokens + tree headroom) is more than the whole KV budget."""


@dataclass(frozen=True)
class MemoryStats:
    """The engine's KV memory and queue now (for /stats and the Prometheus gauges)."""

    kv_budget_bytes: int  # what the pool may hold: whole blocks of the budget
    kv_used_bytes: int  # blocks the running requests and the prefix cache hold now
    kv_peak_bytes: int  # the most held at once since start
    prefix_cache_bytes: int
    running: int  # requests being prefilled or decoded
    waiting: int  # requests queued for room or a row
    kv_budget_terms: dict  # why the budget is what it is (kv_memory.Budget.terms): weights, activation peak, ...

_TOKENS, _DONE, _ERROR = "tokens", "done", "error"


def _unpack(kind: str, payload):
    """An event's tokens; None when the request is done; a failed request's error is raised."""
    if kind == _ERROR:
        raise payload
    return payload if kind == _TOKENS else None


class RequestHandle:
    """A request in the engine: stream its tokens (sync or async), wait for its result, or cancel it."""

    def __init__(self, seq: Sequence, engine: "Engine", loop: asyncio.AbstractEventLoop | None) -> None:
        self.seq = seq
        self._engine = engine
        self._loop = loop
        self._events: queue.Queue | asyncio.Queue = asyncio.Queue() if loop else queue.Queue()
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self.cancelled = False

    def _push(self, kind: str, payload) -> None:
        if kind != _TOKENS:
            if kind == _ERROR:
                self._error = payload
            self._finished.set()
        if self._loop is None:
            self._events.put((kind, payload))
            return
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, payload))
        except RuntimeError:  # the consumer's loop is gone: nobody is listening any more
            self.cancelled = True

    def __iter__(self):
        assert self._loop is None, "this handle streams to an asyncio loop: use `async for ... in handle.stream()`"
        while (tokens := _unpack(*self._events.get())) is not None:
            yield tokens

    async def stream(self):
        assert self._loop is not None, "this handle was created outside an event loop: iterate it directly"
        while (tokens := _unpack(*(await self._events.get()))) is not None:
            yield tokens

    def cancel(self) -> None:
        self.cancelled = True
        self._engine._wake.set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def drain(self) -> list[list[int]]:
        """The token events delivered so far, without waiting (for a caller stepping the engine itself)."""
        out = []
        while not self._events.empty():
            tokens = _unpack(*self._events.get_nowait())
            if tokens is not None:
                out.append(tokens)
        return out

    def result(self, timeout: float | None = None) -> Generation:
        if not self._finished.wait(timeout):
            raise TimeoutError("the request has not finished")
        if self._error is not None:
            raise self._error
        return self.seq.result()


class Engine:
    def __init__(self, decoder: LookaheadDecoder, config: SchedulerConfig = SchedulerConfig()) -> None:
        self.decoder = decoder
        self.runner = decoder.runner
        self.config = config
        self.ragged = config.ragged and self.runner.ragged  # rows send only their own tree tokens
        self.table = decoder.step_table(config.max_batch_size, config.max_tokens_per_step, self.ragged)
        self.headroom = decoder.config.decoding_length + 1
        # On an accelerator, what the largest forward allocates is not the pool's (measured at start; 0 elsewhere)
        width = max(1, min(self.headroom, config.max_tokens_per_step // config.max_batch_size))
        peak = 0 if config.kv_cache_gb is not None else self.runner.activation_peak(
            config.max_batch_size, width, config.prefill_chunk)
        self.ledger = KVLedger(self.runner.kv_shape, self.runner.kv_budget(
            config.kv_cache_gb, config.gpu_memory_utilization, peak))
        self.cache = BatchKVCache(self.runner.pool_layout(), self.ledger,
                                  config.max_batch_size * (self.runner.max_positions() + self.headroom))
        self.prefixes = PrefixCache(self.cache, config.prefix_cache_mb * 2**20)
        self.scheduler = Scheduler(config, ledger=self.ledger, headroom=self.headroom,
                                   make_room=self.prefixes.evict_one)
        log.info("KV budget: %d tokens, %.3f GiB (%s; %d bytes a token)", self.ledger.token_capacity,
                 self.ledger.capacity_bytes / 2**30, self.ledger.budget.source,
                 self.ledger.shape.token_bytes)
        if self.ledger.bound_blocks < self.ledger.budget_blocks:
            log.warning("KV pool capped at %d tokens of the budget's %d: one layer's keys stay below 2^31 elements "
                        "(the tree attention kernel's 32-bit offsets)", self.ledger.token_capacity,
                        self.ledger.budget_blocks * self.ledger.block_tokens)
        self._handles: dict[int, RequestHandle] = {}  # id(seq) -> handle
        self._inbox: deque[RequestHandle] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._calls: deque[tuple] = deque()  # (fn, future) to run on the engine thread between steps
        self._thread: threading.Thread | None = None
        self._prefill_cache: KVCache | None = None
        self.fatal: BaseException | None = None  # a device error that stopped the engine for good
        self.payoff = Payoff()  # measured: do proposing steps deliver more tokens/s than held ones, per batch size
        self.steps = 0
        self.forward_tokens = 0  # tokens the decode forwards computed, summed
        # decode steps by kind: verified drafts / went plain by the planner's choice / held plain by the payoff check
        self.decode_steps = {"drafting": 0, "plain": 0, "held": 0}
        self.times = EngineTimes()  # where the steps' time went, by phase and by rows in the batch
        # Called on the engine thread with each output the memory learnt (the fleet memory's outbox, say).
        self.learn_listeners: list[Callable[[list[int]], None]] = []
        # Finished outputs on their way into the memory: in the forward's shadow where the device runs queued
        # work while the host goes on (CUDA), at once elsewhere; never more than a batch's worth behind.
        self.backlog = LearnBacklog(decoder.memory, deferred=self.runner.clock.cuda,
                                    max_outputs=config.max_batch_size)

    # ---- API -------------------------------------------------------------
    def add_request(self, prompt_ids: Seq[int], *, loop: asyncio.AbstractEventLoop | None = None, **kwargs) -> RequestHandle:
        """Queue a request (kwargs as LookaheadDecoder.new_sequence). Bad settings raise ValueError here."""
        la = kwargs.get("lookahead")
        if la is not None and la.enabled and la.decoding_length > self.decoder.config.decoding_length:
            raise ValueError(
                f"decoding_length={la.decoding_length} exceeds this engine's {self.decoder.config.decoding_length}"
            )
        return self.submit(self.decoder.new_sequence(prompt_ids, **kwargs), loop=loop)

    def submit(self, seq: Sequence, *, loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue a request built by `decoder.new_sequence`."""
        if self.fatal is not None:
            raise EngineStopped(f"the engine stopped after a fatal device error: {self.fatal}")
        worst = self.scheduler.worst_case(seq)
        if not self.ledger.fits_ever(worst):
            raise ExceedsBudget(
                f"the prompt ({len(seq.prompt)} tokens) + max_tokens ({seq.stop.max_new_tokens}) + {self.headroom} "
                f"tokens of draft headroom = {worst} tokens of KV; this replica's KV budget holds "
                f"{self.ledger.token_capacity}")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        handle = RequestHandle(seq, self, loop)
        with self._lock:
            self._inbox.append(handle)
        self._wake.set()
        return handle

    def call_between_steps(self, fn) -> concurrent.futures.Future:
        """Run `fn()` on the engine thread between two steps (so it sees no half-done step); its result.

        For work that reads engine state the thread mutates, such as saving the
        output memory. Runs at once (here) when the engine thread is not running.
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            try:
                self.backlog.drain()
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)
            return fut
        with self._lock:
            self._calls.append((fn, fut))
        self._wake.set()
        return fut

    def _run_calls(self) -> None:
        if self._calls:
            self.backlog.drain()  # a call may read the memory (a save, a fleet seed): it sees every output
        while self._calls:
            with self._lock:
                fn, fut = self._calls.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def start(self) -> "Engine":
        assert self._thread is None, "already started"
        self._thread = threading.Thread(target=self._run, name="lookahead-engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._fail(RuntimeError("the engine shut down"), queued_too=True)

    def close(self) -> None:
        """Shut down (every request still queued or running ends with an error) and hand the KV pool back now,
        so the next engine in this process gets the budget this one had (`batch_cache.BatchKVCache.close`).
        Idempotent; the replica calls it on shutdown, the benchmarks through `with Engine(...) as engine`."""
        self.shutdown()
        self.cache.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """The background thread is running (False before `start`, after `shutdown`, a crash or a fatal device
        error)."""
        return self._thread is not None and self._thread.is_alive() and self.fatal is None

    def memory_stats(self) -> MemoryStats:
        s, led = self.scheduler, self.ledger
        return MemoryStats(led.capacity_bytes, led.used_bytes, led.peak_bytes, self.prefixes.bytes,
                           len(s.running) + (s.prefilling is not None), len(self._inbox) + len(s.waiting),
                           led.budget.terms())

    def step_path(self) -> StepPath:
        """Which forward the decode steps take, and the CUDA graphs replayed (runner.StepPath)."""
        return self.runner.step_path()

    @property
    def active_requests(self) -> int:
        s = self.scheduler
        return len(self._inbox) + len(s.waiting) + (s.prefilling is not None) + len(s.running)

    # ---- the loop --------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.step():
                    self._wake.wait(0.05)
                    self._wake.clear()
        except BaseException as e:  # a bug outside a step's forward: stop for good and say so, never leave
            log.critical("the engine thread failed; the engine stops (the health check fails from now)",
                         exc_info=True)  # the requests it held waiting for a thread that is gone
            self.fatal = e
            self._fail(e, queued_too=True)

    def step(self) -> bool:
        """One engine step; False when there was nothing to do."""
        self._run_calls()
        self._intake()
        self._drop_cancelled()
        if self.scheduler.idle():
            self.backlog.drain()
            return False
        try:
            self._prefill_step()
            if self.scheduler.running:
                self._decode_step()
        except Exception as e:  # a failed forward must not hang anyone: fail what was in flight, keep serving
            if is_fatal_device_error(e):  # ...unless the device itself is gone: stop, so the replica is replaced
                log.critical("fatal device error; the engine stops (the health check fails from now): %s", e)
                self.fatal = e
                self._stop.set()
                self._fail(e, queued_too=True)
            else:
                log.exception("engine step failed; failing the requests in flight")
                self._fail(e, queued_too=False)
        if self.scheduler.idle():  # the last request just left: nothing waits behind its output (a single stream)
            self.backlog.drain()
        self.steps += 1
        return True

    def _intake(self) -> None:
        with self._lock:
            while self._inbox:
                h = self._inbox.popleft()
                self._handles[id(h.seq)] = h
                self.scheduler.add(h.seq)

    def _finish(self, seq: Sequence, reason: str = "cancelled") -> None:
        if seq.close(self.backlog, reason):
            for listen in self.learn_listeners:
                listen(seq.tokens)
        h = self._handles.pop(id(seq), None)
        if h is not None:
            h._push(_DONE, seq.result())

    def _drop_cancelled(self) -> None:
        s = self.scheduler
        cancelled = lambda seq: self._handles[id(seq)].cancelled  # noqa: E731
        for seq in [q for q in s.waiting if cancelled(q)]:
            s.waiting.remove(seq)
            self._finish(seq)
        if s.prefilling is not None and cancelled(s.prefilling.seq):
            s.release(s.prefilling.seq)
            self._finish(s.prefilling.seq)
            s.prefilling, self._prefill_cache = None, None
        for row in sorted((r for r, q in enumerate(s.running) if cancelled(q)), reverse=True):
            seq = s.running[row]
            self._release(row)
            self._finish(seq)

    def _release(self, row: int) -> None:
        self.cache.release(row)
        self.scheduler.remove_row(row)

    def _fail(self, error: BaseException, queued_too: bool) -> None:
        """End the requests in flight (and, on shutdown, the queued ones) with `error`."""
        s = self.scheduler
        seqs = ([s.prefilling.seq] if s.prefilling else []) + list(s.running)
        if queued_too:
            seqs += list(s.waiting)
            s.waiting.clear()
            with self._lock:
                seqs += [h.seq for h in self._inbox]
                for h in self._inbox:
                    self._handles[id(h.seq)] = h
                self._inbox.clear()
        if s.prefilling is not None:
            s.release(s.prefilling.seq)
        s.prefilling, self._prefill_cache = None, None
        while s.running:
            self._release(len(s.running) - 1)
        for seq in seqs:
            seq.close(self.decoder.memory, "error")
            h = self._handles.pop(id(seq), None)
            if h is not None:
                h._push(_ERROR, error)

    # ---- prefill ---------------------------------------------------------
    def _prefill_step(self) -> None:
        s = self.scheduler
        chunk = s.next_prefill_chunk()
        t0 = time.perf_counter()
        if chunk is not None:
            p, start, end = chunk
            key = id(p.seq)  # its reservation in the ledger: its range of the pool
            if start == 0:
                self._prefill_cache = self.cache.row_cache(key)
                reused = self.prefixes.load_into(self.ledger.offset(key), p.seq.ctx[: p.total])
                if reused:
                    self._prefill_cache.length = reused
                    p.seq.stats.cached_prompt_tokens = reused
                    start, end = reused, min(p.total, reused + self.config.prefill_chunk)
            if end > start:
                t0 = time.perf_counter()
                self.runner.prefill(self._prefill_cache, p.seq.ctx[start:end])
                p.seq.stats.prefill_ms += (time.perf_counter() - t0) * 1e3
            just_done = not p.finished and end >= p.total
            p.done = end
            self.ledger.hold(key, end)
            if just_done:
                self.prefixes.store(self.ledger.offset(key), p.seq.ctx[: p.total])
        if s.can_admit():
            seq = s.admit()
            self.cache.attach(id(seq), self._prefill_cache.length)
            self._prefill_cache = None
        self.times.prefill_s += time.perf_counter() - t0

    # ---- decode ----------------------------------------------------------
    def _decode_step(self) -> None:
        d, running = self.decoder, self.scheduler.running
        n = len(running)
        t0 = time.perf_counter()
        builds = sum(seq.index_build_s for seq in running)
        # plan
        allow = self.payoff.allow(n)
        cap = self.config.max_tokens_per_step
        # Drafts no plan could take are not built (fixed budgets and padded widths plan otherwise)
        planned = allow and self.ragged and all(seq.la.adaptive for seq in running)
        floor = break_even(self.table, n, cap) if planned else 0.0
        trees = [seq.propose(d.memory, floor) if allow or not seq.la.adaptive else seq.root() for seq in running]
        proposed = allow and any(seq.drafting for seq in running)
        t_proposed = time.perf_counter()
        plan = plan_step([seq.candidates(t, d.calibration, floor) for seq, t in zip(running, trees)], self.table,
                         cap, self.ragged, self.table.error)
        trees = [t.truncated(c) for t, c in zip(trees, plan.counts)]
        t1 = time.perf_counter()
        # forward
        clock = self.runner.clock
        clock.start()
        logits = self.runner.verify_batch(self.cache, trees, plan.width, ragged=self.ragged,
                                          split=plan.layout == "split")
        clock.stop()
        self.backlog.run(clock.busy)  # the device runs the forward: learn finished outputs meanwhile
        picks = logits.picks([seq.sampling if seq.draws_on_device else None for seq in running])  # the one sync
        t2 = time.perf_counter()
        device_ms = clock.ms()
        device_ms = (t2 - t1) * 1e3 if device_ms is None else device_ms
        # accept
        keeps, done, delivered = [], [], 0
        for row, (seq, tree) in enumerate(zip(running, trees)):
            start = logits.starts[row]
            acc = seq.choose(tree, logits[row], picks[start : start + len(tree.tokens)])
            keeps.append([0] + acc.rows)
            emitted = seq.advance(tree, acc, d.calibration)
            delivered += len(emitted)
            seq.stats.query_ms += (t1 - t0) * 1e3 / n
            seq.stats.forward_ms += (t2 - t1) * 1e3
            seq.stats.device_ms += device_ms
            if seq.la.debug:
                log.info("step %d: %d drafts (match %d), accepted %d", seq.stats.steps, tree.num_drafts,
                         tree.match_length, len(acc.rows))
            self._handles[id(seq)]._push(_TOKENS, emitted)
            if seq.finished:
                done.append(row)
        t3 = time.perf_counter()
        # commit
        self.cache.commit(keeps)
        self.forward_tokens += n + plan.inflight
        # A request's first proposal indexes its n-grams: a one-off, kept out of what a step costs.
        end = time.perf_counter()
        step_s = end - t0 - (sum(seq.index_build_s for seq in running) - builds)
        # The table prices what a plan decides: the step from the plan on. Proposing is spent by then, so it is
        # left out (a plain step's price is then a held step's). The payoff check weighs the whole step: where
        # proposing costs more than the drafts it finds give back, it holds the rows plain.
        self.table.observe(plan.layout, n, plan.inflight, (end - t_proposed) * 1e3)
        self.payoff.record(n, proposed, delivered, step_s)
        self.decode_steps["drafting" if plan.inflight else "plain" if allow else "held"] += 1
        for row in sorted(done, reverse=True):
            seq = running[row]
            self._release(row)
            self._finish(seq, seq.finish_reason)
        self.times.add_decode(n, t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3, delivered)
