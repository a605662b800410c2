"""A body over the cap gets a readable 413, at any size, every time, through the real Ray Serve HTTP proxy.

A reset instead of a status looks like a crashed server, and retry logic resends the same body: every one of
these requests must read the OpenAI-shaped 413 naming the limit, with Content-Length and chunked framing, on
the streaming and the non-streaming endpoint. The model is beside the point (a tiny random one)."""

import json
import socket
import subprocess
from urllib.parse import urlsplit

import pytest
import requests

from serve_app.proxy_guard import proxy_cap
from tests.serving import deploy

APP = "bodycap"
CAP = 1 << 20
SIZES_MB = (2, 8, 32, 128)
REPEATS = 10


@pytest.fixture(scope="module")
def base(serve_url, tiny_llama_dir):
    from ray import serve

    model = {"name": "tiny", "model": tiny_llama_dir, "dtype": "float32", "device": "cpu", "torch_threads": 1,
             "deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.5}}}
    prefix = deploy(APP, {"ingress": {"max_body_bytes": CAP}, "models": [model]})
    yield serve_url + prefix
    serve.delete(APP)


def rss_mib(title: str) -> float:
    """Resident memory of the Ray worker whose process title names `title` (one process)."""
    out = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 1) for line in out.splitlines() if f"ray::{title}" in line]
    assert len(rows) == 1, rows
    return int(rows[0][0]) / 1024


def post(base: str, payload: bytes, chunked: bool, stream: bool) -> requests.Response:
    path = "/v1/completions" if stream else "/v1/chat/completions"
    data = (payload[i : i + (1 << 20)] for i in range(0, len(payload), 1 << 20)) if chunked else payload
    return requests.post(base + path, data=data, headers={"Content-Type": "application/json"}, timeout=300)


def body(size: int, stream: bool) -> bytes:
    """A real request whose one message makes the body `size` bytes."""
    shell = {"model": "tiny", "max_tokens": 4, "stream": stream}
    if stream:
        shell["prompt"] = ""
    else:
        shell["messages"] = [{"role": "user", "content": ""}]
    pad = size - len(json.dumps(shell))
    if stream:
        shell["prompt"] = "x" * pad
    else:
        shell["messages"][0]["content"] = "x" * pad
    return json.dumps(shell).encode()


def test_every_oversized_body_reads_a_413_and_the_server_stays_healthy(base):
    payloads = {(mb, s): body(mb << 20, s) for mb in SIZES_MB for s in (False, True)}
    before = {t: rss_mib(t) for t in ("ProxyActor", f"ServeReplica:{APP}:Ingress")}
    outcomes: dict[tuple, list] = {}
    for mb in SIZES_MB:
        for chunked in (False, True):
            got = outcomes[mb, "chunked" if chunked else "content-length"] = []
            for i in range(REPEATS):
                stream = i % 2 == 1  # the streaming and the non-streaming endpoint alike
                try:
                    r = post(base, payloads[mb, stream], chunked, stream)
                except requests.ConnectionError as e:  # a reset: no status read at all
                    got.append(f"no status: {e}")
                    continue
                err = r.json()["error"] if r.status_code == 413 else None
                # the limit that refused it: the app's, or, far past it, the proxy's own (proxy_guard.py)
                limit = CAP if mb << 20 <= proxy_cap() else proxy_cap()
                ok = err is not None and err["param"] == "body" and f"over {limit} bytes" in err["message"]
                got.append("413" if ok else f"{r.status_code}: {r.text[:100]}")
    bad = {k: [o for o in v if o != "413"] for k, v in outcomes.items() if any(o != "413" for o in v)}
    assert not bad, bad
    assert requests.get(base + "/health", timeout=30).status_code == 200
    r = requests.post(base + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
                      timeout=300)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    # 3.4 GB were sent: neither the proxy nor the ingress grew by even the smallest body's size (2 MB x 8)
    grown = {t: rss_mib(t) - mib for t, mib in before.items()}
    assert all(g < 16 for g in grown.values()), grown


def test_a_client_that_expects_100_continue_is_answered_before_it_sends(base):
    """It sends the headers, then waits: the 413 must come without a byte of the body."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(f"POST {url.path}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {8 << 20}\r\nExpect: 100-continue\r\n\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
