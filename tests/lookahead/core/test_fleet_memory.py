"""The fleet memory's core: batches round-trip as data, versions and epochs decide deltas or snapshots, the log
and the trie stay bounded, and a malformed or foreign push changes nothing."""

import pytest

from lookahead.core.fleet_memory import BatchError, FleetMemory, decode_batch, encode_batch
from lookahead.core.trie import TokenTrie
from lookahead.core.trie_store import TrieFileError, dumps, loads

TAG = "m|vocab=100"


def memory(**kw) -> FleetMemory:
    return FleetMemory(ngram_length=4, tag=TAG, max_nodes=kw.pop("max_nodes", 10_000), vocab_size=100, **kw)


def test_a_batch_round_trips_its_sequences_in_order():
    seqs = [[1, 2, 3], [], [99, 0, 5, 5]]
    assert decode_batch(encode_batch(seqs), vocab_size=100) == seqs


@pytest.mark.parametrize("data, why", [
    (b"\x80\x04pickle", "not a batch"),
    (encode_batch([[1, 2, 3]])[:-4], "lengths say"),          # a token cut off
    (encode_batch([[1, 2, 300]]), "outside the vocabulary"),  # vocabulary 100
])
def test_a_malformed_batch_is_refused_by_name(data, why):
    with pytest.raises(BatchError, match=why):
        decode_batch(data, vocab_size=100)


def test_a_new_replica_gets_a_snapshot_of_everything_merged():
    fleet = memory()
    fleet.push(TAG, "a", encode_batch([[1, 2, 3, 4, 5]]))
    fleet.push(TAG, "b", encode_batch([[7, 8, 9]]))
    up = fleet.pull(TAG, "c", None, 0)
    assert up.version == 2 and up.batches == () and up.snapshot is not None
    back = TokenTrie(4)
    loads(up.snapshot, back, TAG, vocab_size=100)
    assert back.find([2, 3, 4]) is not None and back.find([7, 8, 9]) is not None
    assert back.node_count == fleet.trie.node_count


def test_a_caught_up_replica_gets_only_the_others_batches_after_its_cursor():
    fleet = memory()
    epoch = fleet.pull(TAG, "a", None, 0).epoch
    v1 = fleet.push(TAG, "a", encode_batch([[1, 2, 3]]))
    fleet.push(TAG, "b", encode_batch([[4, 5, 6]]))
    fleet.push(TAG, "a", encode_batch([[7, 7, 7]]))
    up = fleet.pull(TAG, "a", epoch, 0)
    assert up.snapshot is None and up.version == 3
    assert [decode_batch(b) for b in up.batches] == [[[4, 5, 6]]]  # a's own pushes it has already
    assert fleet.pull(TAG, "b", epoch, v1).batches == (encode_batch([[7, 7, 7]]),)  # after b's cursor only
    assert fleet.pull(TAG, "b", epoch, 3).batches == ()


def test_a_cursor_from_another_epoch_or_older_than_the_log_gets_a_snapshot():
    fleet = memory(max_log_tokens=6)
    epoch = fleet.pull(TAG, "a", None, 0).epoch
    for i in range(4):
        fleet.push(TAG, "b", encode_batch([[i, i + 1, i + 2]]))  # 3 tokens each: the log keeps the last 2
    st = fleet.stats()
    assert (st.version, st.log_batches, st.log_tokens) == (4, 2, 6)
    assert fleet.pull(TAG, "a", epoch, 2).snapshot is None  # versions 3 and 4 are still in the log
    assert fleet.pull(TAG, "a", epoch, 1).snapshot is not None  # version 2 is gone
    restarted = memory()  # a killed actor's successor: versions count from 0 again under a new epoch
    assert restarted.epoch != epoch
    assert restarted.pull(TAG, "a", epoch, 4).snapshot is not None


def test_the_merged_trie_stays_within_its_bound():
    fleet = memory(max_nodes=64)
    for i in range(50):
        fleet.push(TAG, "a", encode_batch([[(i * 7 + j) % 100 for j in range(12)]]))
    assert fleet.trie.node_count <= 64 and fleet.trie.evictions > 0


def test_a_foreign_or_malformed_push_changes_nothing():
    fleet = memory()
    with pytest.raises(ValueError, match="belongs to"):
        fleet.push("other-model|vocab=100", "a", encode_batch([[1, 2, 3]]))
    with pytest.raises(BatchError):
        fleet.push(TAG, "a", encode_batch([[1, 2, 500]]))
    with pytest.raises(ValueError, match="belongs to"):
        fleet.pull("other-model|vocab=100", "a", None, 0)
    assert fleet.version == 0 and fleet.trie.node_count == 0 and fleet.stats().sources == 0


def test_one_snapshot_is_dumped_per_version():
    fleet = memory()
    fleet.push(TAG, "a", encode_batch([[1, 2, 3]]))
    first = fleet.pull(TAG, "x", None, 0).snapshot
    assert fleet.pull(TAG, "y", None, 0).snapshot is first  # the same bytes, not a second dump
    fleet.push(TAG, "a", encode_batch([[4, 5, 6]]))
    assert fleet.pull(TAG, "z", None, 0).snapshot != first


def _trie(*seqs) -> TokenTrie:
    trie = TokenTrie(4)
    for seq in seqs:
        trie.add_sequence(seq)
    return trie


def test_the_first_seed_of_an_epoch_is_merged_unlogged_and_reaches_only_new_replicas():
    fleet = memory()
    epoch = fleet.pull(TAG, "b", None, 0).epoch
    first = fleet.pull(TAG, "x", None, 0).snapshot
    assert fleet.seed(TAG, "a", dumps(_trie([1, 2, 3, 4, 5]), TAG))
    assert not fleet.seed(TAG, "b", dumps(_trie([7, 8, 9]), TAG))  # one seed an epoch
    assert fleet.trie.find([2, 3, 4]) is not None and fleet.trie.find([7, 8, 9]) is None
    assert fleet.version == 0 and fleet.stats().seeded_by == "a" and fleet.stats().log_batches == 0
    assert fleet.pull(TAG, "b", epoch, 0).batches == ()  # replicas that hold it never get it back
    fresh = fleet.pull(TAG, "c", None, 0).snapshot  # the same version, yet a new dump
    assert fresh != first
    back = TokenTrie(4)
    loads(fresh, back, TAG, vocab_size=100)
    assert back.find([2, 3, 4]) is not None


def test_a_foreign_or_corrupt_seed_changes_nothing():
    fleet = memory()
    good = dumps(_trie([1, 2, 3, 4]), TAG)
    with pytest.raises(ValueError, match="belongs to"):
        fleet.seed("other-model|vocab=100", "a", good)
    with pytest.raises(TrieFileError, match="belongs to"):
        fleet.seed(TAG, "a", dumps(_trie([1, 2, 3, 4]), "other-model|vocab=100"))
    with pytest.raises(TrieFileError, match="checksum"):
        fleet.seed(TAG, "a", good[:-1] + bytes([good[-1] ^ 1]))
    assert fleet.trie.node_count == 0 and fleet.stats().seeded_by is None
    assert fleet.seed(TAG, "a", good)  # a bad offer does not use up the epoch's seed
