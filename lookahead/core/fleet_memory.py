"""The fleet memory: one output memory for all the replicas of a deployment, bounded and versioned.

Each replica drafts from its own output memory (`trie.py`). Alone, a replica
started for a burst begins cold, and N replicas need N times the traffic to
learn what one would. The fleet memory joins them: replicas push what they
learn and pull what the others learnt, and a new replica starts from all of it.

Vocabulary:
- batch: the outputs a replica finished since its last push, as token
  sequences, in a data-only encoding (`encode_batch`; never a pickle).
- version: how many batches the fleet memory has merged. A replica's cursor
  is the version it has caught up to.
- epoch: a random id of one life of the fleet memory. A replica whose epoch
  differs (the memory was restarted, and its versions count from 0 again)
  starts over from a snapshot.
- delta: the batches after a cursor, less the puller's own (it learnt those
  itself when its requests finished).
- snapshot: the whole merged trie in `trie_store`'s checksummed format, for a
  replica whose cursor is older than the log of recent batches (a new one).
- seed: a replica's whole memory, offered when it finds the fleet memory
  restarted (a new epoch: a new life begins empty, while every replica still
  holds what the fleet knew). The first seed of an epoch is merged and no
  other: one replica's memory carries what they all shared, and a second
  would count it twice. A seed is not logged, so no replica that holds it
  gets it back as a delta; a new replica gets it in the snapshot.

Bounds: the merged trie is bounded by node count like a replica's own; the log
of recent batches by tokens. A replica that falls further behind than the log
reaches takes a snapshot. Pure Python; no torch.
"""

import uuid
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lookahead.core.trie import TokenTrie
from lookahead.core.trie_store import dumps, from_le, loads, to_le

BATCH_MAGIC = b"LABATCH1"


class BatchError(ValueError):
    pass


def encode_batch(sequences: Sequence[Sequence[int]]) -> bytes:
    """Token sequences as bytes: magic, then uint32 little-endian [count, len_1..len_count, tokens...]."""
    head = array("I", [len(sequences), *(len(s) for s in sequences)])
    body = array("I", [t for s in sequences for t in s])
    return BATCH_MAGIC + to_le(head) + to_le(body)


def decode_batch(data: bytes, vocab_size: int | None = None) -> list[list[int]]:
    """`encode_batch`'s sequences back; raises BatchError on anything malformed (sizes, a token outside the
    vocabulary), so a bad push never reaches a trie."""
    if data[:8] != BATCH_MAGIC or (len(data) - 8) % 4:
        raise BatchError("not a batch of token sequences")
    words = from_le("I", data[8:])
    if not words or len(words) < 1 + words[0]:
        raise BatchError("batch header is truncated")
    count = words[0]
    lengths = words[1:1 + count]
    tokens = words[1 + count:]
    if sum(lengths) != len(tokens):
        raise BatchError(f"batch holds {len(tokens)} tokens, its lengths say {sum(lengths)}")
    if vocab_size is not None and tokens and max(tokens) >= vocab_size:
        raise BatchError(f"token {max(tokens)} is outside the vocabulary ({vocab_size})")
    out, at = [], 0
    for n in lengths:
        out.append(tokens[at:at + n].tolist())
        at += n
    return out


@dataclass(frozen=True)
class FleetUpdate:
    """What a replica applies after a pull: deltas, or a snapshot when its cursor is too old."""

    epoch: str  # the fleet memory's life this update belongs to
    version: int  # the puller's cursor once it has applied this
    batches: tuple[bytes, ...] = ()  # other replicas' batches after the cursor, oldest first
    snapshot: bytes | None = None  # the merged trie (trie_store bytes); batches are empty then


@dataclass(frozen=True)
class FleetStats:
    epoch: str
    version: int
    nodes: int  # in the merged trie
    max_nodes: int
    log_batches: int  # recent batches held for deltas
    log_tokens: int
    sources: int  # replicas that have pushed in this epoch
    seeded_by: str | None  # the replica whose memory seeded this epoch (after a restart); None: none has


