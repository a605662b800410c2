"""A replica's link to its deployment's fleet memory (lookahead/core/fleet_memory.py), held by one Ray actor.

`FleetSync` runs beside a replica's engine. The engine hands it every output
its memory learnt (`Engine.learn_listeners`); every `sync_s` it pushes them as
one batch, pulls what the other replicas learnt since its cursor (or, the
first time, a snapshot of everything), and applies that to the engine's own
memory between two steps. Decoding never waits on it: the engine keeps
drafting from its own memory, and a replica that cannot reach the actor keeps
serving on what it has, retrying every `sync_s` (the outbox is bounded, so an
absent actor costs no memory either). The memory stays within the replica's
configured node bound (`TokenTrie.merge` and `add_sequence` evict).

The actor (`FleetMemory` under `ray.remote`) is detached, one per deployment
and model (its name carries a hash of the memory tag), created by whichever
replica comes first; a killed one is created again, empty, with a new epoch,
by the next replica that syncs, and seeded with the memory of the first replica
that finds it so (every replica still holds what the fleet knew; a replica
started after the restart gets it in the snapshot). Each sync pulls before it
pushes, so a snapshot never holds this replica's own new outputs a second
time. Everything it receives and sends is data only:
batches of token ids and `trie_store`'s checksummed format, never a pickle of
a trie.
"""

import hashlib
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Protocol

from lookahead.core.fleet_memory import FleetMemory, FleetUpdate, decode_batch, encode_batch
from lookahead.core.trie import TokenTrie
from lookahead.core.trie_store import dumps, loads

log = logging.getLogger("ray.serve")

ACTOR_NAME = "LookaheadFleetMemory"
CALL_TIMEOUT_S = 30.0  # one push or pull; a snapshot of a million nodes is ~16 MB


class FleetClient(Protocol):
    """What FleetSync calls: a FleetMemory, in this process (tests) or behind a Ray actor (`RayFleetClient`)."""

    def push(self, tag: str, source: str, batch: bytes) -> int: ...

    def pull(self, tag: str, source: str, epoch: str | None, cursor: int) -> FleetUpdate: ...

    def seed(self, tag: str, source: str, snapshot: bytes, batch: bytes) -> bool: ...


def actor_identity(app: str, deployment: str, tag: str) -> tuple[str, str]:
    """(name, namespace) of a deployment's fleet memory actor: one per app, deployment and memory tag, so a
    redeploy that changes the model under the same name never meets the old model's memory."""
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    return f"{ACTOR_NAME}-{digest}", f"serve::{app}::{deployment}"


