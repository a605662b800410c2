"""What every HTTP request passes before the endpoints: a body-size cap and, when configured, API keys.

API keys are never in a config file that gets committed: they come from the
environment variable named by `ingress.api_keys_env` (comma-separated) and/or
the file named by `ingress.api_keys_file` (one key per line, `#` comments).
With no keys configured the API is open. With keys, every path but `/health`
needs `Authorization: Bearer <key>`; otherwise 401. Keys are compared in
constant time.

The body cap answers 413 before the body is parsed: from `Content-Length`,
or, for a chunked body, once the bytes read pass it. A client that sent a
body too big is still sending it when the server decides, and a server that
closes then resets the connection under it: the client reads no answer at
all, and its retry logic resends the same body. So the guard first reads and
discards the rest of the body, chunk by chunk, up to `DRAIN_BYTES` past the
cap: the answer then goes out once the client has sent everything. Past that
bound the 413 goes out at once, on a connection kept open: the HTTP server
(uvicorn, in Ray Serve's proxy) reads and discards what is still coming once
a response is complete, and does not close while data arrives. A client that
asked `Expect: 100-continue` has sent nothing yet and is answered at once.
"""

import hmac
import json
import os
from pathlib import Path

OPEN_PATHS = {"/health"}
DRAIN_BYTES = 16 << 20  # of an over-cap body read and discarded here before the 413 (the rest by the HTTP server)


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

    def __init__(self, app, settings, drain_bytes: int | None = None) -> None:
        self.app = app
        self.settings = settings
        self.drain_bytes = drain_bytes  # None: DRAIN_BYTES, read at request time

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
            return await self._refuse(receive, send, cap, headers, 0)
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            body, read, too_big, ended = await self._read_capped(receive, cap)
            if too_big:
                return await self._refuse(receive, send, cap, headers, read, ended)
            receive = self._replay(body, receive)
        return await self.app(scope, receive, send)

    async def _refuse(self, receive, send, cap: int, headers: dict, read: int, ended: bool = False) -> None:
        """413 for a body over `cap`, `read` bytes of it read so far (all of it when `ended`): the rest is drained
        first (module doc)."""
        if not ended and not (headers.get(b"expect", b"").lower() == b"100-continue" and not read):
            await self._drain(receive, DRAIN_BYTES if self.drain_bytes is None else self.drain_bytes)
        await self._reply(send, *_error(413, f"request body over {cap} bytes", "body", "invalid_request_error"))

    @staticmethod
    def _authorized(scope, keys: tuple[bytes, ...]) -> bool:
        auth = dict(scope.get("headers") or []).get(b"authorization", b"")
        if not auth.lower().startswith(b"bearer "):
            return False
        given = auth[7:].strip()
        return any(hmac.compare_digest(given, k) for k in keys)

    @staticmethod
    async def _read_capped(receive, cap: int) -> tuple[bytes, int, bool, bool]:
        """(the body, bytes read, whether it passed `cap`: then the body is dropped and reading stops there,
        whether the body ended)."""
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return b"".join(chunks), size, False, True
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            ended = not msg.get("more_body", False)
            if size > cap:
                return b"", size, True, ended
            if ended:
                return b"".join(chunks), size, False, True

    @staticmethod
    async def _drain(receive, bound: int) -> bool:
        """Read and discard the request's body to its end (True), or until `bound` bytes more (False)."""
        size = 0
        while size <= bound:
            msg = await receive()
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                return True  # the end, or the client has gone: nothing more will come
            size += len(msg.get("body", b""))
        return False

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