class FleetMemory:
    def __init__(self, ngram_length: int, tag: str, max_nodes: int, stop_words: Sequence[int] = (),
                 vocab_size: int | None = None, max_log_tokens: int | None = None) -> None:
        self.tag = tag  # what the model's memories carry (trie_store's tag): a foreign replica is refused
        self.vocab_size = vocab_size
        self.trie = TokenTrie(ngram_length, frozenset(stop_words), max_nodes=max_nodes)
        self.max_log_tokens = max_nodes if max_log_tokens is None else max_log_tokens
        self.epoch = uuid.uuid4().hex
        self.version = 0
        self._log: deque[tuple[int, str, bytes, int]] = deque()  # (version, source, batch, tokens), oldest first
        self._log_tokens = 0
        self._sources: set[str] = set()
        self._snapshot: tuple[int, bytes] | None = None  # (version, bytes): one dump serves every new replica
        self.seeded_by: str | None = None

    def _check(self, tag: str) -> None:
        if tag != self.tag:
            raise ValueError(f"this fleet memory belongs to {self.tag!r}, not {tag!r}")

    def push(self, tag: str, source: str, batch: bytes) -> int:
        """Merge one replica's batch; returns the new version. A malformed batch raises and changes nothing."""
        self._check(tag)
        return self._record(source, batch, decode_batch(batch, self.vocab_size))

    def _record(self, source: str, batch: bytes, sequences: list[list[int]], merge: bool = True) -> int:
        if merge:
            for seq in sequences:
                self.trie.add_sequence(seq)
        self.version += 1
        tokens = sum(len(s) for s in sequences)
        self._log.append((self.version, source, batch, tokens))
        self._log_tokens += tokens
        while len(self._log) > 1 and self._log_tokens > self.max_log_tokens:
            self._log_tokens -= self._log.popleft()[3]
        self._sources.add(source)
        return self.version

    def pull(self, tag: str, source: str, epoch: str | None, cursor: int) -> FleetUpdate:
        """What `source` lacks after `cursor` in `epoch` (None: it has nothing yet)."""
        self._check(tag)
        oldest = self._log[0][0] if self._log else self.version + 1  # the first version the log still holds
        if epoch == self.epoch and cursor >= oldest - 1:
            return FleetUpdate(self.epoch, self.version,
                               tuple(b for v, src, b, _ in self._log if v > cursor and src != source))
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, dumps(self.trie, self.tag))
        return FleetUpdate(self.epoch, self.version, snapshot=self._snapshot[1])

    def seed(self, tag: str, source: str, snapshot: bytes, batch: bytes = b"") -> bool:
        """A replica rejoining a restarted fleet memory: its whole memory (trie_store bytes) is merged if this
        epoch has no seed yet, and whether it was is returned. Not logged, and the version stays: the replicas
        that hold it never get it back, a new one gets it in the snapshot. `batch` (`encode_batch`) holds the
        outputs the replica finished since its last sync, which its memory holds too: logged for the others as
        a push is, but merged only if the seed is not (or they would count twice). Anything malformed or
        foreign raises (TrieFileError, BatchError, ValueError) and changes nothing."""
        self._check(tag)
        sequences = decode_batch(batch, self.vocab_size) if batch else []
        taken = self.seeded_by is None
        if taken:
            fresh = TokenTrie(self.trie.ngram_length, self.trie.stop_words)
            loads(snapshot, fresh, self.tag, self.vocab_size, name=f"seed from {source}")
            self.trie.merge(fresh)
            self.seeded_by = source
            self._snapshot = None  # the trie changed under the same version
        if sequences:
            self._record(source, batch, sequences, merge=not taken)
        return taken

    def stats(self) -> FleetStats:
        return FleetStats(self.epoch, self.version, self.trie.node_count, self.trie.max_nodes or 0,
                          len(self._log), self._log_tokens, len(self._sources), self.seeded_by)
