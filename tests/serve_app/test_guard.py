"""The guard in front of the endpoints: API keys (401, /health open) and the body cap (413), on a bare ASGI app."""

import asyncio
import json

import pytest

from serve_app import guard as guard_module
from serve_app.guard import Guard, load_keys


async def echo(scope, receive, send):
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(guard, path="/v1/completions", headers=(), chunks=(b"{}",), content_length=True):
    body = b"".join(chunks)
    hdrs = list(headers) + ([(b"content-length", str(len(body)).encode())] if content_length else [])
    scope = {"type": "http", "method": "POST", "path": path, "headers": hdrs}
    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    asyncio.run(guard(scope, receive, send))
    status = sent[0]["status"]
    out = b"".join(m.get("body", b"") for m in sent[1:])
    return status, out, dict(sent[0]["headers"])


def test_keys_from_env_and_file(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    f.write_text("# ops keys\nfile-key-1\n\n  file-key-2  # rotated 2026-11\n")
    monkeypatch.setenv("MY_KEYS", "env-a, env-b,")
    assert load_keys("MY_KEYS", str(f)) == (b"env-a", b"env-b", b"file-key-1", b"file-key-2")
    assert load_keys("UNSET_VAR_XYZ", None) == ()


def test_api_keys_gate_everything_but_health():
    g = Guard(echo, lambda: (1024, (b"s3cret",)))
    status, body, headers = call(g)
    assert status == 401 and json.loads(body)["error"]["param"] == "authorization"
    assert headers[b"www-authenticate"] == b"Bearer"
    assert call(g, headers=[(b"authorization", b"Bearer wrong")])[0] == 401
    assert call(g, headers=[(b"authorization", b"s3cret")])[0] == 401
    assert call(g, headers=[(b"authorization", b"Bearer s3cret")])[:2] == (200, b"{}")
    assert call(g, path="/health")[0] == 200
    assert call(g, path="/stats")[0] == 401  # the replicas' memory and queue are for operators, behind the key
    assert call(g, path="/stats", headers=[(b"authorization", b"Bearer s3cret")])[0] == 200


def test_no_keys_means_open():
    assert call(Guard(echo, lambda: (1024, ())))[0] == 200


@pytest.mark.parametrize("content_length", [True, False])
def test_body_cap(content_length):
    g = Guard(echo, lambda: (1024, ()))
    status, body, _ = call(g, chunks=(b"x" * 600, b"y" * 600), content_length=content_length)
    assert status == 413 and json.loads(body)["error"]["param"] == "body"
    status, body, _ = call(g, chunks=(b"x" * 500, b"y" * 500), content_length=content_length)
    assert status == 200 and body == b"x" * 500 + b"y" * 500  # under the cap the app sees the whole body


def events(guard, chunks, headers=(), content_length=True):
    """Every receive and send the guard made, in order, for a POST of `chunks` (Content-Length or chunked)."""
    body = b"".join(chunks)
    length = [(b"content-length", str(len(body)).encode())] if content_length else []
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [*length, *headers]}
    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    log = []

    async def receive():
        log.append(("receive", len(msgs)))
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(msg):
        log.append(("send", msg.get("status"), dict(msg.get("headers", []))))

    asyncio.run(guard(scope, receive, send))
    return log


@pytest.mark.parametrize("content_length", [True, False])
def test_an_over_cap_body_is_read_to_its_end_before_the_413(content_length):
    """The client is still sending: the guard takes every chunk (and drops it) before it answers, so the
    server never closes under a client mid-upload (a reset, no status)."""
    log = events(Guard(echo, lambda: (1024, ())), [b"x" * 700] * 6, content_length=content_length)
    receives = [e for e in log if e[0] == "receive"]
    assert len(receives) == 6 and log[-2][0] == "send" and log[-2][1] == 413  # all six chunks, then the answer
    assert b"connection" not in log[-2][2]  # drained: the connection stays usable


def test_a_client_waiting_for_100_continue_is_answered_at_once():
    log = events(Guard(echo, lambda: (1024, ())), [b"x" * 700] * 6, headers=[(b"expect", b"100-continue")])
    assert [e[0] for e in log] == ["send", "send"] and log[0][1] == 413  # nothing read: it has sent nothing


def test_past_the_drain_bound_the_413_goes_out_at_once(monkeypatch):
    """A body far over the cap is not read to its end here: the HTTP server discards the rest after the answer."""
    monkeypatch.setattr(guard_module, "DRAIN_BYTES", 2000)
    log = events(Guard(echo, lambda: (1024, ())), [b"x" * 700] * 20)
    assert sum(e[0] == "receive" for e in log) == 3  # 2,100 bytes read: past the bound, it stops
    assert log[-2][1] == 413 and b"connection" not in log[-2][2]  # not closed under the client


def test_a_chunked_body_over_the_cap_in_its_last_message_is_answered_without_waiting_for_more():
    """Ray's proxy (with its own guard in front) may hand the whole body over in one message: nothing is left
    to drain, and waiting for more would hang, as a server's receive does until the response is complete."""
    msgs = [{"type": "http.request", "body": b"x" * 5000, "more_body": False}]
    sent = []

    async def receive():
        if msgs:
            return msgs.pop(0)
        await asyncio.Event().wait()  # a real server: nothing until the response is complete

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(asyncio.wait_for(Guard(echo, lambda: (1024, ()))(scope, receive, send), timeout=5))
    assert sent[0]["status"] == 413
