"""The model deployment: one replica holds one model and one lookahead engine.

GPU configs reserve `num_gpus: 1` per replica, so there is one replica per
GPU. The ingress sends groups of jobs in single streaming calls
(`generate_group`); the replica adds each job to its engine, whose continuous
batch merges them with every other group in flight, and streams back lists of
events as tokens come out. The engine's forwards run in its own thread, so
the replica's event loop only tokenizes, routes events and watches the cancel
board. The replica also reports its engine's queue for autoscaling
(`record_autoscaling_stats`) and fails its health check if the engine died.

Two halves: `build_engine` turns a `ModelConfig` into `ReplicaParts` (loads
the weights and tokenizer, starts the engine, loads the saved output memory);
`ModelReplica` is the replica logic over those parts (admission, streaming,
cancellation, finish reasons, health, metrics). `LookaheadModel`, the
deployment `serve_app.builder` binds, is `ModelReplica` under Ray Serve: with
just a config it builds the real parts; a test passes its own `build` (a fake
engine and tokenizer) and `metrics`, and runs the replica logic with no Ray
and no weights.
"""

import asyncio
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

import ray
import torch
from ray import serve

from lookahead.config import LookaheadConfig
from lookahead.engine.engine import Engine, EngineStopped, RequestHandle
from lookahead.engine.generate import LookaheadDecoder
from lookahead.core import heap
from lookahead.model.models import encode_chat, load_model
from lookahead.model.runner import ModelRunner
from lookahead.model.sampling import SamplingParams
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.engine.sequence import StopCriteria
from lookahead.core.trie_store import TrieFileError, load as load_memory, save as save_memory

from .autoscaling import ENGINE_QUEUE
from .config import LookaheadSettings, ModelConfig
from .detokenize import Detokenizer
from .admission import check_budget, check_context
from .jobs import Event, Job, JobError, Rejected, Usage
from .fleet import FleetSync, RayFleetClient, actor_identity, local_status
from .metrics import ReplicaMetrics

log = logging.getLogger("ray.serve")

WATCH_S = 5.0  # long-poll period on the cancel board
RECENT = 4096  # finished request ids remembered with their finish reason
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled", "error": "error"}


def _placement_memory(max_memory: dict | None) -> dict | None:
    return None if max_memory is None else {(int(k) if k.isdigit() else k): v for k, v in max_memory.items()}


@dataclass(frozen=True)
class ReplicaLoad:
    actor: str  # the replica's Ray actor name (namespace "serve")
    node_id: str  # the Ray node it runs on
    engine_queue: int  # requests waiting + running in its engine now
    completed: int  # requests it generated to their end since it started
    new_tokens: int = 0  # tokens those requests generated, summed
    steps: int = 0  # decode steps they took, summed (new_tokens / steps: this replica's tokens a step)


@dataclass(frozen=True)
class ReplicaParts:
    """What a replica serves with; `build_engine` makes the real ones from a config, a test makes fakes."""

    engine: Engine  # started; the replica adds requests to it and shuts it down
    tokenizer: Any  # a Hugging Face tokenizer: called, decoded, its chat template applied, len() = vocabulary
    eos: frozenset[int]  # token ids that end a generation
    context: int | None  # the model's context window in tokens (None: no limit); see admission.check_context
    default_la: LookaheadConfig  # a request's lookahead settings before its own overrides
    memory_tag: str  # what a saved output memory must carry to be loaded into this model's


def lookahead_configs(la: LookaheadSettings, tokenizer) -> tuple[LookaheadConfig, LookaheadConfig]:
    """(the decoder's bounds, a request's default): the decoder's limits are the per-request bounds; a request
    without overrides gets the default. Stop words become every token id of each."""
    stop_words = frozenset(t for w in la.stop_words for t in tokenizer.encode(w, add_special_tokens=False))
    bound = LookaheadConfig(enabled=la.enabled, decoding_length=la.decoding_length_bound,
                            branch_length=la.branch_length_bound, decoding_mode=la.decoding_mode,
                            stop_words=stop_words, adaptive=la.adaptive, memory_max_nodes=la.memory_max_nodes)
    return bound, bound.with_overrides(decoding_length=la.decoding_length, branch_length=la.branch_length)


