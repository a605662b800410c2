"""Faults, overload, hostile input and scale-down on real Ray Serve; nothing lost, nothing hung.

The model is a tiny random Llama (the model is beside the point), two
replicas. Every request of every scenario is accounted for: it either
succeeded completely (a finish reason, and for streams `[DONE]`) or got an
error status / error event with a JSON body. A request that hangs fails the
test through its client timeout; a stream that stops without `[DONE]` or an
error event counts as a truncated success and fails the test.
"""

import http.client
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests

from lookahead.core.trie import TokenTrie
from lookahead.core.trie_store import load as load_memory
from tests.serving import ANSWER_TIMEOUT, CLIENT_TIMEOUT, LONG, HeldStreams, deploy, outcome, placed, wait_for

APP = "rel"
MODEL = "tiny"
KEEPALIVE_S = 0.5


@pytest.fixture(scope="module")
def rel(serve_url, tiny_llama_dir, tmp_path_factory):
    from ray import serve

    memory = tmp_path_factory.mktemp("memory") / "tiny.trie"
    memory.write_bytes(b"\x80\x04 this is not a trie, and a pickle would never be loaded")
    model = {
        "name": MODEL, "model": tiny_llama_dir, "dtype": "float32", "device": "cpu", "torch_threads": 1,
        "lookahead": {"adaptive": False, "memory_path": str(memory), "memory_save_interval_s": 3600},
        "routing": "pow2",  # faults on both replicas: the same prompts must spread (prefix routing: test_fleet_serving)
        "batching": {"max_batch_size": 4, "batch_wait_timeout_s": 0.01},
        "limits": {"max_new_tokens": 60000, "max_engine_queue": 8, "max_prompt_tokens": 512},
        "deployment": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}, "max_queued_requests": 16,
                       # a replica told to go drains its generations (the test sizes them), however slow the machine
                       "graceful_shutdown_timeout_s": 600},
    }
    base = serve_url + deploy(APP, {"models": [model], "ingress": {"max_body_bytes": 65536,
                                                                      "stream_keepalive_s": KEEPALIVE_S}})
    yield {"base": base, "model": model, "memory": memory}
    serve.delete(APP)


def handle():
    from ray import serve

    return serve.get_deployment_handle(f"Model-{MODEL}", app_name=APP)


def running_replicas() -> int:
    from ray import serve

    return serve.status().applications[APP].deployments[f"Model-{MODEL}"].replica_states.get("RUNNING", 0)


def test_a_corrupt_memory_file_is_refused_and_the_replica_starts_empty(rel):
    assert running_replicas() == 2
    assert handle().memory_nodes.remote().result() >= 0  # serving, with an empty (not a pickled) trie
    assert outcome(rel["base"], {"model": MODEL, "prompt": "hello there", "max_tokens": 8, "temperature": 0}) == "ok"


def replica_states(calls: int = 8, rounds: int = 5) -> dict:
    """Each replica's ReplicaLoad, by replica actor name. The router may send a round of concurrent calls all
    to one replica, so rounds go on until every running replica has answered (at most `rounds`)."""
    states, running = {}, running_replicas()
    for _ in range(rounds):
        states.update({load.actor: load for load in
                       [r.result() for r in [handle().replica_load.remote() for _ in range(calls)]]})
        if len(states) >= running:
            break
    return states


def replica_loads() -> dict[str, int]:
    """Requests each replica's engine holds, by replica actor name."""
    return {actor: load.engine_queue for actor, load in replica_states().items()}


def replica_completed() -> dict[str, int]:
    """Requests each replica has generated to their end, by replica actor name."""
    return {actor: load.completed for actor, load in replica_states().items()}


def routed_to_every_replica(base: str, replicas: int = 2) -> None:
    """Send short requests until each replica has answered one over HTTP. A replica Serve has just replaced
    is RUNNING before the ingress's router knows it; until then every request goes to the other one."""
    before = replica_completed()
    body = {"model": MODEL, "prompt": "are you there", "max_tokens": 2, "temperature": 0}

    def every_replica_answered() -> bool:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda _: outcome(base, body), range(4))) == ["ok"] * 4
        now = replica_completed()
        return len(now) == replicas and all(now[a] > before.get(a, 0) for a in now)

    assert wait_for(every_replica_answered, 90), f"the ingress did not route to all {replicas} replicas"


