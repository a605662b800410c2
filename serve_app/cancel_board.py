"""Cancelling one request of a group that is streaming from a model replica.

A group travels to its replica in a single streaming call, so cancelling that
call would cancel the whole group. Instead each ingress replica owns a small
async Ray actor, its board, and passes the board's handle along with every
group. When a client disconnects, the ingress posts the request's id; the
replica serving that group long-polls the board for its groups' ids and
cancels just those requests in its engine, which frees their batch rows.

Ids are forgotten after `ttl_s`, so a board holds only recent cancellations.
"""

import asyncio
import time

import ray


@ray.remote(num_cpus=0, max_concurrency=10_000)
class CancelBoard:
    def __init__(self, ttl_s: float = 600.0) -> None:
        self.ttl_s = ttl_s
        self.cancelled: dict[str, float] = {}  # request id -> when posted
        self.changed = asyncio.Event()

    async def cancel(self, request_ids: list[str]) -> None:
        now = time.monotonic()
        for rid in request_ids:
            self.cancelled[rid] = now
        self.cancelled = {r: t for r, t in self.cancelled.items() if now - t < self.ttl_s}
        self.changed.set()
        self.changed = asyncio.Event()

    async def watch(self, request_ids: list[str], timeout_s: float) -> list[str]:
        """Those of `request_ids` that are cancelled; waits up to `timeout_s` for one to be."""
        deadline = time.monotonic() + timeout_s
        while True:
            hits = [r for r in request_ids if r in self.cancelled]
            left = deadline - time.monotonic()
            if hits or left <= 0:
                return hits
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def size(self) -> int:
        return len(self.cancelled)
