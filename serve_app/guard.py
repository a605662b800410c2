"""What every HTTP request passes before the endpoints: a body-size cap and, when configured, API keys.

API keys are never in a config file that gets committed: they come from the
environment variable named by `ingress.api_keys_env` (comma-separated) and/or
the file named by `ingress.api_keys_file` (one key per line, `#` comments).
With no keys configured the API is open. With keys, every path but `/health`
needs `Authorization: Bearer <key>`; otherwise 401. Keys are compared in
constant time.

The body cap answers 413 before the body is parsed: at once from
`Content-Length`, or, for a chunked body, as soon as the bytes read pass it.
"""

import hmac
import json
import os
from pathlib import Path

OPEN_PATHS = {"/health"}


def load_keys(env_name: str | None, file: str | None) -> tuple[bytes, ...]:
    keys: list[str] = []
    if env_name and os.environ.get(env_name):
        keys += [k.strip() for k in os.environ[env_name].split(",")]
    if file:
        for line in Path(file).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return tuple(k.encode() for k in keys if k)


def _error(status: int, message: str, param: str | None, type_: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": message, "type": type_, "param": param, "code": status}}).encode()


class Guard:
    """ASGI middleware: `Guard(app, settings)`, where `settings()` gives (max_body_bytes, keys) at request time."""

    def __init__(self, app, settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap, keys = self.settings()
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if keys and path not in OPEN_PATHS and not self._authorized(scope, keys):
            return await self._reply(send, *_error(401, "missing or invalid API key (Authorization: Bearer ...)",
                                                   "authorization", "authentication_error"),
                                     extra=[(b"www-authenticate", b"Bearer")])
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            return await self._reply(send, *_error(413, f"request body over {cap} bytes", "body",
                                                   "invalid_request_error"))
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            body, too_big = await self._read_capped(receive, cap)
            if too_big:
                return await self._reply(send, *_error(413, f"request body over {cap} bytes", "body",
                                                       "invalid_request_error"))
            receive = self._replay(body, receive)
        return await self.app(scope, receive, send)

    @staticmethod
    def _authorized(scope, keys: tuple[bytes, ...]) -> bool:
        auth = dict(scope.get("headers") or []).get(b"authorization", b"")
        if not auth.lower().startswith(b"bearer "):
            return False
        given = auth[7:].strip()
        return any(hmac.compare_digest(given, k) for k in keys)

    @staticmethod
    async def _read_capped(receive, cap: int) -> tuple[bytes, bool]:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return b"".join(chunks), False
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > cap:
                return b"", True
            if not msg.get("more_body", False):
                return b"".join(chunks), False

    @staticmethod
    def _replay(body: bytes, receive):
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    @staticmethod
    async def _reply(send, status: int, body: bytes, extra=()) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *extra]})
        await send({"type": "http.response.body", "body": body})
