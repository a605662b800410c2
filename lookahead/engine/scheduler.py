"""Who runs this step: admission, chunked prefill, and the running batch's rows.

Torch-free bookkeeping. Requests wait in FIFO order; one at a time is
prefilled, at most `prefill_chunk` prompt tokens per engine step, so a long
prompt delays the running requests by one chunk's forward per step rather
than by its whole prefill. A prefilled request joins the running batch at the
next step if a row is free (`max_batch_size`). Row b of the batch KV cache
belongs to `running[b]`; when a request leaves, the last row moves into its
place (the cache does the same), so rows stay contiguous.

Admission by memory: with a `KVLedger`, the head of the queue starts its
prefill only once its worst case (prompt + max_new_tokens + the tree
headroom) is reserved; until then it and everyone behind it wait (FIFO, so a
long request is never starved by short ones). Before it waits, the prefix
cache gives up its entries (`make_room`), least recently used first: running
requests come before kept prompts. The reservation is the request's range of
the KV pool; it is released when the request leaves.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lookahead.model.kv_memory import KVLedger

if TYPE_CHECKING:  # the scheduler only holds them; sequence.py imports torch
    from lookahead.engine.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 16  # running requests in one forward
    max_tokens_per_step: int = 256  # tokens in one decode forward: rows x tree width
    prefill_chunk: int = 512  # prompt tokens prefilled per step
    prefix_cache_mb: int = 256  # KV of recent prompts kept for reuse by prompts that start alike (0 = off)
    ragged: bool = True  # each row sends only its own tree tokens (when the model allows); False = pad to one width
    kv_cache_gb: float | None = None  # the KV budget (pool + prefix cache); None: from the device (kv_memory.py)
    gpu_memory_utilization: float = 0.9  # on CUDA, the share of the device this replica may fill

    def __post_init__(self) -> None:
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ValueError(f"invalid engine setting kv_cache_gb={self.kv_cache_gb!r}: must be > 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"invalid engine setting gpu_memory_utilization={self.gpu_memory_utilization!r}: "
                             "must be in (0, 1]")
        for name in ("max_batch_size", "max_tokens_per_step", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"invalid engine setting {name}={getattr(self, name)!r}: must be >= 1")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"invalid engine setting prefix_cache_mb={self.prefix_cache_mb!r}: must be >= 0")
        if self.max_tokens_per_step < self.max_batch_size:
            raise ValueError(
                f"max_tokens_per_step={self.max_tokens_per_step} must be >= max_batch_size={self.max_batch_size}"
            )


@dataclass
class Prefill:
    seq: "Sequence"
    done: int = 0  # prompt tokens already in its cache (all but the last, the first root, get prefilled)

    @property
    def total(self) -> int:
        return len(self.seq.ctx) - 1

    @property
    def finished(self) -> bool:
        return self.done >= self.total


@dataclass
class Scheduler:
    config: SchedulerConfig
    waiting: deque = field(default_factory=deque)  # of Sequence
    prefilling: Prefill | None = None
    running: list["Sequence"] = field(default_factory=list)  # index = batch row
    ledger: KVLedger | None = None  # admission by memory; None: rows are the only limit
    headroom: int = 0  # KV entries a verification writes past a row's committed context
    make_room: Callable[[], bool] | None = None  # frees something evictable (the prefix cache's oldest); False: none

    def worst_case(self, seq: "Sequence") -> int:
        """The most KV entries this request's row can ever hold."""
        return len(seq.prompt) + seq.stop.max_new_tokens + self.headroom

    def add(self, seq: "Sequence") -> None:
        self.waiting.append(seq)

    def next_prefill_chunk(self) -> tuple[Prefill, int, int] | None:
        """(prefill, start, end) of the prompt tokens to prefill this step, or None."""
        if self.prefilling is None:
            if not self.waiting or len(self.running) >= self.config.max_batch_size:
                return None
            head = self.waiting[0]
            if self.ledger is not None:
                worst = self.worst_case(head)
                while not self.ledger.can_reserve(worst) and self.make_room is not None and self.make_room():
                    pass
                if not self.ledger.can_reserve(worst):
                    return None  # waits for running requests to free their blocks
                self.ledger.reserve(id(head), worst)
            self.prefilling = Prefill(self.waiting.popleft())
        p = self.prefilling
        end = min(p.total, p.done + self.config.prefill_chunk)
        return p, p.done, end

    def can_admit(self) -> bool:
        return (
            self.prefilling is not None
            and self.prefilling.finished
            and len(self.running) < self.config.max_batch_size
        )

    def admit(self) -> "Sequence":
        seq = self.prefilling.seq
        self.prefilling = None
        self.running.append(seq)
        return seq

    def release(self, seq: "Sequence") -> None:
        """The request left (finished, cancelled or failed): its KV reservation is free again."""
        if self.ledger is not None:
            self.ledger.release(id(seq))

    def remove_row(self, row: int) -> None:
        """Mirror of BatchKVCache.release: the last row moves into `row`."""
        self.release(self.running[row])
        last = self.running.pop()
        if row < len(self.running):
            self.running[row] = last

    def idle(self) -> bool:
        return not self.waiting and self.prefilling is None and not self.running
