"""SSE keepalives: a silent stream beats, the events themselves pass through whole and in order."""

import asyncio

import pytest

from serve_app.responses import KEEPALIVE, sse, with_keepalive


class Gated:
    """An event source that says nothing until the test opens its gate; then it yields its events and ends."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.gate = asyncio.Event()
        self.cancelled = False
        self.finished = False

    async def __aiter__(self):
        try:
            await self.gate.wait()
            for item in self.items:
                yield item
            self.finished = True
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def test_a_silent_source_beats_then_its_events_arrive_whole_and_in_order():
    async def go():
        source = Gated(["a", "b", "c"])
        seen = []
        async for e in with_keepalive(source, 0.01):
            seen.append(e)
            if seen.count(None) == 3:
                source.gate.set()  # three beats while silent; the wait between them was never cancelled
        return source, seen

    source, seen = asyncio.run(go())
    assert seen[:3] == [None, None, None]
    assert [e for e in seen if e is not None] == ["a", "b", "c"]
    assert source.finished and not source.cancelled


def test_a_source_that_keeps_talking_never_beats():
    async def talk():
        for i in range(50):
            await asyncio.sleep(0)
            yield i

    async def go():
        return [e async for e in with_keepalive(talk(), 60)]

    assert asyncio.run(go()) == list(range(50))


def test_closing_the_stream_cancels_the_pending_wait():
    """The client went away mid-silence: the source's pending read is cancelled, not left suspended."""
    async def go():
        source = Gated(["never"])
        beats = with_keepalive(source, 0.01)
        assert await beats.__anext__() is None
        await beats.aclose()
        await asyncio.sleep(0)  # the cancelled read runs its handler
        return source.cancelled, source.finished  # now: asyncio.run cancels whatever is left once go returns

    assert asyncio.run(go()) == (True, False)


def test_a_source_error_reaches_the_stream():
    async def broken():
        await asyncio.sleep(0.03)
        raise RuntimeError("replica gone")
        yield  # noqa: unreachable - makes this an async generator

    async def go():
        return [e async for e in with_keepalive(broken(), 0.01)]

    with pytest.raises(RuntimeError, match="replica gone"):
        asyncio.run(go())


def test_openais_client_skips_the_keepalives():
    streaming = pytest.importorskip("openai._streaming")
    wire = [KEEPALIVE.encode(), sse({"n": 1}).encode(), KEEPALIVE.encode(), sse("[DONE]").encode()]
    assert [e.data for e in streaming.SSEDecoder().iter_bytes(iter(wire))] == ['{"n": 1}', "[DONE]"]
