"""The proxy's own body cap: what Ray installs through RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, and its setting."""

import asyncio

import pytest
from starlette.middleware import Middleware

from serve_app import proxy_guard
from serve_app.guard import Guard


def test_the_callback_gives_ray_one_guard_with_the_proxy_cap(monkeypatch):
    monkeypatch.setenv(proxy_guard.PROXY_CAP_ENV, "4096")
    (mw,) = proxy_guard.middlewares()
    assert isinstance(mw, Middleware) and mw.cls is Guard
    guard = mw.cls(None, *mw.args, **mw.kwargs)
    assert guard.settings() == (4096, ()) and guard.drain_bytes == proxy_guard.PROXY_DRAIN_BYTES
    monkeypatch.delenv(proxy_guard.PROXY_CAP_ENV)
    assert proxy_guard.proxy_cap() == 1 << 20  # ingress.max_body_bytes's default


@pytest.mark.parametrize("raw", ["1MB", "-5", "100", ""])
def test_a_bad_cap_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(proxy_guard.PROXY_CAP_ENV, raw)
    with pytest.raises(ValueError, match=proxy_guard.PROXY_CAP_ENV):
        proxy_guard.proxy_cap()


def test_in_the_proxy_a_refused_body_is_read_to_its_end_and_the_app_never_called(monkeypatch):
    monkeypatch.setenv(proxy_guard.PROXY_CAP_ENV, "1024")
    (mw,) = proxy_guard.middlewares()
    called = []

    async def app(scope, receive, send):
        called.append(scope)

    msgs = [{"type": "http.request", "body": b"x" * 65536, "more_body": i < 99} for i in range(100)]
    sent = []

    async def receive():
        return msgs.pop(0)

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", str(100 * 65536).encode())]}
    asyncio.run(mw.cls(app, *mw.args, **mw.kwargs)(scope, receive, send))
    assert not called and not msgs and sent[0]["status"] == 413  # all 6.5 MB drained, then the answer