def build_engine(cfg: ModelConfig) -> ReplicaParts:
    """The real parts of a replica: the model and tokenizer loaded, the engine built and started, the saved
    output memory loaded (a corrupt or foreign file is logged and skipped), and all of it settled out of the
    garbage collector's full passes (lookahead/core/heap.py: for a process that keeps what it loaded)."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    lm = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, trust_remote_code=cfg.trust_remote_code,
                    device_map=cfg.device_map, max_memory=_placement_memory(cfg.max_memory))
    runner = ModelRunner(lm.model, exact=None if cfg.lookahead.exact else False)  # None: half precision only
    runner.check_tree_masks()
    bound, default_la = lookahead_configs(cfg.lookahead, lm.tokenizer)
    decoder = LookaheadDecoder(runner, bound, lm.tokenizer, eos_token_ids=lm.eos_token_ids)
    b, mem = cfg.batching, cfg.memory
    engine = Engine(decoder, SchedulerConfig(max_batch_size=b.max_batch_size,
                                             max_tokens_per_step=b.max_tokens_per_step,
                                             prefill_chunk=b.prefill_chunk,
                                             prefix_cache_mb=b.prefix_cache_mb,
                                             ragged=b.ragged, kv_cache_gb=mem.kv_cache_gb,
                                             gpu_memory_utilization=mem.gpu_memory_utilization)).start()
    led = engine.ledger
    log.info("model %s: KV budget %d tokens = %d bytes (%s)", cfg.name, led.token_capacity,
             led.capacity_bytes, led.budget.source)
    parts = ReplicaParts(engine=engine, tokenizer=lm.tokenizer, eos=frozenset(lm.eos_token_ids),
                         context=runner.context_length,  # prompt + max_tokens + draft headroom must fit
                         default_la=default_la, memory_tag=f"{cfg.model}|vocab={len(lm.tokenizer)}")
    if cfg.lookahead.memory_path:
        _load_memory(parts, cfg.lookahead.memory_path)
    frozen, collect_s = heap.settle()  # the model and the loaded memory leave the collector's full passes
    log.info("model %s ready (%s, pid %d); %d objects settled out of the collector's passes (%.0f ms)",
             cfg.name, lm.path, os.getpid(), frozen, collect_s * 1e3)
    return parts


def _load_memory(parts: ReplicaParts, path: str) -> None:
    if not os.path.exists(path):
        log.info("no saved output memory at %s; starting empty", path)
        return
    memory = parts.engine.decoder.memory
    try:
        n = load_memory(path, memory, parts.memory_tag, vocab_size=len(parts.tokenizer))
        log.info("output memory loaded from %s: %d nodes", path, n)
    except (TrieFileError, OSError) as e:
        memory.clear()
        log.error("output memory not loaded, starting empty: %s", e)


def connect_fleet(cfg: ModelConfig, parts: ReplicaParts) -> FleetSync | None:
    """Join the deployment's fleet memory (serve_app/fleet.py): one sync before the first request, so a new
    replica starts from what the others learnt, then one every `shared_memory_sync_s`. None where sharing is off
    or there is no Serve replica around this one (a test's)."""
    if not cfg.lookahead.shared_memory:
        return None
    try:
        ctx = serve.get_replica_context()
    except Exception:  # noqa: BLE001 - not inside a Serve replica
        return None
    memory, vocab = parts.engine.decoder.memory, len(parts.tokenizer)
    name, namespace = actor_identity(ctx.app_name, ctx.deployment, parts.memory_tag)
    client = RayFleetClient(name, namespace, {
        "ngram_length": memory.ngram_length, "tag": parts.memory_tag, "max_nodes": memory.max_nodes,
        "stop_words": sorted(memory.stop_words), "vocab_size": vocab})
    sync = FleetSync(parts.engine, client, parts.memory_tag, ctx.replica_tag, cfg.lookahead.shared_memory_sync_s,
                     vocab_size=vocab)
    if sync.sync():
        log.info("model %s: fleet memory %s joined at version %d; own memory %d nodes", cfg.name, name,
                 sync.cursor, memory.node_count)
    return sync.start()


METRICS_INTERVAL_S = 5.0  # how often a replica refreshes its gauges (Prometheus scrapes every 10-60 s)


def _report_periodically(ref: "weakref.ref[ModelReplica]", stop: threading.Event) -> None:
    """Refresh the replica's metrics until it stops or is collected (a weak reference: this thread does not keep
    a discarded replica, a test's for one, alive)."""
    while not stop.wait(METRICS_INTERVAL_S):
        replica = ref()
        if replica is None:
            return
        try:
            replica.report_metrics()
        except Exception:  # noqa: BLE001 - a failed refresh must not take the replica down
            log.exception("refreshing the replica's metrics failed")
        del replica


class ModelReplica:
    """One replica's logic over its engine. Ray Serve runs it as `LookaheadModel(cfg)`, which builds the real
    parts; `build` and `metrics` are for tests that bind a fake engine where a real model is beside the point."""

    def __init__(self, cfg: ModelConfig, build: Callable[[ModelConfig], ReplicaParts] = build_engine,
                 metrics: ReplicaMetrics | None = None,
                 fleet: Callable[[ModelConfig, ReplicaParts], FleetSync | None] = connect_fleet) -> None:
        if isinstance(cfg, dict):
            cfg = ModelConfig.model_validate(cfg)
        self.cfg = cfg
        parts = build(cfg)
        self.engine = parts.engine
        self.tokenizer = parts.tokenizer
        self.eos = parts.eos
        self.context = parts.context
        self.default_la = parts.default_la
        self.memory_tag = parts.memory_tag
        self.fleet = fleet(cfg, parts)
        self.metrics = metrics if metrics is not None else ReplicaMetrics(cfg.name)
        self.recent: OrderedDict[str, str] = OrderedDict()  # request id -> finish reason
        self.completed = 0  # requests this replica generated to their end (stop or length)
        self.completed_tokens = self.completed_steps = 0  # their tokens and decode steps, summed
        self._stopping = threading.Event()
        if cfg.lookahead.memory_path:
            threading.Thread(target=self._save_periodically, name="memory-saver", daemon=True).start()
        # The engine's gauges and step counts, refreshed on a clock of their own: Ray Serve calls
        # record_autoscaling_stats only for autoscaling deployments, and a fixed-size one must export them too.
        threading.Thread(target=_report_periodically, args=(weakref.ref(self), self._stopping),
                         name="metrics", daemon=True).start()

    # ---- Ray Serve hooks ---------------------------------------------------
    def record_autoscaling_stats(self) -> dict[str, float]:
        return {ENGINE_QUEUE: float(self.engine.active_requests)}

    def report_metrics(self) -> None:
        """The engine's queue, decode steps by kind and KV memory into the Prometheus metrics (the metrics
        thread's job: the one writer of the step counts' running totals)."""
        self.metrics.set_queue(float(self.engine.active_requests))
        self.metrics.engine_steps(dict(self.engine.decode_steps))
        self.metrics.set_memory(self.engine.memory_stats())

    def check_health(self) -> None:
        if not self.engine.alive:
            raise RuntimeError(f"the engine of model {self.cfg.name} has stopped")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            self._stopping.set()
            engine.shutdown(timeout=5)
            if getattr(self, "fleet", None) is not None:
                self.fleet.close()  # what finished since the last sync still reaches the other replicas
            if self.cfg.lookahead.memory_path:
                self.save_memory()
            engine.close()  # the KV pool goes back now, not when the replica object is collected

    # ---- the output memory on disk ------------------------------------------
    def save_memory(self) -> int:
        """Write the output memory to `memory_path` (between engine steps); returns the nodes written."""
        mem, path, tag = self.engine.decoder.memory, self.cfg.lookahead.memory_path, self.memory_tag
        return self.engine.call_between_steps(lambda: save_memory(mem, path, tag)).result(timeout=120)

    def _save_periodically(self) -> None:
        while not self._stopping.wait(self.cfg.lookahead.memory_save_interval_s):
            try:
                self.save_memory()
            except Exception:  # noqa: BLE001 - a failed save must not take the replica down
                log.exception("saving the output memory failed")

    async def rss_bytes(self) -> int:
        """This replica's resident memory (for soak and burst checks)."""
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    async def memory_nodes(self) -> int:
        return self.engine.decoder.memory.node_count

    async def memory_info(self) -> dict:
        return {"tag": self.memory_tag, "nodes": self.engine.decoder.memory.node_count,
                "path": self.cfg.lookahead.memory_path}

    async def fleet_status(self) -> dict:
        """The output memory: its size, and the fleet version and last sync where it is shared."""
        return asdict(self.fleet.status()) if self.fleet is not None else local_status(self.engine)

    async def sync_fleet(self) -> dict:
        """Sync with the fleet memory now (tests, benchmarks); the status after, with this replica's actor name."""
        if self.fleet is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.fleet.sync)
        return {"replica": ray.get_runtime_context().get_actor_name(), **await self.fleet_status()}

    async def kv_stats(self) -> dict:
        """This replica's KV memory and queue, and its output memory (`GET /stats`); the Prometheus gauges get
        the same values."""
        st = self.engine.memory_stats()
        self.metrics.set_memory(st)
        return {**asdict(st), "output_memory": await self.fleet_status(),
                "output_learning": asdict(self.engine.backlog.stats),
                "decode_step": asdict(self.engine.step_path())}

    # ---- requests ----------------------------------------------------------
    async def queue_length(self) -> int:
        return self.engine.active_requests

    async def replica_load(self) -> ReplicaLoad:
        """Where this replica runs and what it holds: for placement and fault checks across replicas and nodes."""
        ctx = ray.get_runtime_context()
        return ReplicaLoad(ctx.get_actor_name(), ctx.get_node_id(), self.engine.active_requests, self.completed,
                           self.completed_tokens, self.completed_steps)

    async def served(self) -> tuple[str, list[str]]:
        """This replica's actor name and the ids of the requests it finished lately (up to RECENT), oldest first:
        which replica ran what, for benches and placement checks."""
        return ray.get_runtime_context().get_actor_name(), list(self.recent)

    async def finish_reason(self, request_id: str) -> str | None:
        """How a recent request ended ("stop", "length", "cancelled", "error"), if this replica ran it."""
        return self.recent.get(request_id)

    def _remember(self, request_id: str, reason: str) -> None:
        self.recent[request_id] = reason
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)

    async def generate_group(self, jobs: list[Job], board=None) -> AsyncIterator[list[Event]]:
        """Run a group of jobs in the engine; yields lists of events (each tagged with its job's index)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        handles: dict[str, RequestHandle] = {}
        pumps = []
        for i, job in enumerate(jobs):
            try:
                handle = self._admit(job, loop)
            except ValueError as e:  # a setting the engine refused (the ingress checks bounds first)
                self.metrics.finished("rejected")
                events.put_nowait(Event(i, error=JobError(400, str(e), "lookahead")))
                continue
            except Rejected as e:
                self.metrics.finished("rejected")
                events.put_nowait(Event(i, error=e.error))
                continue
            handles[job.request_id] = handle
            events.put_nowait(Event(i, started=True))
            pumps.append(asyncio.ensure_future(self._pump(i, job, handle, events)))
        watcher = asyncio.ensure_future(self._watch(board, handles)) if board is not None and handles else None
        left = len(jobs)
        try:
            while left:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                left -= sum(e.final for e in batch)
                yield batch
        finally:  # normal end, or the caller went away: nothing of this group may keep running
            for h in handles.values():
                h.cancel()
            for task in pumps + ([watcher] if watcher else []):
                task.cancel()

    def _admit(self, job: Job, loop) -> RequestHandle:
        if self.engine.fatal is not None:  # the health check fails too: Ray replaces this replica
            raise self._device_lost()
        if self.engine.active_requests >= self.cfg.limits.max_engine_queue:
            raise Rejected(JobError(503, f"model {self.cfg.name} is at capacity; retry later", type="overloaded"))
        ids = self._encode(job)
        if len(ids) > self.cfg.limits.max_prompt_tokens:
            param = "messages" if job.messages is not None else "prompt"
            raise Rejected(JobError(400, f"the prompt has {len(ids)} tokens; this model accepts at most "
                                        f"{self.cfg.limits.max_prompt_tokens}", param))
        if not ids:
            raise Rejected(JobError(400, "the prompt is empty", "prompt"))
        check_context(len(ids), job, self.engine.headroom, self.context)
        check_budget(len(ids), job, self.engine.headroom, self.engine.ledger.token_capacity)
        la = self.default_la.with_overrides(enabled=job.lookahead_enabled, decoding_length=job.decoding_length,
                                            branch_length=job.branch_length)
        sampling = SamplingParams(do_sample=job.temperature > 0, temperature=job.temperature or 1.0,
                                  top_p=job.top_p, top_k=max(job.top_k, 0),
                                  repetition_penalty=job.repetition_penalty, seed=job.seed)
        stop = StopCriteria(job.max_tokens, self.eos, job.stop)
        try:
            return self.engine.add_request(ids, loop=loop, stop=stop, sampling=sampling, lookahead=la)
        except EngineStopped:  # a fatal device error between the check above and here
            raise self._device_lost() from None

    def _device_lost(self) -> Rejected:
        return Rejected(JobError(503, f"model {self.cfg.name}'s replica lost its device and is being replaced; "
                                      f"retry", type="overloaded"))

    def _encode(self, job: Job) -> list[int]:
        if job.messages is not None:
            turns = [{"role": "system" if r == "developer" else r, "content": t} for r, t in job.messages]
            try:
                return encode_chat(self.tokenizer, turns)
            except Exception as e:  # e.g. a template that rejects a role order
                raise Rejected(JobError(400, f"the chat template rejected the messages: {e}", "messages")) from e
        if isinstance(job.prompt, list):
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in job.prompt):
                raise Rejected(JobError(400, f"prompt token ids must be in [0, {vocab})", "prompt"))
            return list(job.prompt)
        return self.tokenizer(job.prompt)["input_ids"]

    async def _pump(self, index: int, job: Job, handle: RequestHandle, events: asyncio.Queue) -> None:
        detok = Detokenizer(self.tokenizer, job.stop)
        t0 = time.perf_counter()
        first: float | None = None
        try:
            async for tokens in handle.stream():
                if first is None:
                    first = time.perf_counter() - t0
                text = detok.push(tokens)
                if text:
                    events.put_nowait(Event(index, text=text))
        except Exception as e:  # the engine failed this request
            log.exception("request %s failed in the engine", job.request_id)
            self.metrics.finished("error")
            self._remember(job.request_id, "error")
            events.put_nowait(Event(index, error=JobError(500, f"generation failed: {type(e).__name__}",
                                                          type="server_error")))
            return
        gen = handle.seq.result()
        st = gen.stats
        reason = "stop" if detok.stopped else FINISH.get(gen.finish_reason, gen.finish_reason)
        tail = detok.finish()
        self._remember(job.request_id, reason)
        if reason in ("stop", "length"):
            self.completed += 1
            self.completed_tokens += st.new_tokens
            self.completed_steps += st.steps
        self.metrics.finished("cancelled" if reason == "cancelled" else "ok", st.new_tokens, st.draft_tokens,
                              st.mean_accepted, first, st.prompt_tokens, st.cached_prompt_tokens,
                              accepted_draft_tokens=st.accepted_drafts)
        if reason == "cancelled":  # meant for a client that left; should it still be there, a cut text is no answer
            events.put_nowait(Event(index, error=JobError(503, "the request was cancelled before it finished; retry",
                                                          type="server_error")))
            return
        events.put_nowait(Event(index, text=tail, finish_reason=reason,
                                usage=Usage(st.prompt_tokens, st.new_tokens, st.cached_prompt_tokens), lookahead=lookahead_stats(st)))

    async def _watch(self, board, handles: dict[str, RequestHandle]) -> None:
        """Cancel this group's requests that their clients gave up on."""
        pending = dict(handles)
        while pending:
            ids = [r for r, h in pending.items() if not h.seq.finished]
            if not ids:
                return
            try:
                cancelled = await board.watch.remote(ids, WATCH_S)
            except Exception:  # the board's ingress died; its clients are gone too
                log.warning("cancel board unreachable; cancelling %d requests", len(ids))
                cancelled = ids
            for rid in cancelled:
                log.info("cancelling %s: its client went away", rid)
                pending.pop(rid).cancel()


# The deployment `serve_app.builder` binds (`.bind(cfg)`: the real engine; `.bind(cfg, build)`: another).
LookaheadModel = serve.deployment(ModelReplica, name="LookaheadModel")


def lookahead_stats(st) -> dict:
    return {"steps": st.steps, "mean_accepted_tokens": round(st.mean_accepted, 4),
            "draft_tokens": st.draft_tokens, "accepted_draft_tokens": st.accepted_drafts}