class Probe:
    """One streamed request read line by line in a thread: what kind each line was, in order."""

    def __init__(self, base: str, body: dict) -> None:
        url = urlsplit(base)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CLIENT_TIMEOUT)
        self.conn.request("POST", f"{url.path}/v1/completions", body=json.dumps(body),
                          headers={"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.kinds: list[str] = []  # "keepalive", "data" or "done", one per SSE line as it arrived
        self.thread = threading.Thread(target=self._read, daemon=True)
        if self.response.status == 200:
            self.thread.start()

    def _read(self) -> None:
        while line := self.response.readline():
            if line.startswith(b":"):
                self.kinds.append("keepalive")
            elif line == b"data: [DONE]\n":
                self.kinds.append("done")
            elif line.startswith(b"data: "):
                self.kinds.append("error" if b'"error"' in line else "data")


def test_a_stream_queued_behind_full_engines_hears_keepalives_until_it_runs(rel):
    """A queued stream sends SSE comments while it waits, so a client's idle timeout is not a queue's length."""
    routed_to_every_replica(rel["base"])
    rows = rel["model"]["batching"]["max_batch_size"]
    hold = {"model": MODEL, "prompt": "hold the line", "max_tokens": 60000, "temperature": 0, "stream": True,
            "lookahead": LONG}
    with HeldStreams(rel["base"], "/v1/completions", hold, 0) as held:
        fill(held, rows)  # every replica's engine runs a full batch, so a new request queues
        body = {"model": MODEL, "prompt": "waiting my turn", "max_tokens": 8, "temperature": 0, "stream": True,
                "lookahead": LONG}
        for _ in range(20):  # a replica already holding 8 refuses it (503); another call may reach the other
            probe = Probe(rel["base"], body)
            if probe.response.status == 200:
                break
            assert probe.response.status == 503, probe.response.status
            probe.conn.close()
        assert probe.response.status == 200
        assert wait_for(lambda: "keepalive" in probe.kinds, 60), probe.kinds
        assert "data" not in probe.kinds  # still queued: the comments came while it had nothing to say
    probe.thread.join(CLIENT_TIMEOUT)
    assert probe.kinds[-1] == "done" and "data" in probe.kinds, probe.kinds
    first_data = probe.kinds.index("data")
    assert "keepalive" in probe.kinds[:first_data]
    print(f"\nqueued stream: {probe.kinds[:first_data].count('keepalive')} keepalives before its first token")


def fill(held: HeldStreams, rows: int, replicas: int = 2) -> dict[str, int]:
    """Open held streams one at a time, each once an engine holds the one before (or it was refused), until
    every replica's engine holds at least `rows` (at most 4 x `rows` per replica); returns what each held.
    Streams opened together form one group, and a group goes to one replica: twelve opened at once once
    filled one replica, and the other held none."""
    last: dict[str, int] = {}

    def taken_up() -> bool:
        last.clear()
        last.update(replica_loads())
        refused = sum(status not in (None, 200) for status in held.statuses)
        return sum(last.values()) + refused >= len(held.conns)

    while len(held.conns) < 4 * rows * replicas:
        held.add()
        assert wait_for(taken_up, 60), f"held stream {len(held.conns)} was not taken up: {last}"
        if len(last) == replicas and min(last.values()) >= rows:
            return dict(last)
    raise AssertionError(f"{len(held.conns)} streams opened one at a time did not fill {replicas} replicas: {last}")


def test_killing_a_replica_mid_load_loses_no_request(rel):
    import ray

    def body(i: int) -> dict:
        return {"model": MODEL, "prompt": f"story {i}: once upon a time", "max_tokens": 3000, "temperature": 0,
                "stream": i % 2 == 0, "lookahead": LONG}

    with ThreadPoolExecutor(32) as pool:
        futures = spread(pool, rel["base"], body, 16)  # sent together, they may all land on one replica
        held = placed(futures, replica_loads)  # so what the survivor holds when the other dies is known
        victim, survivor = sorted(held, key=held.get, reverse=True)
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        results = [f.result(timeout=ANSWER_TIMEOUT + 30) for f in futures]  # raises on a hang or a truncation
    assert len(results) == len(futures) >= 16
    print(f"\nreplica killed under load holding {held[victim]} requests (survivor {held[survivor]}): "
          f"{results.count('ok')} ok, {len(results) - results.count('ok')} errors: {results}")
    assert all(r == "ok" or r.startswith("error") for r in results)
    assert results.count("ok") >= held[survivor]  # every request the surviving replica held completed in full
    assert wait_for(lambda: running_replicas() == 2, 90), "Serve did not replace the dead replica"
    assert outcome(rel["base"], {"model": MODEL, "prompt": "after the storm", "max_tokens": 8}) == "ok"


def test_a_burst_of_ten_times_capacity_is_served_or_refused_and_recovers(rel):
    capacity = 2 * rel["model"]["limits"]["max_engine_queue"]  # two replicas
    rss_before = max(handle().rss_bytes.remote().result() for _ in range(4))
    body = {"model": MODEL, "prompt": "burst", "max_tokens": 64, "temperature": 0}
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda _: outcome(rel["base"], body), range(10 * capacity)))
    assert set(results) <= {"ok", "error-503"}, set(results)
    assert results.count("ok") >= 4 and results.count("error-503") >= 1
    print(f"\nburst of {len(results)}: {results.count('ok')} served, {results.count('error-503')} refused with 503")
    assert wait_for(lambda: handle().queue_length.remote().result() == 0, 60)
    rss_after = max(handle().rss_bytes.remote().result() for _ in range(4))
    assert rss_after - rss_before < 300 * 2**20, (rss_before, rss_after)  # bounded: no per-request leak
    print(f"replica RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert outcome(rel["base"], {"model": MODEL, "prompt": "calm again", "max_tokens": 8}) == "ok"


HOSTILE = [
    ("invalid UTF-8", b'{"model": "tiny", "prompt": "\xff\xfe\xfa"}', 400),
    ("multi-megabyte body", b'{"model": "tiny", "prompt": "' + b"a" * (3 * 2**20) + b'"}', 413),
    ("huge max_tokens", json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 10**12}).encode(), 400),
    ("negative temperature", json.dumps({"model": "tiny", "prompt": "x", "temperature": -0.5}).encode(), 400),
    ("NaN temperature", b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400),
    ("Infinity top_p", b'{"model": "tiny", "prompt": "x", "top_p": Infinity}', 400),
    ("thousands of stop strings", json.dumps({"model": "tiny", "prompt": "x", "stop": ["s"] * 5000}).encode(), 400),
    ("deeply nested JSON", b'{"model": "tiny", "prompt": "x", "user": ' + b"[" * 20000 + b"]" * 20000 + b"}", 400),
    ("prompt token ids out of range", json.dumps({"model": "tiny", "prompt": [1, 2, 10**9]}).encode(), 400),
    ("not an object", b"[1, 2, 3]", 400),
    ("empty body", b"", 400),
]


