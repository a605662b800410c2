"""One model as the ingress sees it: dynamic batching into groups, one streaming call per group.

Requests for the model that arrive within `batch_wait_timeout_s` of each
other (up to `max_batch_size`) form a group through `@serve.batch`; the group
goes to one model replica in a single streaming call, whose engine merges it
into its running batch. Groups run concurrently (`max_concurrent_batches`),
so a group never waits for an earlier one to finish: the engine, not the
ingress, decides who shares a forward. With prefix-affinity routing (the
default) every request is a group of one, so the router places each by its
own prompt (serve_app/prefix_router.py).

`JobStream` is one request's view: its events, in order, and `cancel()`,
which posts the request id to the cancel board so the replica stops just
that request. A failure of the call (overload, a dead replica) ends every
unfinished request of the group with an error event; none is left hanging.
"""

import asyncio
import contextvars
import logging

from ray import serve
from ray.serve.exceptions import BackPressureError

from .config import ModelConfig
from .jobs import Event, Job, JobError

log = logging.getLogger("ray.serve")


MAX_ATTEMPTS = 2  # calls per group: the first, and one more for requests a dead replica never started


def _call_error(e: BaseException) -> JobError:
    """The answer for the group's unfinished requests when its call fails."""
    if isinstance(e, BackPressureError):
        return JobError(503, "the model's queue is full; retry later", type="overloaded")
    log.warning("group call failed: %s: %s", type(e).__name__, e)
    return JobError(503, f"the model replica failed ({type(e).__name__}); retry", type="server_error")


def _detached(call, *args):
    """Make a handle call that belongs to no one HTTP request.

    Ray links a call made while serving a request to that request (Serve's
    request context, and Ray's own per-coroutine task id, both contextvars)
    and cancels it when that client disconnects. A group's call is made from
    the batch task, in the context of one of its requests; linked, one
    client's disconnect would cancel the whole group. So the call is made in
    an empty context: requests leave a group only through the cancel board.
    """
    return contextvars.Context().run(call, *args)


class ModelRoute:
    def __init__(self, cfg: ModelConfig, handle, board, max_requests: int = 1000) -> None:
        self.cfg = cfg
        self.handle = handle.options(stream=True)
        self.board = board
        b = cfg.batching
        self.batcher = serve.batch(max_batch_size=b.max_batch_size, batch_wait_timeout_s=b.batch_wait_timeout_s,
                                   max_concurrent_batches=max(1, max_requests // b.max_batch_size))(self._run_group)
        # Prefix-affinity routing picks a replica per prompt, so each request is its own call: a group of mixed
        # prompts could only follow one of them. (The replica's engine batches them all the same.)
        self.per_request = cfg.routing == "prefix_affinity"

    def set_batching(self, max_batch_size: int | None = None, batch_wait_timeout_s: float | None = None) -> None:
        if max_batch_size is not None:
            self.batcher.set_max_batch_size(max_batch_size)
        if batch_wait_timeout_s is not None:
            self.batcher.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def submit(self, job: Job) -> "JobStream":
        return JobStream(job, self)

    async def events(self, job: Job):
        """One job's lists of new events: through the batcher's group, or a call of its own."""
        if not self.per_request:
            async for events in self.batcher(job):
                yield events
            return
        async for out in self._run_group([job]):
            if out[0] is StopIteration:
                return
            yield out[0]

    async def _run_group(self, jobs: list[Job]):
        """serve.batch generator: each yield has one entry per job: its new events, or StopIteration once done.

        If the call fails (its replica died, say), the jobs that have sent their
        client nothing yet are sent again, to whichever replica Serve picks
        (up to MAX_ATTEMPTS calls); the others end with an error event.
        """
        n = len(jobs)
        done = [False] * n
        spoke = [False] * n  # text (or the end) went to the client: too late to run it elsewhere
        pending = list(range(n))
        for attempt in range(1, MAX_ATTEMPTS + 1):
            error: JobError | None = None
            retriable = False
            try:
                call = _detached(self.handle.generate_group.remote, [jobs[i] for i in pending], self.board)
                async for events in call:
                    out: list[list[Event]] = [[] for _ in range(n)]
                    for e in events:
                        e.index = pending[e.index]  # the call numbers its own jobs
                        out[e.index].append(e)
                    yield [StopIteration if done[i] else out[i] for i in range(n)]
                    for e in events:
                        done[e.index] = done[e.index] or e.final
                        spoke[e.index] = spoke[e.index] or e.final or bool(e.text)
            except asyncio.CancelledError as e:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this task itself is being cancelled (shutdown)
                error, retriable = _call_error(e), True  # cancelled from elsewhere: its requests still need answers
            except Exception as e:  # noqa: BLE001 - every failure must reach the group's clients
                error, retriable = _call_error(e), not isinstance(e, BackPressureError)
            left = [i for i in pending if not done[i]]
            if not left:
                return
            error = error or JobError(502, "the model replica ended the stream early", type="server_error")
            again = [i for i in left if not spoke[i]] if retriable and attempt < MAX_ATTEMPTS else []
            if again:
                log.warning("group call failed (%s); sending %d unstarted requests again", error.message, len(again))
            failed = set(left) - set(again)
            if failed:
                yield [StopIteration if done[i] else ([Event(i, error=error)] if i in failed else [])
                       for i in range(n)]
                for i in failed:
                    done[i] = True
            if not again:
                return
            pending = again


class JobStream:
    def __init__(self, job: Job, route: ModelRoute) -> None:
        self.job = job
        self.route = route
        self.finished = False

    async def __aiter__(self):
        async for events in self.route.events(self.job):
            for e in events:
                self.finished = self.finished or e.final
                yield e

    def cancel(self) -> None:
        """The client went away: stop this request only (no-op once it has finished)."""
        if not self.finished:
            self.finished = True
            log.info("client gone: cancelling %s", self.job.request_id)
            # Detached too: posted from the request Ray is cancelling, a linked call could be cancelled with it.
            _detached(self.route.board.cancel.remote, [self.job.request_id])
