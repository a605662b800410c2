"""The guard in front of the endpoints: API keys (401, /health open) and the body cap (413), on a bare ASGI app."""

import asyncio
import json

import pytest

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
