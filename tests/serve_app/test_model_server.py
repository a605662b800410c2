"""The model replica's own logic, with a fake engine and tokenizer: no Ray, no weights.

`ModelReplica` takes its parts from a `build` function (serve_app.model_server.build_engine loads the real
ones); here `build` hands it a scripted engine whose requests emit a given text, one token per character,
and end as the real engine ends them ("eos", "length", "cancelled", or an error), or hang until cancelled.
That drives admission (queue full, a lost device, context and KV budget, bad prompts), streaming, finish
reasons, cancellation through the cancel board, health, and the autoscaling stats. The module's `ray` and
`serve` are swapped for a stand-in that fails on any use, so nothing here can lean on a running Ray; the
Ray tests (test_server.py, test_reliability.py) keep what needs Ray: real HTTP, routing, replicas.
"""

import asyncio
import inspect
import itertools
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import pytest
import ray

from lookahead.engine.backlog import BacklogStats
from lookahead.engine.engine import EngineStopped, MemoryStats
from lookahead.model.runner import StepPath
from lookahead.engine.sequence import Generation
from lookahead.engine.stats import RequestStats
from lookahead.core.trie import TokenTrie
from serve_app import model_server
from serve_app.autoscaling import ENGINE_QUEUE
from serve_app.config import ModelConfig
from serve_app.jobs import Event, Job
from serve_app.metrics import ReplicaMetrics
from serve_app.model_server import LookaheadModel, ModelReplica, ReplicaParts, build_engine, lookahead_configs

VOCAB = 128  # token id = the character's code point (ASCII)
TIMEOUT_S = 10.0  # a group that never ends (a request nobody cancels) fails its test instead of hanging it
EOS = frozenset({0})


# ---- fakes ----------------------------------------------------------------------------------------------------
class FakeTokenizer:
    """One token per ASCII character; its chat template tags each turn with its role and refuses two turns
    in a row from one role."""

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(t) for t in ids if not (skip_special_tokens and t in EOS))

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kwargs) -> dict:
        roles = [m["role"] for m in messages]
        if any(a == b for a, b in zip(roles, roles[1:])):
            raise ValueError("conversation roles must alternate")
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                             else "")
        return {"input_ids": self.encode(text)}


TOKENIZER = FakeTokenizer()


@dataclass(frozen=True)
class Reply:
    """What the fake engine generates for one request."""

    text: str = "Paris."
    chunk: int = 1  # tokens per step
    hang: bool = False  # after the text, wait until cancelled
    fail: bool = False  # after the text, the engine fails the request
    cached: int = 0  # prompt tokens from the prefix cache


class FakeSeq:
    def __init__(self, prompt: list[int]) -> None:
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> Generation:
        assert self.finished, "the sequence has not finished"
        return Generation(self.tokens, self.finish_reason, self.stats)


class FakeHandle:
    """A request in the fake engine: streams its reply's tokens, ended the way the real engine ends one."""

    def __init__(self, prompt, stop, sampling, lookahead, reply: Reply) -> None:
        self.prompt, self.stop, self.sampling, self.lookahead, self.reply = prompt, stop, sampling, lookahead, reply
        self.seq = FakeSeq(prompt)
        self.seq.stats.cached_prompt_tokens = reply.cached
        self.cancelled = False
        self._wake = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled = True
        if not self.seq.finished:  # the engine drops a cancelled request at its next step
            self.seq.finish_reason = "cancelled"
        self._wake.set()

    async def stream(self):
        tokens = TOKENIZER.encode(self.reply.text)[: self.stop.max_new_tokens]
        for i in range(0, len(tokens), self.reply.chunk):
            await asyncio.sleep(0)  # one engine step
            if self.seq.finished:
                return
            step = tokens[i: i + self.reply.chunk]
            self.seq.tokens += step
            self.seq.stats.new_tokens += len(step)
            self.seq.stats.steps += 1
            yield step
        if self.reply.hang:
            await self._wake.wait()
            return
        if self.reply.fail:
            self.seq.finish_reason = "error"
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if not self.seq.finished:
            self.seq.finish_reason = "length" if len(self.seq.tokens) >= self.stop.max_new_tokens else "eos"


