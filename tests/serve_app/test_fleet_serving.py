"""Replicas that learn together, on real Ray Serve (issue 38): two replicas of a tiny random Llama (the model is
beside the point of where requests go and what the drafts remember), prefix-affinity routing and the fleet
memory actor.

- Requests sharing a long prefix land on one replica while the load is balanced, and spread once it is not.
- A replica that never served a prompt set drafts it, after another replica served it, with more tokens a step
  than the first (cold) pass; the tokens are the same.
- Killing the fleet memory actor costs no request, and the replicas join its successor and seed it once.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.serving import ANSWER_TIMEOUT, LONG, HeldStreams, deploy, outcome, wait_for

APP = "fleet"
MODEL = "tiny"
DOC = ("The lighthouse keeper kept a log of every ship that passed the northern rocks, with its flag, its cargo "
       "and the hour it cleared the point. ") * 6  # ~700 characters every request of a set shares
QUESTIONS = ["Which ships passed first?", "What cargo did they carry?", "When did the last one clear the point?",
             "Who kept the log?", "What flags were seen?", "Where are the rocks?"]


@pytest.fixture(scope="module")
def fleet(serve_url, tiny_llama_dir):
    from ray import serve

    model = {
        "name": MODEL, "model": tiny_llama_dir, "dtype": "float32", "device": "cpu", "torch_threads": 1,
        "lookahead": {"adaptive": False, "decoding_length": 32, "branch_length": 12, "shared_memory_sync_s": 0.5},
        "routing_imbalance": 2,
        "batching": {"max_batch_size": 4, "batch_wait_timeout_s": 0.01},
        "limits": {"max_new_tokens": 60000, "max_prompt_tokens": 1024},
        "deployment": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}, "graceful_shutdown_timeout_s": 5,
                       "health_check_period_s": 2},
    }
    base = serve_url + deploy(APP, {"models": [model]})
    yield base
    serve.delete(APP)


def handle():
    from ray import serve

    return serve.get_deployment_handle(f"Model-{MODEL}", app_name=APP)


def replica_completed() -> dict[str, int]:
    """Requests each replica generated to their end, by replica actor name (calls without a prompt go by power
    of two choices, so rounds go on until both have answered)."""
    states: dict[str, int] = {}
    for _ in range(10):
        states.update({load.actor: load.completed for load in
                       [c.result() for c in [handle().replica_load.remote() for _ in range(6)]]})
        if len(states) >= 2:
            break
    return states


def replica_engine_queues() -> dict[str, int]:
    return {load.actor: load.engine_queue for load in
            [c.result() for c in [handle().replica_load.remote() for _ in range(6)]]}


def replica_fleet_states() -> dict[str, dict]:
    """Each replica's output-memory status just after a sync of its own, by replica actor name."""
    out: dict[str, dict] = {}
    for _ in range(10):
        out.update({st["replica"]: st for st in [c.result() for c in [handle().sync_fleet.remote()
                                                                          for _ in range(6)]]})
        if len(out) >= 2:
            break
    return out


def synced() -> bool:
    """Both replicas have caught up to one fleet version, with nothing left in their outboxes."""
    states = replica_fleet_states()
    return len(states) == 2 and len({s["version"] for s in states.values()}) == 1 and \
        all(s["outbox"] == 0 and s["last_error"] is None for s in states.values())


def complete(base: str, prompt: str, max_tokens: int = 48) -> dict:
    r = requests.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0}, timeout=ANSWER_TIMEOUT)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def replica_served() -> dict[str, set[str]]:
    """The request ids each replica finished lately, by replica actor name."""
    out: dict[str, set[str]] = {}
    for _ in range(10):
        out.update({actor: set(ids) for actor, ids in [c.result() for c in [handle().served.remote()
                                                                           for _ in range(6)]]})
        if len(out) >= 2:
            break
    return out


