"""A group's call failing: unstarted requests go again (once), started ones end with an error; none is left open.

The model replica is faked here (the point is the ingress's bookkeeping, not
the model): each call yields scripted event lists, then fails or ends.
"""

import asyncio

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from serve_app.config import ModelConfig
from serve_app.jobs import Event, Job
from serve_app.route import ModelRoute


class FakeCall:
    def __init__(self, script, error):
        self.script, self.error = script, error

    def __aiter__(self):
        return self._run()

    async def _run(self):
        for events in self.script:
            yield events
        if self.error is not None:
            raise self.error


class FakeHandle:
    """`generate_group.remote(jobs, board)` plays the next scripted call; records which jobs each call got."""

    def __init__(self, calls):
        self.calls, self.seen = list(calls), []
        self.generate_group = self

    def options(self, **_):
        return self

    def remote(self, jobs, board):
        self.seen.append([j.request_id for j in jobs])
        script, error = self.calls.pop(0)
        return FakeCall(script(jobs), error)


def run(route, jobs):
    async def go():
        rounds = []
        async for entries in route._run_group(jobs):
            rounds.append(entries)
        return rounds
    return asyncio.run(go())


def per_job(rounds, n):
    out = [[] for _ in range(n)]
    for entries in rounds:
        assert len(entries) == n
        for i, e in enumerate(entries):
            if e is not StopIteration:
                out[i].extend(e)
    return out


JOBS = [Job(request_id=f"r{i}") for i in range(3)]
CFG = ModelConfig(name="m", model="x")


def test_dead_replica_unstarted_requests_are_sent_again():
    first = lambda jobs: [[Event(i, started=True) for i in range(len(jobs))], [Event(0, text="Hel")]]  # noqa: E731
    second = lambda jobs: [[Event(i, started=True) for i in range(len(jobs))],  # noqa: E731
                           [Event(i, text="ok", finish_reason="length") for i in range(len(jobs))]]
    handle = FakeHandle([(first, RayActorError()), (second, None)])
    got = per_job(run(ModelRoute(CFG, handle, board=None), JOBS), 3)
    assert handle.seen == [["r0", "r1", "r2"], ["r1", "r2"]]  # r0 had spoken: not sent again
    assert got[0][-1].error is not None and got[0][-1].error.status == 503
    for i in (1, 2):
        assert got[i][-1].finish_reason == "length" and got[i][-1].text == "ok" and got[i][-1].index == i


def test_overload_is_not_retried_and_a_second_failure_ends_everyone():
    nothing = lambda jobs: []  # noqa: E731
    handle = FakeHandle([(nothing, BackPressureError(num_queued_requests=9, max_queued_requests=8))])
    got = per_job(run(ModelRoute(CFG, handle, board=None), JOBS), 3)
    assert len(handle.seen) == 1 and all(g[-1].error.type == "overloaded" for g in got)

    handle = FakeHandle([(nothing, RayActorError()), (nothing, RayActorError())])
    got = per_job(run(ModelRoute(CFG, handle, board=None), JOBS), 3)
    assert len(handle.seen) == 2 and all(g[-1].error.status == 503 for g in got)


def test_a_stream_that_ends_early_is_an_error_not_a_success():
    short = lambda jobs: [[Event(0, text="partial")]]  # noqa: E731
    got = per_job(run(ModelRoute(CFG, FakeHandle([(short, None)]), board=None), JOBS[:1]), 1)
    assert got[0][-1].error is not None and got[0][-1].error.status == 502


def test_with_prefix_affinity_each_request_is_its_own_call():
    """The router places a call by its first job's prompt: a request sharing a call could not go its own way."""
    done = lambda jobs: [[Event(0, started=True)], [Event(0, text="ok", finish_reason="stop")]]  # noqa: E731

    async def go(route):
        streams = [route.submit(j) for j in JOBS]

        async def drain(s):
            return [e async for e in s]
        return await asyncio.gather(*(drain(s) for s in streams))

    handle = FakeHandle([(done, None)] * 3)
    got = asyncio.run(go(ModelRoute(CFG, handle, board=None)))
    assert sorted(handle.seen) == [["r0"], ["r1"], ["r2"]]
    assert all(events[-1].finish_reason == "stop" and events[-1].index == 0 for events in got)
    # pow2 keeps serve.batch's groups (which need a Serve replica around them: tests/serve_app/test_server.py)
    assert not ModelRoute(ModelConfig(name="m", model="x", routing="pow2"), handle, board=None).per_request