class FakeEngine:
    """The attributes and methods of lookahead.engine.engine.Engine that the replica uses."""

    def __init__(self, bound, headroom: int = 4, capacity: int = 100_000) -> None:
        self.decoder = SimpleNamespace(config=bound, memory=TokenTrie(bound.branch_length + 1, bound.stop_words))
        self.headroom = headroom
        self.ledger = SimpleNamespace(token_capacity=capacity)
        self.fatal: BaseException | None = None
        self.alive = True
        self.decode_steps = {"drafting": 7, "plain": 2, "held": 1}
        self.replies: deque[Reply] = deque()  # what the next requests generate; then Reply()
        self.handles: list[FakeHandle] = []
        self.queued = 0  # requests held by others (to set the queue without running them)
        self.backlog = SimpleNamespace(stats=BacklogStats(in_shadow=3, at_once=5))

    @property
    def active_requests(self) -> int:
        return self.queued + sum(not h.seq.finished for h in self.handles)

    def add_request(self, prompt_ids, *, loop=None, stop, sampling, lookahead) -> FakeHandle:
        if lookahead.enabled and lookahead.decoding_length > self.decoder.config.decoding_length:  # as the real one
            raise ValueError(f"decoding_length={lookahead.decoding_length} exceeds this engine's "
                             f"{self.decoder.config.decoding_length}")
        handle = FakeHandle(list(prompt_ids), stop, sampling, lookahead,
                            self.replies.popleft() if self.replies else Reply())
        self.handles.append(handle)
        return handle

    def memory_stats(self) -> MemoryStats:
        return MemoryStats(kv_budget_bytes=1 << 20, kv_used_bytes=4096, kv_peak_bytes=8192, prefix_cache_bytes=1024,
                           running=1, waiting=self.queued,
                           kv_budget_terms={"source": "memory.kv_cache_gb=0.001", "kv_budget_bytes": 1 << 20})

    def step_path(self) -> StepPath:
        return StepPath(False, False, False, 0, 0)

    def call_between_steps(self, fn) -> Future:
        fut: Future = Future()
        fut.set_result(fn())
        return fut

    def shutdown(self, timeout: float = 30.0) -> None:
        self.alive = False

    def close(self) -> None:
        self.shutdown()
        self.closed = True


class FakeMetrics:
    """Stands in for ReplicaMetrics (Ray metric objects): records what the replica reports."""

    def __init__(self) -> None:
        self.finished_calls: list[tuple] = []  # positional arguments, status first
        self.finished_kwargs: list[dict] = []
        self.queue: float | None = None
        self.steps: dict | None = None
        self.memory = None

    @property
    def statuses(self) -> list[str]:
        return [c[0] for c in self.finished_calls]

    def finished(self, status: str, *args, **kwargs) -> None:
        inspect.signature(ReplicaMetrics.finished).bind(self, status, *args, **kwargs)  # as the real one takes it
        self.finished_calls.append((status, *args))
        self.finished_kwargs.append(kwargs)

    def set_queue(self, queue: float) -> None:
        self.queue = queue

    def engine_steps(self, totals: dict[str, int]) -> None:
        self.steps = totals

    def set_memory(self, stats) -> None:
        self.memory = stats


class FakeBoard:
    """Stands in for the ingress's CancelBoard actor handle: `await board.watch.remote(ids, timeout_s)`."""

    def __init__(self, cancelled=(), broken: bool = False) -> None:
        self.cancelled, self.broken = set(cancelled), broken
        self.watch = SimpleNamespace(remote=self._watch)

    async def _watch(self, request_ids: list[str], timeout_s: float) -> list[str]:
        if self.broken:
            raise ConnectionError("the board's actor died")
        hits = [r for r in request_ids if r in self.cancelled]
        if not hits:
            await asyncio.sleep(timeout_s)
        return hits


class NoRay:
    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"the replica logic used {self.name}.{attr}: it must run without Ray")


@pytest.fixture(scope="module")
def ray_at_start() -> bool:
    return ray.is_initialized()


