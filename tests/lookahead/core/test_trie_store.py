"""Trie persistence: a round trip keeps every node and count; anything wrong is refused, by name."""

import json
import pickle
import struct

import pytest

from lookahead.core.trie import TokenTrie
from lookahead.core.trie_store import MAGIC, TrieFileError, load, save


def walk(node, prefix=()):
    yield prefix, node.count
    for tok, child in node.children.items():
        yield from walk(child, prefix + (tok,))


@pytest.fixture
def trie():
    t = TokenTrie(4, max_nodes=10_000)
    t.add_sequence([1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7])
    t.add_sequence([5, 1, 2, 8], weight=2.5)
    return t


def test_round_trip_keeps_every_node_and_count(trie, tmp_path):
    f = tmp_path / "mem.trie"
    assert save(trie, f, "m:100") == trie.node_count
    back = TokenTrie(4, max_nodes=10_000)
    assert load(f, back, "m:100", vocab_size=100) == trie.node_count
    assert dict(walk(back.root)) == dict(walk(trie.root))
    assert [p.name for p in tmp_path.iterdir()] == ["mem.trie"]  # no temporary file left behind


def test_replicas_saving_one_path_at_once_all_succeed(trie, tmp_path):
    """Replicas that share a memory_path save at shutdown together; each writes its own temporary file."""
    from concurrent.futures import ThreadPoolExecutor

    f = tmp_path / "mem.trie"
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: save(trie, f, "m:100"), range(40))) == [trie.node_count] * 40
    assert load(f, TokenTrie(4, max_nodes=10_000), "m:100") == trie.node_count
    assert [p.name for p in tmp_path.iterdir()] == ["mem.trie"]


def test_loading_a_big_file_into_a_small_memory_evicts_to_its_bound(trie, tmp_path):
    f = tmp_path / "mem.trie"
    save(trie, f, "m")
    small = TokenTrie(4, max_nodes=16)
    assert load(f, small, "m") <= 16


def corrupt(path, offset, value=b"\xff"):
    data = bytearray(path.read_bytes())
    data[offset:offset + len(value)] = value
    path.write_bytes(bytes(data))


def test_every_kind_of_bad_file_is_refused(trie, tmp_path):
    f = tmp_path / "mem.trie"
    save(trie, f, "m")
    hlen = struct.unpack("<I", f.read_bytes()[8:12])[0]
    cases = {
        "bad magic": lambda p: corrupt(p, 0, b"PICKLE!!"),
        "checksum": lambda p: corrupt(p, 12 + hlen + 5),
        "payload is": lambda p: p.write_bytes(p.read_bytes()[:-8]),
        "header length": lambda p: corrupt(p, 8, struct.pack("<I", 10**9)),
    }
    for message, damage in cases.items():
        g = tmp_path / f"{message}.trie"
        g.write_bytes(f.read_bytes())
        damage(g)
        with pytest.raises(TrieFileError, match=message):
            load(g, TokenTrie(4), "m")
    with pytest.raises(TrieFileError, match="belongs to"):
        load(f, TokenTrie(4), "other-model")
    with pytest.raises(TrieFileError, match="n-gram length"):
        load(f, TokenTrie(5), "m")
    with pytest.raises(TrieFileError, match="outside the vocabulary"):
        load(f, TokenTrie(4), "m", vocab_size=3)
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps({"not": "a trie"}))
    with pytest.raises(TrieFileError, match="bad magic"):
        load(p, TokenTrie(4), "m")


def test_a_forged_file_with_a_valid_checksum_is_still_checked(tmp_path):
    """A well-formed header over a payload whose tree is inconsistent (counts negative / too deep)."""
    import hashlib
    from array import array

    for tokens, counts, kids, message in [
        ([0, 1], [0.0, -1.0], [1, 0], "count"),
        ([0, 1, 2, 3, 4, 5], [0.0] + [1.0] * 5, [1, 1, 1, 1, 1, 0], "deeper"),
        ([0, 1], [0.0, 1.0], [5, 0], "child counts exceed"),
    ]:
        payload = array("I", tokens).tobytes() + array("d", counts).tobytes() + array("I", kids).tobytes()
        header = json.dumps({"version": 1, "ngram_length": 4, "nodes": len(tokens) - 1, "tag": "m",
                             "sha256": hashlib.sha256(payload).hexdigest(), "payload_bytes": len(payload)}).encode()
        f = tmp_path / "forged.trie"
        f.write_bytes(MAGIC + struct.pack("<I", len(header)) + header + payload)
        with pytest.raises(TrieFileError, match=message):
            load(f, TokenTrie(4), "m")