@pytest.mark.parametrize("name,payload,status", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_gets_a_clear_4xx(rel, name, payload, status):
    r = requests.post(f"{rel['base']}/v1/completions", data=payload, timeout=60,
                      headers={"content-type": "application/json"})
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_128_mb_body_gets_a_readable_413_every_time(rel, chunked):
    """The client is still sending when the cap is passed; the 413 must reach it all the same, not a reset."""
    size = 128 * 2**20
    blob = b'{"model": "tiny", "prompt": "' + b"a" * size + b'"}'
    tries = 3 if chunked else 10
    for _ in range(tries):
        data = (blob[i:i + 2**20] for i in range(0, len(blob), 2**20)) if chunked else blob
        r = requests.post(f"{rel['base']}/v1/completions", data=data, timeout=120,
                          headers={"content-type": "application/json"})
        assert r.status_code == 413, (r.status_code, r.text[:200])
        assert r.json()["error"]["param"] == "body"
    assert requests.get(f"{rel['base']}/health", timeout=10).status_code == 200
    assert outcome(rel["base"], {"model": MODEL, "prompt": "still here", "max_tokens": 4}) == "ok"


def test_fuzzing_the_openapi_schema_finds_no_5xx(rel):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, settings

    schema = schemathesis.openapi.from_url(f"{rel['base']}/openapi.json")
    tried, server_errors = 0, []
    for op in schema.get_all_operations():
        operation = op.ok()
        if operation.method.upper() != "POST":
            continue

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @schemathesis_given(operation)
        def check(case):
            nonlocal tried
            if isinstance(case.body, dict):  # quick examples (the limit is 60,000 tokens); the rest is the fuzzer's
                case.body["max_tokens"] = case.body["max_completion_tokens"] = 4
            response = case.call(base_url=rel["base"], timeout=60)
            tried += 1
            if response.status_code >= 500:
                server_errors.append((operation.path, case.body, response.status_code, response.text[:200]))

        check()
    print(f"\nfuzzed {tried} examples, {len(server_errors)} server errors")
    assert tried >= 40
    assert not server_errors, server_errors[:3]
    assert requests.get(f"{rel['base']}/health", timeout=10).status_code == 200
    rel["fuzzed"] = tried


def schemathesis_given(operation):
    from hypothesis import given

    return given(case=operation.as_strategy())


def test_the_memory_is_saved_in_the_checked_format(rel):
    written = handle().save_memory.remote().result()
    assert written > 0  # the requests above taught it something
    trie = TokenTrie(rel["model"]["lookahead"].get("branch_length", 12) + 1)
    assert load_memory(rel["memory"], trie, handle().memory_info.remote().result()["tag"]) == written


def streamed_rate(base: str, body: dict, count: int) -> float:
    """Tokens a second one of `count` concurrent streams of `body` gets, the slowest of them, timed from its
    first token to its last (so start-up and queueing are not in it)."""
    def rate(_) -> float:
        r = requests.post(f"{base}/v1/completions", json=body, stream=True, timeout=CLIENT_TIMEOUT)
        assert r.status_code == 200, r.text[:200]
        events = [(time.monotonic(), json.loads(ln[6:])) for ln in r.iter_lines() if ln.startswith(b"data: {")]
        tokens = events[-1][1]["usage"]["completion_tokens"]  # an event may carry several tokens
        assert len(events) >= 3 and tokens > 1, events[-3:]
        return tokens / max(events[-1][0] - events[0][0], 1e-3)

    with ThreadPoolExecutor(count) as pool:
        return min(pool.map(rate, range(count)))


def spread(pool: ThreadPoolExecutor, base: str, body, count: int, replicas: int = 2) -> list:
    """Send requests one at a time, each once the engines hold the one before, until `count` are sent and every
    replica holds some (at most 2 x `count`). `body`: a dict, sent with its prompt numbered, or the i-th body
    for i. Requests that arrive together form one group, and a group goes to one replica: six sent at once
    once all landed on one, leaving the other nothing to drain."""
    nth = body if callable(body) else lambda i: {**body, "prompt": f"{body['prompt']} {i}"}
    futures, seen, last = [], [], {}

    def all_held() -> bool:  # every request sent is in an engine or answered (`last`: what each replica held)
        last.clear()
        last.update(replica_loads())
        return sum(last.values()) + sum(f.done() for f in futures) >= len(futures)

    while len(futures) < 2 * count:
        futures.append(pool.submit(outcome, base, nth(len(futures))))
        assert wait_for(all_held, 60), f"request {len(futures)} was not taken up: {last}"
        seen.append(dict(last))
        if len(futures) >= count and len(last) == replicas and min(last.values()) > 0:
            return futures
    raise AssertionError(f"{len(futures)} requests sent one at a time did not reach all {replicas} replicas: {seen}")


def test_scale_down_lets_in_flight_generations_finish(rel):
    """Redeploy with one replica fewer while long generations run: every one completes in full."""
    count, lasting_s = 6, 45
    probe = {"model": MODEL, "prompt": "how fast", "max_tokens": 1000, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, "lookahead": LONG}
    routed_to_every_replica(rel["base"])  # the ingress knows both replicas (the kill test replaced one)
    per_s = streamed_rate(rel["base"], probe, count)
    # each generation lasts ~45 s on this machine as it is now, fast or loaded: placing them takes seconds
    steps = int(min(max(per_s * lasting_s, 1000), rel["model"]["limits"]["max_new_tokens"]))
    with ThreadPoolExecutor(2 * count) as pool:
        futures = spread(pool, rel["base"], {**probe, "prompt": "long", "max_tokens": steps}, count)
        held = placed(futures, replica_loads)  # the replica that goes holds generations when it is told to go
        assert sum(held.values()) == len(futures), f"{held}: generations of {steps} steps at {per_s:.0f}/s ended early"
        smaller = {**rel["model"], "deployment": {**rel["model"]["deployment"], "num_replicas": 1}}
        started = time.monotonic()
        deploy(APP, {"models": [smaller], "ingress": {"max_body_bytes": 65536}})
        redeploy_s = time.monotonic() - started
        results = [f.result(timeout=ANSWER_TIMEOUT + 30) for f in futures]
    print(f"\nscale-down: {len(futures)} generations of {steps} steps at {per_s:.0f} tokens/s each, all in flight when "
          f"the redeploy began; it returned after {redeploy_s:.0f} s")
    assert results == ["ok"] * len(futures), (held, results)
    assert wait_for(lambda: running_replicas() == 1, 60)
    assert math.isfinite(handle().queue_length.remote().result())