class RayFleetClient:
    """The fleet memory actor, got or created on first use and again after a failed call."""

    def __init__(self, name: str, namespace: str, memory_args: dict, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.name, self.namespace, self.memory_args, self.timeout_s = name, namespace, memory_args, timeout_s
        self._actor = None

    def _handle(self):
        import ray

        if self._actor is None:
            # num_cpus=0: the actor only merges token ids, and must place even where replicas hold every CPU.
            self._actor = ray.remote(FleetMemory).options(
                name=self.name, namespace=self.namespace, lifetime="detached", get_if_exists=True, num_cpus=0,
            ).remote(**self.memory_args)
            try:  # Serve kills it on serve.shutdown(), as it does its prefix-tree actor (a private hook)
                from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

                controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
                controller._register_shutdown_cleanup_actor.remote(self._actor)
            except Exception:  # noqa: BLE001 - no controller (a test), or a Ray without the hook
                pass
        return self._actor

    def _call(self, method: str, *args):
        import ray

        try:
            return ray.get(getattr(self._handle(), method).remote(*args), timeout=self.timeout_s)
        except Exception:
            self._actor = None  # dead, or never placed: get or create it again next time
            raise

    def push(self, tag: str, source: str, batch: bytes) -> int:
        return self._call("push", tag, source, batch)

    def pull(self, tag: str, source: str, epoch: str | None, cursor: int) -> FleetUpdate:
        return self._call("pull", tag, source, epoch, cursor)

    def seed(self, tag: str, source: str, snapshot: bytes, batch: bytes) -> bool:
        return self._call("seed", tag, source, snapshot, batch)


@dataclass
class FleetStatus:
    """A replica's view of the fleet memory (`GET /stats`, `output_memory`)."""

    shared: bool  # this replica syncs with a fleet memory
    nodes: int  # in this replica's own memory
    max_nodes: int
    version: int  # the fleet version this replica has caught up to (0: none yet)
    epoch: str | None
    last_sync_s_ago: float | None  # since the last sync that succeeded; None: none has
    last_error: str | None  # of the last sync that failed, cleared by one that succeeds
    pushed_outputs: int  # outputs this replica sent
    applied_batches: int  # other replicas' batches merged here
    snapshots: int  # whole-memory snapshots merged here
    outbox: int  # outputs learnt here, not yet pushed
    seeds: int  # restarted fleet memories this replica's memory seeded


class FleetSync:
    """Pushes an engine's learnt outputs to the fleet memory and merges the others' into its memory."""

    def __init__(self, engine, client: FleetClient, tag: str, source: str, sync_s: float,
                 vocab_size: int | None = None, max_outbox_tokens: int = 1 << 20) -> None:
        self.engine, self.client, self.tag, self.source, self.sync_s = engine, client, tag, source, sync_s
        self.vocab_size, self.max_outbox_tokens = vocab_size, max_outbox_tokens
        self.epoch: str | None = None
        self.cursor = 0
        self._outbox: list[list[int]] = []
        self._outbox_tokens = 0
        self._lock = threading.Lock()  # the outbox: the engine thread appends, the sync thread takes
        self._syncing = threading.Lock()  # one sync at a time (the thread's, or one asked for)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok: float | None = None
        self.last_error: str | None = None
        self.pushed_outputs = self.applied_batches = self.snapshots = self.seeds = 0
        engine.learn_listeners.append(self._learnt)

    def _learnt(self, tokens: list[int]) -> None:
        with self._lock:
            self._outbox.append(list(tokens))
            self._outbox_tokens += len(tokens)
            while self._outbox_tokens > self.max_outbox_tokens and len(self._outbox) > 1:
                self._outbox_tokens -= len(self._outbox.pop(0))  # unreachable for long: the oldest go first

    # ---- one sync --------------------------------------------------------
    def sync(self) -> bool:
        """Pull and apply what is new, then push the outbox; whether it all succeeded. Never raises: a failure is
        logged, kept in `last_error`, and the outbox is kept for the next try."""
        with self._syncing:
            return self._sync()

    def _sync(self) -> bool:
        batch: list[list[int]] = []
        try:
            # Pull, then push: a snapshot (a first join, a restarted memory) then never holds this replica's
            # new outputs, which its memory learnt when they finished; later deltas leave its own batches out.
            update = self.client.pull(self.tag, self.source, self.epoch, self.cursor)
            with self._lock:
                batch, self._outbox, self._outbox_tokens = self._outbox, [], 0
            if self.epoch is not None and update.epoch != self.epoch and self.engine.decoder.memory.node_count:
                self._seed(update.epoch, batch)
                batch = []  # it went with the seed
                update = self._rejoined(update.epoch)
            self._apply(update)
            if batch:
                self.client.push(self.tag, self.source, encode_batch(batch))
                self.pushed_outputs += len(batch)
                batch = []
        except Exception as e:  # noqa: BLE001 - the fleet memory is an optimisation; serving goes on without it
            if batch:
                with self._lock:
                    self._outbox[:0] = batch
                    self._outbox_tokens += sum(len(s) for s in batch)
            if self.last_error is None:
                log.warning("fleet memory unreachable; serving on this replica's own memory: %s: %s",
                            type(e).__name__, e)
            self.last_error = f"{type(e).__name__}: {e}"
            return False
        if self.last_error is not None:
            log.info("fleet memory reachable again (epoch %s, version %d)", self.epoch, self.cursor)
        self.last_error = None
        self._last_ok = time.monotonic()
        return True

    def _seed(self, epoch: str, batch: list[list[int]]) -> None:
        """The fleet memory restarted (`epoch` is its new life, begun empty): offer this replica's memory as its
        seed, with the outputs finished since the last sync (the memory holds them; the others get them)."""
        memory = self.engine.decoder.memory
        data = self.engine.call_between_steps(lambda: dumps(memory, self.tag)).result(timeout=CALL_TIMEOUT_S)
        if self.client.seed(self.tag, self.source, data, encode_batch(batch) if batch else b""):
            self.seeds += 1
            log.info("fleet memory restarted (epoch %s); seeded it with this replica's %d nodes", epoch,
                     memory.node_count)
        self.pushed_outputs += len(batch)

    def _rejoined(self, epoch: str) -> FleetUpdate:
        """What to apply after seeding: only the batches the new life logged, never its snapshot. That holds this
        replica's seed, or another replica's, which is largely what this one holds already, so merging it would
        count the fleet's knowledge twice. If the log no longer reaches back to the restart, the new life is
        joined as it stands; if it restarted once more meanwhile, the next sync seeds that one."""
        update = self.client.pull(self.tag, self.source, epoch, 0)
        if update.epoch != epoch:
            return FleetUpdate(epoch, 0)
        return FleetUpdate(epoch, update.version) if update.snapshot is not None else update

    def _apply(self, update: FleetUpdate) -> None:
        memory = self.engine.decoder.memory
        if update.snapshot is not None:
            # Parsed here, off the engine thread; only the merge runs between steps.
            fresh = TokenTrie(memory.ngram_length, memory.stop_words)
            loads(update.snapshot, fresh, self.tag, self.vocab_size, name="fleet snapshot")  # TrieFileError
            self.engine.call_between_steps(lambda: memory.merge(fresh)).result(timeout=CALL_TIMEOUT_S)
            self.snapshots += 1
        elif update.batches:
            sequences = [s for b in update.batches for s in decode_batch(b, self.vocab_size)]

            def learn() -> None:
                for seq in sequences:
                    memory.add_sequence(seq)

            self.engine.call_between_steps(learn).result(timeout=CALL_TIMEOUT_S)
            self.applied_batches += len(update.batches)
        self.epoch, self.cursor = update.epoch, update.version

    # ---- in the background -----------------------------------------------
    def start(self) -> "FleetSync":
        self._thread = threading.Thread(target=self._run, name="fleet-memory", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.sync_s):
            self.sync()

    def close(self, final_push: bool = True) -> None:
        """Stop syncing; with `final_push`, send what is still in the outbox (once, best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S)
        if final_push and self._outbox:
            with self._lock:
                batch, self._outbox, self._outbox_tokens = self._outbox, [], 0
            try:
                self.client.push(self.tag, self.source, encode_batch(batch))
                self.pushed_outputs += len(batch)
            except Exception as e:  # noqa: BLE001 - shutting down; the outputs are lost to the fleet only
                log.warning("fleet memory: %d outputs not pushed at shutdown: %s", len(batch), e)

    def status(self) -> FleetStatus:
        memory = self.engine.decoder.memory
        ago = None if self._last_ok is None else round(time.monotonic() - self._last_ok, 3)
        return FleetStatus(True, memory.node_count, memory.max_nodes or 0, self.cursor, self.epoch, ago,
                           self.last_error, self.pushed_outputs, self.applied_batches, self.snapshots,
                           len(self._outbox), self.seeds)


def local_status(engine) -> dict:
    """`FleetStatus` of a replica that shares nothing (lookahead.shared_memory off, or outside Serve)."""
    memory = engine.decoder.memory
    return asdict(FleetStatus(False, memory.node_count, memory.max_nodes or 0, 0, None, None, None, 0, 0, 0, 0, 0))
