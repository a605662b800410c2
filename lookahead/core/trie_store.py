"""Save and load the shared output memory, so a replica can start warm; data only, never pickle.

PIA pickles its trie, and loading a pickle runs whatever code the file names.
This format holds numbers only:

    magic    8 bytes   b"LATRIE\\x00\\x01"
    header   4 bytes   length H of the JSON header, little-endian
    JSON     H bytes   {"version": 1, "ngram_length", "nodes", "tag", "sha256", "payload_bytes"}
    payload            nodes in preorder: token ids (uint32), counts (float64), child counts (uint32)

`sha256` covers the payload. `tag` names what the trie belongs to (model and
vocabulary size): a trie from another tokenizer would propose nonsense drafts
(harmless to the output, which stays lossless, but useless), so a foreign tag
is refused. Anything wrong (magic, version, checksum, sizes, a count that is
negative or not finite, a token out of range, a tree deeper than the n-gram
length) raises `TrieFileError` naming the problem; the caller starts empty.

Pure Python; no torch.
"""

import hashlib
import json
import math
import os
import struct
import sys
import tempfile
from array import array
from pathlib import Path

from lookahead.core.trie import ROOT, TokenTrie

MAGIC = b"LATRIE\x00\x01"
VERSION = 1
MAX_HEADER = 1 << 16


class TrieFileError(ValueError):
    pass


def to_le(a: array) -> bytes:
    if sys.byteorder != "little":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def from_le(typecode: str, data: bytes) -> array:
    a = array(typecode)
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def dumps(trie: TokenTrie, tag: str) -> bytes:
    """`trie` in the file format, as bytes (what `save` writes, and what the fleet memory sends)."""
    tokens, counts, kids = array("I"), array("d"), array("I")
    stack: list[tuple[int, int]] = [(0, ROOT)]  # (token, node id)
    while stack:
        tok, node = stack.pop()
        below = trie.kids_of(node)
        tokens.append(tok)
        counts.append(trie.count_of(node))
        kids.append(len(below))
        stack.extend(reversed(list(below.items())))  # preorder, children in insertion order
    payload = to_le(tokens) + to_le(counts) + to_le(kids)
    header = json.dumps({"version": VERSION, "ngram_length": trie.ngram_length, "nodes": len(tokens) - 1,
                         "tag": tag, "sha256": hashlib.sha256(payload).hexdigest(),
                         "payload_bytes": len(payload)}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


def save(trie: TokenTrie, path: str | Path, tag: str) -> int:
    """Write `trie` atomically (temp file, then rename); returns the nodes written (the root excluded)."""
    data = dumps(trie, tag)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file of this writer's own: replicas sharing one memory_path save at once (the last one wins).
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    (hlen,) = struct.unpack("<I", data[8:12])
    return (len(data) - 12 - hlen) // 16 - 1  # payload: 16 bytes a node, the root's included


def load(path: str | Path, into: TokenTrie, tag: str, vocab_size: int | None = None) -> int:
    """Fill the empty trie `into` from `path`; returns the nodes loaded. Raises TrieFileError."""
    return loads(Path(path).read_bytes(), into, tag, vocab_size, name=str(path))


def loads(data: bytes, into: TokenTrie, tag: str, vocab_size: int | None = None, name: str = "trie") -> int:
    """Fill the empty trie `into` from `data` (`dumps`'s bytes); returns the nodes loaded. Raises TrieFileError
    whose message starts with `name` (the file, or where the bytes came from)."""
    if data[:8] != MAGIC:
        raise TrieFileError(f"{name}: not a lookahead trie file (bad magic)")
    if len(data) < 12:
        raise TrieFileError(f"{name}: truncated header")
    (hlen,) = struct.unpack("<I", data[8:12])
    if hlen > MAX_HEADER or 12 + hlen > len(data):
        raise TrieFileError(f"{name}: header length {hlen} is invalid")
    try:
        meta = json.loads(data[12:12 + hlen])
        version, n, stored_tag = meta["version"], int(meta["nodes"]), meta["tag"]
        ngram, digest, size = int(meta["ngram_length"]), meta["sha256"], int(meta["payload_bytes"])
    except (ValueError, KeyError, TypeError) as e:
        raise TrieFileError(f"{name}: unreadable header ({e})") from e
    if version != VERSION:
        raise TrieFileError(f"{name}: format version {version}, this build reads {VERSION}")
    if stored_tag != tag:
        raise TrieFileError(f"{name}: belongs to {stored_tag!r}, not {tag!r}")
    if ngram != into.ngram_length:
        raise TrieFileError(f"{name}: n-gram length {ngram}, the memory uses {into.ngram_length}")
    payload = data[12 + hlen:]
    if n < 0 or len(payload) != size or size != (n + 1) * 16:
        raise TrieFileError(f"{name}: payload is {len(payload)} bytes, the header says {size} for {n} nodes")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise TrieFileError(f"{name}: checksum mismatch (corrupt or truncated)")
    m = n + 1
    tokens = from_le("I", payload[:4 * m])
    counts = from_le("d", payload[4 * m:12 * m])
    kids = from_le("I", payload[12 * m:])
    into.adopt(_rebuild(into, tokens, counts, kids, vocab_size, name))
    if into.max_nodes is not None and n > into.max_nodes:
        into.evict(int(into.max_nodes * into.low_water))
    return into.node_count


def _rebuild(like: TokenTrie, tokens: array, counts: array, kids: array, vocab: int | None, path: str) -> TokenTrie:
    """A new trie of `like`'s kind with the nodes read (so a bad file leaves `like` as it was)."""
    out = TokenTrie(like.ngram_length, like.stop_words)
    max_depth = like.ngram_length
    stack: list[tuple[int, int, int]] = [(ROOT, kids[0], 0)]  # node id, children still to read, depth
    i = 1
    while stack:
        node, left, depth = stack[-1]
        if left == 0:
            stack.pop()
            continue
        stack[-1] = (node, left - 1, depth)
        if i >= len(tokens):
            raise TrieFileError(f"{path}: child counts exceed the nodes stored")
        tok, count = tokens[i], counts[i]
        if depth + 1 > max_depth:
            raise TrieFileError(f"{path}: a branch is deeper than the n-gram length {max_depth}")
        if not (math.isfinite(count) and count >= 0):
            raise TrieFileError(f"{path}: node {i} has count {count}")
        if vocab is not None and tok >= vocab:
            raise TrieFileError(f"{path}: token {tok} is outside the vocabulary ({vocab})")
        if tok in out.kids_of(node):
            raise TrieFileError(f"{path}: token {tok} repeated under one parent")
        stack.append((out.add_child(node, tok, count), kids[i], depth + 1))
        i += 1
    if i != len(tokens):
        raise TrieFileError(f"{path}: {len(tokens) - i} nodes are not reachable from the root")
    return out