def test_a_shared_prefix_sticks_to_one_replica_until_it_is_busy(fleet):
    before = replica_completed()
    ids = {complete(fleet, DOC + q, max_tokens=4)["id"] for q in QUESTIONS}
    after = replica_completed()
    gained = sorted(after[a] - before.get(a, 0) for a in after)
    assert gained == [0, len(QUESTIONS)], (before, after)  # balanced: every one on the replica with the prefix
    served = replica_served()
    assert sorted(len(ids & s) for s in served.values()) == [0, len(QUESTIONS)], served  # by id, the same
    # Held streams with the same prefix: the replica with it runs them until it holds routing_imbalance more than
    # the other, then power of two choices sends the rest to the other.
    hold = {"model": MODEL, "prompt": DOC + "Tell me everything.", "max_tokens": 60000, "temperature": 0,
            "stream": True, "lookahead": LONG}
    with HeldStreams(fleet, "/v1/completions", hold, 0) as held:
        held_by: dict[str, int] = {}

        def holding(n: int) -> bool:
            held_by.update(replica_engine_queues())
            return len(held_by) == 2 and sum(held_by.values()) == n

        for n in range(1, 7):  # one at a time, each placed before the next is sent
            held.add()
            assert wait_for(lambda: holding(n), 60), held_by
        assert min(held_by.values()) >= 1 and max(held_by.values()) >= 3, held_by
        assert not held.errors, held.errors


def test_a_replica_drafts_what_another_replica_learnt(fleet):
    import ray

    prompts = [f"Story {i}: the keeper wrote about ship number {i} and its long voyage" for i in range(4)]
    cold = {p: complete(fleet, p) for p in prompts}
    assert wait_for(synced, 60), replica_fleet_states()
    # The replica that served them goes; the survivor and the new replica learnt them only through the fleet.
    served = replica_completed()
    victim = max(served, key=served.get)
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    assert wait_for(lambda: len(replica_fleet_states()) == 2 and victim not in replica_fleet_states(), 180)
    assert wait_for(synced, 60), replica_fleet_states()
    warm = {p: complete(fleet, p) for p in prompts}
    for p in prompts:
        assert warm[p]["choices"][0]["text"] == cold[p]["choices"][0]["text"]  # lossless either way
    cold_rate = sum(cold[p]["lookahead"]["mean_accepted_tokens"] for p in prompts) / len(prompts)
    warm_rate = sum(warm[p]["lookahead"]["mean_accepted_tokens"] for p in prompts) / len(prompts)
    assert warm_rate > 1.3 * cold_rate, (cold_rate, warm_rate)
    states = replica_fleet_states()
    print(f"tokens a step: cold {cold_rate:.2f}, learnt through the fleet {warm_rate:.2f}")
    assert all(s["shared"] and s["nodes"] > 0 and s["epoch"] for s in states.values())


def test_killing_the_fleet_memory_costs_no_request(fleet):
    import ray

    from serve_app.fleet import ACTOR_NAME

    [(name, namespace)] = [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
                           if a["name"].startswith(ACTOR_NAME) and a["namespace"] == f"serve::{APP}::Model-{MODEL}"]
    epoch = next(iter(replica_fleet_states().values()))["epoch"]
    bodies = [{"model": MODEL, "prompt": f"request {i} while the memory goes", "max_tokens": 24, "temperature": 0}
              for i in range(12)]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(outcome, fleet, b) for b in bodies]
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        results = [f.result() for f in futures]
    assert results == ["ok"] * len(bodies)
    # The replicas created its successor (empty, a new epoch) and sync with it again.
    assert wait_for(lambda: all(s["epoch"] not in (None, epoch) and s["last_error"] is None
                                for s in replica_fleet_states().values()), 60), replica_fleet_states()
    # The first replica to find it seeded it with its memory, and only that one: a replica started now starts warm.
    assert sum(s["seeds"] for s in replica_fleet_states().values()) == 1, replica_fleet_states()
    successor = ray.get(ray.get_actor(name, namespace=namespace).stats.remote())
    assert successor.seeded_by is not None and successor.nodes > 0
    stats = requests.get(f"{fleet}/stats", timeout=30).json()["models"][MODEL]
    assert stats["output_memory"]["shared"] and stats["output_memory"]["version"] >= 0
