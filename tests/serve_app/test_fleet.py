"""A replica's fleet sync: outputs go out in batches, the others' come in, a new replica starts from a snapshot,
an unreachable or restarted fleet memory costs nothing but the sharing. The fleet memory is the real core object
in this process (no Ray: the transport is beside the point here; tests/serve_app/test_fleet_serving.py runs the
actor behind a two-replica deployment)."""

import concurrent.futures
from types import SimpleNamespace

from lookahead.core.fleet_memory import FleetMemory
from lookahead.core.trie import TokenTrie
from serve_app.fleet import FleetSync, actor_identity

TAG = "m|vocab=100"


class StandInEngine:
    """What FleetSync uses of an engine: its memory, its learn listeners, and calls between steps."""

    def __init__(self, max_nodes: int = 10_000) -> None:
        self.decoder = SimpleNamespace(memory=TokenTrie(4, max_nodes=max_nodes))
        self.learn_listeners = []
        self.between_steps = 0

    def call_between_steps(self, fn):
        self.between_steps += 1
        fut = concurrent.futures.Future()
        fut.set_result(fn())
        return fut

    def finish(self, tokens):  # as Engine._finish: the memory learns, then the listeners hear
        self.decoder.memory.add_sequence(tokens)
        for listen in self.learn_listeners:
            listen(tokens)


class Flaky:
    """A FleetMemory that can be made unreachable, or replaced (a killed actor's successor)."""

    def __init__(self, memory: FleetMemory) -> None:
        self.memory, self.down = memory, False

    def push(self, *args):
        if self.down:
            raise ConnectionError("fleet memory actor died")
        return self.memory.push(*args)

    def pull(self, *args):
        if self.down:
            raise ConnectionError("fleet memory actor died")
        return self.memory.pull(*args)

    def seed(self, *args):
        if self.down:
            raise ConnectionError("fleet memory actor died")
        return self.memory.seed(*args)


def fleet_memory(**kw) -> FleetMemory:
    return FleetMemory(ngram_length=4, tag=TAG, max_nodes=kw.get("max_nodes", 10_000), vocab_size=100)


def replica(client, name, **kw):
    engine = StandInEngine(**kw)
    return engine, FleetSync(engine, client, TAG, name, sync_s=3600, vocab_size=100)


def counts(trie):
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for tok, child in node.children.items():
            out[path + (tok,)] = child.count
            stack.append((path + (tok,), child))
    return out


def test_what_one_replica_learns_reaches_the_other_once():
    fleet = fleet_memory()
    a_engine, a = replica(fleet, "a")
    b_engine, b = replica(fleet, "b")
    assert a.sync() and b.sync()
    a_engine.finish([1, 2, 3, 4, 5, 6])
    a_engine.finish([9, 8, 7])
    assert a.status().outbox == 2
    assert a.sync() and a.status().pushed_outputs == 2 and a.status().outbox == 0
    assert b_engine.decoder.memory.find([3, 4, 5]) is None  # b has not pulled yet
    assert b.sync()
    assert counts(b_engine.decoder.memory) == counts(a_engine.decoder.memory)  # node for node, count for count
    assert a.sync() and counts(a_engine.decoder.memory)[(1,)] == 1  # a's own batch does not come back to it
    st = b.status()
    assert (st.shared, st.version, st.applied_batches, st.snapshots, st.last_error) == (True, 1, 1, 1, None)
    assert st.last_sync_s_ago is not None and st.nodes == b_engine.decoder.memory.node_count


def test_a_new_replica_starts_from_everything_the_fleet_learnt():
    fleet = fleet_memory()
    a_engine, a = replica(fleet, "a")
    for i in range(5):
        a_engine.finish([i, i + 1, i + 2, i + 3])
    a.sync()
    c_engine, c = replica(fleet, "c")
    assert c_engine.decoder.memory.node_count == 0
    assert c.sync() and c.status().snapshots == 1
    assert counts(c_engine.decoder.memory) == counts(a_engine.decoder.memory)


