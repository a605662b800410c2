"""Deploying the app on the session's Ray Serve (fixture `serve_url` in tests/conftest.py), waiting on it,
and the clients the serving tests share: a request's outcome, streams held open, requests placed on replicas."""

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import requests

CLIENT_TIMEOUT = 120  # no request of a serving test waits longer for a byte: a hang fails the test
# ...except a non-streamed request, whose first byte is its whole answer: after the generations queued before it
# on a replica, thousands of steps each, at however fast the machine steps.
ANSWER_TIMEOUT = 600
# A request's lookahead settings for a generation that must last: one token per step. With drafts, a tiny random
# model's loops (learnt by the output memory from earlier tests) are accepted dozens of tokens a step, and
# thousands of tokens end in milliseconds, before a test can act while they run.
LONG = {"enabled": False}


def deploy(name: str, args: dict) -> str:
    """Deploy the app under /<name>; returns its base URL path prefix."""
    from ray import serve

    from serve_app.builder import build_app
    from serve_app.config import AppConfig

    serve.run(build_app(AppConfig.model_validate(args)), name=name, route_prefix=f"/{name}")
    return f"/{name}"


def smollm2_model(name: str = "smollm2", **overrides) -> dict:
    base = {
        "name": name,
        "model": "smollm2-135m-instruct",
        "dtype": "float32",
        "device": "cpu",
        "torch_threads": 2,
        "batching": {"max_batch_size": 8, "batch_wait_timeout_s": 0.05},
        "limits": {"max_prompt_tokens": 1024, "max_new_tokens": 512, "default_max_tokens": 32},
        "deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 1}, "graceful_shutdown_timeout_s": 5},
    }
    for k, v in overrides.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def wait_for(cond, timeout: float) -> bool:
    """Poll `cond` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.25)
    return False


def outcome(base: str, body: dict) -> str:
    """'ok' (complete), 'error' (a status or event with a JSON error body); raises on a hang or a truncation."""
    stream = body.get("stream", False)
    r = requests.post(f"{base}/v1/completions", json=body, stream=stream,
                      timeout=CLIENT_TIMEOUT if stream else ANSWER_TIMEOUT)
    if r.status_code != 200:
        assert r.status_code >= 400 and "error" in r.json(), (r.status_code, r.text[:200])
        return f"error-{r.status_code}"
    if not body.get("stream"):
        data = r.json()
        assert data["choices"][0]["finish_reason"] in ("stop", "length"), data
        assert len(data["choices"][0]["text"]) > 0 or data["usage"]["completion_tokens"] > 0
        return "ok"
    lines = [ln for ln in r.iter_lines() if ln.startswith(b"data: ")]
    if lines and b'"error"' in lines[-1]:
        assert "message" in json.loads(lines[-1][6:])["error"]
        return "error-event"
    assert lines and lines[-1] == b"data: [DONE]", f"truncated stream presented as success: {lines[-2:]}"
    finishes = [json.loads(ln[6:])["choices"][0]["finish_reason"] for ln in lines[:-1]
                if json.loads(ln[6:]).get("choices")]
    assert finishes[-1] in ("stop", "length")
    return "ok"


def placed(futures, loads, replicas: int = 2) -> dict[str, int]:
    """Wait until every request is held by a replica's engine or already answered, with each of `replicas`
    holding some; returns the requests each held then. `loads()` gives {replica: requests in its engine}."""
    held: dict[str, int] = {}

    def all_placed() -> bool:
        held.clear()
        held.update(loads())
        done = sum(f.done() for f in futures)
        return len(held) == replicas and min(held.values()) > 0 and sum(held.values()) + done == len(futures)

    assert wait_for(all_placed, 60), f"the requests were not all placed on {replicas} replicas: {held}"
    return held


class HeldStreams:
    """Streamed requests held open until the test lets go, so a load lasts as long as the test needs it,
    however fast the machine generates. Letting go shuts each connection down, which cancels its request
    on the replica, whether it was generating or still queued."""

    def __init__(self, base: str, path: str, body: dict, count: int) -> None:
        self.url, self.count = urlsplit(base), count
        self.path, self.payload = self.url.path + path, json.dumps(body).encode()
        self.conns: list[http.client.HTTPConnection] = []
        self.released = threading.Event()
        self.chunks: list[int] = []  # stream chunks each request has received so far
        self.statuses: list[int | None] = []  # each request's HTTP status once its headers came
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def add(self) -> None:
        """Open one more held stream (`count` open on entering; more one at a time, so each can be placed
        before the next is sent)."""
        i = len(self.conns)
        self.conns.append(http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=300))
        self.chunks.append(0)
        self.statuses.append(None)
        self.threads.append(threading.Thread(target=self._hold, args=(i,), daemon=True))
        self.threads[i].start()

    def _hold(self, i: int) -> None:
        try:
            self.conns[i].request("POST", self.path, body=self.payload, headers={"Content-Type": "application/json"})
            response = self.conns[i].getresponse()
            self.statuses[i] = response.status
            while line := response.readline():
                self.chunks[i] += line.startswith(b"data: {")
            if not self.released.is_set():
                self.errors.append(f"stream {i} ended before the test let go")
        except (OSError, http.client.HTTPException) as e:
            if not self.released.is_set():
                self.errors.append(f"stream {i}: {e!r}")

    def __enter__(self) -> "HeldStreams":
        for _ in range(self.count):
            self.add()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        for conn in self.conns:
            if conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(30)
