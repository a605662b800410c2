"""Finished outputs waiting to go into the output memory, learnt while the device runs a step.

Learning an output is Python over a trie: every token adds a node or a count on up to `branch_length + 1`
n-gram paths, 3-4 us a token on recorded SmolLM2 outputs on the 2-core dev VM (0.2-0.5 ms an output,
`benchmarks/learn_cost.py`; ~4 ms for a 1,000-token output). Done the moment a request finishes, as it was, it
stalls the engine thread between two steps; at 32 rows a request finishes every few steps, and on a GPU whose
step costs a few milliseconds the device idles through it.

Nothing in the next step needs it first: the memory only proposes drafts, and drafts never change what is
emitted. So on a device that runs queued work while the host goes on (CUDA), the engine launches the step's
forward, then learns from this backlog, one chunk of an output at a time, for as long as the device is still
busy, and only then reads the step's tokens back: the learning fills time the host would spend waiting.
Where the device runs work as it is queued (the CPU) there is no such time, and the backlog is learnt at once,
as before.

A chunk extends the trie from where the output's last chunk stopped (`TokenTrie.extend`), so an output
learnt in chunks counts every n-gram once, as `add_sequence` does; only eviction can fall between chunks. The
backlog never holds more than `max_outputs` outputs: past that the oldest are learnt at once, so the memory
lags by at most one batch's worth of outputs. It is also learnt whole whenever the engine is idle or runs a
call between steps (saving the memory, a fleet seed), so what those see is complete.

Pure Python; no torch.
"""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from lookahead.core.trie import TokenTrie

CHUNK_TOKENS = 32  # tokens learnt between two looks at the device: ~0.1 ms here, the most a look can overrun by


@dataclass
class BacklogStats:
    """Tokens of finished outputs learnt into the memory, by where the time came from."""

    in_shadow: int = 0  # while the device ran a step (hidden)
    at_once: int = 0  # on the engine thread's own time (a synchronous device, the bound, an idle engine)
    in_shadow_s: float = 0.0  # the time each took
    at_once_s: float = 0.0
    pending: int = 0  # outputs waiting (filled in by `LearnBacklog.stats`)


class LearnBacklog:
    """Outputs queued for the memory (`add_sequence`, as the memory itself takes them), learnt by `run` while
    the device is busy and by `drain` otherwise."""

    def __init__(self, memory: TokenTrie, deferred: bool, max_outputs: int) -> None:
        """`deferred`: hold outputs for the device's shadow (an asynchronous device); False learns each at once."""
        self.memory = memory
        self.deferred = deferred
        self.max_outputs = max_outputs
        self._queue: deque[list] = deque()  # [tokens, learnt so far], oldest first
        self._learnt = BacklogStats()  # the counts so far

    @property
    def stats(self) -> BacklogStats:
        return replace(self._learnt, pending=len(self._queue))

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def pending_tokens(self) -> int:
        return sum(len(tokens) - done for tokens, done in self._queue)

    def add_sequence(self, tokens: list[int]) -> None:
        self._queue.append([tokens, 0])
        limit = self.max_outputs if self.deferred else 0
        while len(self._queue) > limit:
            self._learn_oldest(None, shadow=False)

    def run(self, busy: Callable[[], bool]) -> None:
        """Learn chunk by chunk while `busy()` (the device still runs the step just launched)."""
        while self._queue and busy():
            self._learn_oldest(CHUNK_TOKENS, shadow=True)

    def drain(self) -> None:
        while self._queue:
            self._learn_oldest(None, shadow=False)

    def _learn_oldest(self, chunk: int | None, shadow: bool) -> None:
        item = self._queue[0]
        tokens, done = item
        end = len(tokens) if chunk is None else min(len(tokens), done + chunk)
        t0 = time.perf_counter()
        self.memory.extend(tokens, done, end)
        took = time.perf_counter() - t0
        item[1] = end
        st = self._learnt
        if shadow:
            st.in_shadow, st.in_shadow_s = st.in_shadow + end - done, st.in_shadow_s + took
        else:
            st.at_once, st.at_once_s = st.at_once + end - done, st.at_once_s + took
        if end == len(tokens):
            self._queue.popleft()