def test_an_unreachable_fleet_memory_keeps_the_outbox_and_the_memory():
    flaky = Flaky(fleet_memory())
    a_engine, a = replica(flaky, "a")
    assert a.sync()
    flaky.down = True
    a_engine.finish([1, 2, 3, 4])
    before = counts(a_engine.decoder.memory)
    assert not a.sync()
    st = a.status()
    assert st.last_error.startswith("ConnectionError") and st.outbox == 1 and st.pushed_outputs == 0
    assert counts(a_engine.decoder.memory) == before  # drafting goes on from what the replica has
    flaky.down = False
    assert a.sync() and a.status().last_error is None and a.status().pushed_outputs == 1
    assert flaky.memory.trie.find([1, 2, 3]) is not None


def test_a_restarted_fleet_memory_is_joined_again_from_its_snapshot():
    flaky = Flaky(fleet_memory())
    a_engine, a = replica(flaky, "a")
    b_engine, b = replica(flaky, "b")
    a.sync(), b.sync()
    old_epoch = a.epoch
    flaky.memory = fleet_memory()  # killed and created again: empty, versions from 0, a new epoch
    b_engine.finish([5, 6, 7, 8])
    assert b.sync() and a.sync()
    assert a.epoch != old_epoch and a.cursor == 1
    assert a_engine.decoder.memory.find([5, 6, 7]) is not None


def test_a_restarted_fleet_memory_is_seeded_by_the_first_replica_that_finds_it_and_nothing_counts_twice():
    flaky = Flaky(fleet_memory())
    a_engine, a = replica(flaky, "a")
    b_engine, b = replica(flaky, "b")
    for i in range(4):
        a_engine.finish([i, i + 1, i + 2, i + 3])
    assert a.sync() and b.sync()  # b holds what a learnt
    learnt = counts(a_engine.decoder.memory)
    assert counts(b_engine.decoder.memory) == learnt
    flaky.memory = fleet_memory()  # killed and created again: empty, a new epoch
    a_engine.finish([50, 51, 52, 53])  # finished before a finds the restart: in a's memory and its outbox
    b_engine.finish([60, 61, 62, 63])
    assert a.sync() and b.sync()
    assert (a.status().seeds, b.status().seeds) == (1, 0)  # one seed: a second would count the fleet twice
    assert flaky.memory.stats().seeded_by == "a"
    assert counts(a_engine.decoder.memory)[(50,)] == 1  # a's own output, not back again through a snapshot
    assert counts(b_engine.decoder.memory)[(50,)] == 1  # a's output reached b once, as a delta
    assert all(counts(b_engine.decoder.memory)[k] == v for k, v in learnt.items())  # b's memory, not doubled
    a.sync()
    assert counts(a_engine.decoder.memory)[(60,)] == 1  # and b's reached a
    c_engine, c = replica(flaky, "c")  # started after the restart: everything the fleet knew, and since
    assert c.sync() and c.status().snapshots == 1
    assert counts(c_engine.decoder.memory) == counts(a_engine.decoder.memory)


def test_an_empty_replica_offers_no_seed_to_a_restarted_fleet_memory():
    flaky = Flaky(fleet_memory())
    a_engine, a = replica(flaky, "a")
    a.sync()
    flaky.memory = fleet_memory()
    assert a.sync() and a.status().seeds == 0 and flaky.memory.stats().seeded_by is None


def test_the_outbox_and_the_memory_stay_within_their_bounds():
    fleet = fleet_memory()
    a_engine, a = replica(fleet, "a")
    a.max_outbox_tokens = 10
    for i in range(6):
        a_engine.finish([i, i + 1, i + 2, i + 3])  # 4 tokens each: the outbox keeps the newest 2
    assert a.status().outbox == 2
    a.sync()
    small_engine, small = replica(fleet, "small", max_nodes=16)
    big_engine, big = replica(fleet, "big")
    for i in range(40):
        big_engine.finish([i % 100, (i + 1) % 100, (i + 3) % 100, (i + 7) % 100])
    big.sync()
    small.sync()
    assert small_engine.decoder.memory.node_count <= 16


def test_each_deployment_and_model_has_its_own_actor():
    a = actor_identity("app", "Model-m", "m|vocab=100")
    assert a == actor_identity("app", "Model-m", "m|vocab=100")
    assert a != actor_identity("app", "Model-m", "other|vocab=100")  # a redeploy with another model
    assert a[1] != actor_identity("app2", "Model-m", "m|vocab=100")[1]