@pytest.fixture(autouse=True)
def no_ray(monkeypatch, ray_at_start):
    monkeypatch.setattr(model_server, "ray", NoRay("ray"))
    monkeypatch.setattr(model_server, "serve", NoRay("ray.serve"))


# ---- helpers --------------------------------------------------------------------------------------------------
def replica(replies=(), context: int | None = None, headroom: int = 4, capacity: int = 100_000,
            **settings) -> ModelReplica:
    """A replica over a fake engine; `settings` are ModelConfig fields (e.g. limits={...})."""

    def build(cfg: ModelConfig) -> ReplicaParts:
        bound, default = lookahead_configs(cfg.lookahead, TOKENIZER)
        engine = FakeEngine(bound, headroom, capacity)
        engine.replies.extend(replies)
        return ReplicaParts(engine=engine, tokenizer=TOKENIZER, eos=EOS, context=context, default_la=default,
                            memory_tag=f"{cfg.model}|vocab={len(TOKENIZER)}")

    return ModelReplica(ModelConfig(name="fake", model="fake-model", **settings), build=build, metrics=FakeMetrics())


_ids = itertools.count()


def job(prompt="The capital of France is", **kw) -> Job:
    return Job(request_id=f"cmpl-{next(_ids)}", prompt=prompt, **{"temperature": 0.0, **kw})


