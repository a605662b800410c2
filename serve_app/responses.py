"""OpenAI response shapes: whole completions, SSE chunks, and error bodies.

Besides OpenAI's fields, every completion (and the last chunk of a stream)
carries `lookahead`: the request's verification steps, mean tokens accepted
per step, and draft tokens verified / accepted. Clients that do not know the
field ignore it.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.responses import JSONResponse, StreamingResponse

from .jobs import JobError, Usage


@dataclass
class Completion:
    """What one request produced, gathered from its events."""

    id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    lookahead: dict = field(default_factory=dict)

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def body(self) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text}, "logprobs": None,
                      "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None, "finish_reason": self.finish_reason}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage.as_dict() if self.usage else None,
                "lookahead": self.lookahead}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        if finish_reason is not None:
            out["lookahead"] = self.lookahead
        return out

    def usage_chunk(self) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [],
                "usage": self.usage.as_dict() if self.usage else None}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


KEEPALIVE = ": keepalive\n\n"  # an SSE comment: every client ignores it; it only keeps bytes flowing


async def with_keepalive(events: AsyncIterator, period_s: float) -> AsyncIterator:
    """`events`, with a None wherever `period_s` passes without one (the stream then sends `KEEPALIVE`).

    A stream can be silent for long: queued behind other generations, or re-sent to another replica after
    its first one died. A client (or proxy) that times out between bytes should learn that the server is
    gone, not that the queue is long. The pending `__anext__` is awaited, never cancelled, between beats.
    """
    it = events.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=period_s)
            if not done:
                yield None
                continue
            fut, pending = pending, None
            try:
                event = fut.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None and not pending.done():
            pending.cancel()


def error_response(err: JobError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that calls `on_close` however it ends: done, failed, or the client gone.

    The body generator's own `finally` is not enough: when the disconnect
    lands while the response is writing rather than waiting on the generator,
    the generator is left suspended until garbage collection.
    """

    def __init__(self, content, on_close, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