def within_timeout_sync(cond) -> bool:
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def within_timeout(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def run(rep: ModelReplica, jobs: list[Job], board=None) -> dict[int, list[Event]]:
    """Every event of the group, by job index."""

    async def go():
        return [e async for batch in rep.generate_group(jobs, board) for e in batch]

    out: dict[int, list[Event]] = {i: [] for i in range(len(jobs))}
    for e in within_timeout(go()):
        out[e.index].append(e)
    return out


def text(events: list[Event]) -> str:
    return "".join(e.text for e in events)


def finish(rep: ModelReplica, j: Job) -> str | None:
    return asyncio.run(rep.finish_reason(j.request_id))


# ---- the deployment -------------------------------------------------------------------------------------------
def test_the_deployment_builds_the_real_engine_unless_given_another():
    assert LookaheadModel.func_or_class is ModelReplica
    params = inspect.signature(ModelReplica).parameters
    assert params["build"].default is build_engine
    assert params["metrics"].default is None


# ---- streaming and finish reasons -----------------------------------------------------------------------------
def test_a_job_streams_its_text_and_ends_with_stop_at_eos():
    rep = replica([Reply("Paris, of course.", chunk=3, cached=8)])
    j = job(max_tokens=64)
    events = run(rep, [j])[0]
    assert events[0].started and not events[0].final
    assert all(not e.final for e in events[:-1]) and events[-1].final
    assert text(events) == "Paris, of course."
    last = events[-1]
    assert last.finish_reason == "stop" and last.error is None
    prompt_tokens = len("The capital of France is")
    assert last.usage.as_dict()["prompt_tokens"] == prompt_tokens and last.usage.completion_tokens == 17
    assert last.usage.cached_tokens == 8
    assert last.lookahead["steps"] == 6 and last.lookahead["mean_accepted_tokens"] == round(17 / 6, 4)
    assert finish(rep, j) == "stop" and rep.completed == 1
    (status, new, _drafts, per_step, ttft, prompt, cached), = rep.metrics.finished_calls
    assert (status, new, prompt, cached) == ("ok", 17, prompt_tokens, 8) and per_step == 17 / 6 and ttft >= 0


def test_what_the_engine_is_asked_for():
    rep = replica()
    run(rep, [job(max_tokens=9, stop=("x",), temperature=0.7, top_p=0.9, top_k=5, seed=3, decoding_length=8)])
    h, = rep.engine.handles
    assert h.prompt == TOKENIZER.encode("The capital of France is")
    assert (h.stop.max_new_tokens, h.stop.eos_token_ids, h.stop.stop_strings) == (9, EOS, ("x",))
    assert (h.sampling.do_sample, h.sampling.temperature, h.sampling.top_p, h.sampling.top_k, h.sampling.seed) == (
        True, 0.7, 0.9, 5, 3)
    assert h.lookahead == rep.default_la.with_overrides(decoding_length=8)
    assert h.lookahead.branch_length == rep.default_la.branch_length
    run(rep, [job(temperature=0.0, lookahead_enabled=False)])
    assert not rep.engine.handles[1].sampling.do_sample and not rep.engine.handles[1].lookahead.enabled


def test_max_tokens_ends_with_length():
    rep = replica([Reply("Paris is the capital.")])
    j = job(max_tokens=5)
    last = run(rep, [j])[0]
    assert text(last) == "Paris" and last[-1].finish_reason == "length"
    assert finish(rep, j) == "length" and rep.completed == 1


def test_a_stop_string_cuts_the_text_before_it_and_ends_with_stop():
    rep = replica([Reply("Paris is big.")])
    j = job(max_tokens=8, stop=(" is",))  # the engine itself would end at "length"
    events = run(rep, [j])[0]
    assert text(events) == "Paris" and events[-1].finish_reason == "stop"
    assert finish(rep, j) == "stop"


def test_an_engine_failure_ends_the_job_with_a_500_and_the_rest_of_the_group_is_served():
    rep = replica([Reply("Par", fail=True), Reply("Rome.")])
    bad, good = job(), job()
    out = run(rep, [bad, good])
    err = out[0][-1].error
    assert (err.status, err.type) == (500, "server_error") and "RuntimeError" in err.message
    assert out[1][-1].finish_reason == "stop" and text(out[1]) == "Rome."
    assert finish(rep, bad) == "error" and finish(rep, good) == "stop"
    assert sorted(rep.metrics.statuses) == ["error", "ok"] and rep.completed == 1


def test_finish_reasons_are_remembered_for_the_most_recent_requests(monkeypatch):
    monkeypatch.setattr(model_server, "RECENT", 2)
    rep = replica()
    jobs = [job() for _ in range(3)]
    for j in jobs:
        run(rep, [j])
    assert [finish(rep, j) for j in jobs] == [None, "stop", "stop"]
    assert finish(rep, job()) is None  # never ran here


# ---- admission ------------------------------------------------------------------------------------------------
def test_a_full_engine_queue_refuses_with_503_overloaded():
    rep = replica([Reply("a", hang=True)] * 3, limits={"max_engine_queue": 2})

    async def go():
        group = rep.generate_group([job(), job(), job()])
        first = await group.__anext__()  # admission's events come first, in one batch
        await group.aclose()
        return first

    first = within_timeout(go())
    assert [e.started for e in first[:2]] == [True, True]
    refused = next(e for e in first if e.index == 2)
    assert refused.final and (refused.error.status, refused.error.type) == (503, "overloaded")
    assert "at capacity" in refused.error.message
    assert len(rep.engine.handles) == 2 and rep.metrics.statuses == ["rejected"]


def test_the_queue_counts_requests_already_in_the_engine():
    rep = replica(limits={"max_engine_queue": 3})
    rep.engine.queued = 3  # other groups' requests
    err = run(rep, [job()])[0][-1].error
    assert err.status == 503 and err.type == "overloaded" and not rep.engine.handles
    rep.engine.queued = 2
    assert run(rep, [job()])[0][-1].finish_reason == "stop"


def test_a_replica_that_lost_its_device_refuses_with_503_and_fails_its_health_check():
    rep = replica()
    rep.check_health()  # healthy: no error
    rep.engine.fatal, rep.engine.alive = RuntimeError("CUDA error: device-side assert"), False
    err = run(rep, [job()])[0][-1].error
    assert (err.status, err.type) == (503, "overloaded") and "being replaced" in err.message
    assert not rep.engine.handles
    with pytest.raises(RuntimeError, match="the engine of model fake has stopped"):
        rep.check_health()


def test_an_engine_that_stops_between_the_check_and_the_request_refuses_with_503():
    rep = replica()

    def stopped(*args, **kwargs):  # the fatal error lands after _admit's check, before add_request
        raise EngineStopped("the engine stopped after a fatal device error")

    rep.engine.add_request = stopped
    err = run(rep, [job()])[0][-1].error
    assert (err.status, err.type) == (503, "overloaded") and "being replaced" in err.message


def test_a_stopped_engine_fails_the_health_check():
    rep = replica()
    rep.engine.alive = False  # the engine thread died without a device error
    with pytest.raises(RuntimeError, match="has stopped"):
        rep.check_health()


@pytest.mark.parametrize("prompt_len, max_tokens, param, says", [
    (40, 30, "max_tokens", "at most 20 new tokens fit"),  # 40 + 30 + 4 > 64: 64 - 40 - 4 fit
    (60, 1, "prompt", "leaves no room to generate"),  # 60 + 1 + 4 > 64
])
def test_a_request_past_the_context_window_is_a_400_naming_the_field(prompt_len, max_tokens, param, says):
    rep = replica(context=64, headroom=4)
    err = run(rep, [job("x" * prompt_len, max_tokens=max_tokens)])[0][-1].error
    assert (err.status, err.param) == (400, param) and says in err.message and "64-token context" in err.message
    assert not rep.engine.handles and rep.metrics.statuses == ["rejected"]


def test_a_request_that_just_fits_the_context_window_runs():
    rep = replica([Reply("x" * 30)], context=64, headroom=4)
    events = run(rep, [job("x" * 40, max_tokens=20)])[0]  # 40 + 20 + 4 = 64
    assert events[-1].finish_reason == "length" and text(events) == "x" * 20


def test_a_request_past_the_kv_budget_is_a_400_naming_the_limit():
    rep = replica(capacity=50, headroom=4)
    err = run(rep, [job("x" * 20, max_tokens=40)])[0][-1].error
    assert (err.status, err.param) == (400, "max_tokens")
    assert "KV budget of 50 tokens" in err.message and "at most 26 new tokens fit" in err.message
    assert not rep.engine.handles
    assert run(rep, [job("x" * 20, max_tokens=26)])[0][-1].finish_reason == "stop"


@pytest.mark.parametrize("prompt, param, says", [
    ("", "prompt", "the prompt is empty"),
    ([], "prompt", "the prompt is empty"),
    ([5, VOCAB], "prompt", f"prompt token ids must be in [0, {VOCAB})"),
    ("x" * 9, "prompt", "this model accepts at most 8"),
])
def test_bad_prompts_are_400s(prompt, param, says):
    rep = replica(limits={"max_prompt_tokens": 8})
    err = run(rep, [job(prompt, max_tokens=4)])[0][-1].error
    assert (err.status, err.param) == (400, param) and says in err.message
    assert not rep.engine.handles


def test_a_setting_the_engine_refuses_is_a_400_and_does_not_stop_the_group():
    rep = replica(lookahead={"decoding_length": 16})
    out = run(rep, [job(decoding_length=17), job()])  # the decoder's bound is 16
    err = out[0][-1].error
    assert (err.status, err.param) == (400, "lookahead") and "decoding_length=17" in err.message
    assert out[1][-1].finish_reason == "stop"


def test_chat_turns_go_through_the_template_with_developer_as_system():
    rep = replica()
    run(rep, [Job(request_id="chatcmpl-1", messages=(("developer", "Be brief."), ("user", "Hi")))])
    assert TOKENIZER.decode(rep.engine.handles[0].prompt) == "<system>Be brief.<user>Hi<assistant>"


def test_a_template_that_rejects_the_turns_is_a_400_naming_messages():
    rep = replica()
    err = run(rep, [Job(request_id="chatcmpl-2", messages=(("user", "a"), ("user", "b")))])[0][-1].error
    assert (err.status, err.param) == (400, "messages") and "must alternate" in err.message


# ---- cancellation ---------------------------------------------------------------------------------------------
def test_a_cancelled_job_stops_its_request_only_and_ends_with_a_503():
    rep = replica([Reply("The longest answer in the group." * 4), Reply("abc", hang=True)])
    stays, leaves = job(max_tokens=1000), job()
    out = run(rep, [stays, leaves], board=FakeBoard(cancelled=[leaves.request_id]))
    err = out[1][-1].error
    assert (err.status, err.type) == (503, "server_error") and "cancelled" in err.message
    assert out[0][-1].finish_reason == "stop" and text(out[0]) == "The longest answer in the group." * 4
    assert finish(rep, leaves) == "cancelled" and finish(rep, stays) == "stop"
    assert rep.engine.handles[1].cancelled and rep.engine.handles[1].seq.finish_reason == "cancelled"
    assert rep.engine.handles[0].seq.finish_reason == "eos"
    assert sorted(rep.metrics.statuses) == ["cancelled", "ok"] and rep.completed == 1


def test_an_unreachable_cancel_board_cancels_the_groups_requests():
    rep = replica([Reply("a", hang=True), Reply("b", hang=True)])
    jobs = [job(), job()]
    out = run(rep, jobs, board=FakeBoard(broken=True))
    assert all(evs[-1].error.status == 503 for evs in out.values())
    assert [finish(rep, j) for j in jobs] == ["cancelled", "cancelled"]


def test_a_caller_that_goes_away_cancels_every_request_of_its_group():
    rep = replica([Reply("a", hang=True), Reply("b", hang=True)])

    async def go():
        group = rep.generate_group([job(), job()])
        seen = []
        while sum(e.started for e in seen) < 2 or not any(e.text for e in seen):
            seen += await group.__anext__()
        await group.aclose()  # the ingress's stream was dropped

    within_timeout(go())
    assert [h.cancelled for h in rep.engine.handles] == [True, True]
    assert rep.engine.active_requests == 0


# ---- stats and the output memory ------------------------------------------------------------------------------
def test_autoscaling_stats_report_the_engine_queue_and_the_metrics_thread_feeds_the_gauges(monkeypatch):
    rep = replica()
    rep.engine.queued = 5
    assert rep.record_autoscaling_stats() == {ENGINE_QUEUE: 5.0}
    # Ray Serve calls record_autoscaling_stats only for autoscaling deployments: the gauges have their own clock
    monkeypatch.setattr(model_server, "METRICS_INTERVAL_S", 0.01)
    stop = threading.Event()
    thread = threading.Thread(target=model_server._report_periodically, args=(weakref.ref(rep), stop))
    thread.start()
    assert within_timeout_sync(lambda: rep.metrics.queue == 5.0)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert rep.metrics.queue == 5.0
    assert rep.metrics.steps == {"drafting": 7, "plain": 2, "held": 1}
    assert rep.metrics.memory.waiting == 5
    stats = asyncio.run(rep.kv_stats())
    assert stats == {**asdict(rep.engine.memory_stats()), "output_memory": asyncio.run(rep.fleet_status()),
                     "output_learning": asdict(rep.engine.backlog.stats), "decode_step": asdict(rep.engine.step_path())}
    assert stats["kv_used_bytes"] == 4096
    assert stats["output_memory"]["shared"] is False  # outside Serve there is no fleet to join
    assert asyncio.run(rep.queue_length()) == 5


def test_the_output_memory_is_saved_and_a_foreign_file_is_not_loaded(tmp_path):
    path = str(tmp_path / "memory.trie")
    rep = replica(lookahead={"memory_path": path})
    try:
        rep.engine.decoder.memory.add_sequence([1, 2, 3, 4])
        nodes = rep.save_memory()
        assert nodes == rep.engine.decoder.memory.node_count > 0
        assert asyncio.run(rep.memory_info()) == {"tag": "fake-model|vocab=128", "nodes": nodes, "path": path}

        again = replica()
        parts = SimpleNamespace(engine=again.engine, tokenizer=TOKENIZER, memory_tag=rep.memory_tag)
        model_server._load_memory(parts, path)
        assert again.engine.decoder.memory.node_count == nodes

        other = replica()
        other.engine.decoder.memory.add_sequence([9, 9])
        model_server._load_memory(SimpleNamespace(engine=other.engine, tokenizer=TOKENIZER,
                                                  memory_tag="another-model|vocab=128"), path)
        assert other.engine.decoder.memory.node_count == 0  # refused, and the memory starts empty
    finally:
        rep._stopping.set()


def test_ray_was_not_started_here(ray_at_start):
    """Run alone (`pytest tests/serve_app/test_model_server.py`), these tests leave Ray uninitialised."""
    if ray_at_start:
        pytest.skip("another module of this session started Ray")
    assert not ray.is_initialized()
