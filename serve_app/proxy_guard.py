"""The body cap inside Ray Serve's HTTP proxy: a body far too big never leaves the proxy.

Ray Serve's proxy reads a request's body off the socket into a queue as fast
as it arrives, and the ingress replica fetches that queue in batches, whether
or not the app reads it. The ingress's own cap (guard.py) answers 413, but by
then the proxy and the replica have each held the whole body: 2-128 MB bodies
left each process 150-750 MB larger (the allocators keep what they once
held). So the proxy runs the same guard, with a cap of its own
(`LOOKAHEAD_PROXY_MAX_BODY_BYTES`; unless set, 1 MiB, `ingress.max_body_bytes`'s
default): a body past it is answered 413 from the proxy, and read and dropped
there chunk by chunk as it comes; the replicas never see it, and 160 such
bodies of 2-128 MB left both processes within 2 MB of where they started
(tests/serve_app/test_body_cap.py). An app whose `max_body_bytes` is larger
needs the proxy's cap raised to match (the ingress logs a warning); one whose
cap is smaller refuses the bodies between the two itself.

Ray installs it from `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` (Ray's hook
for proxy middlewares), which must be set where Ray starts: scripts/setup.sh
sets it for every Python of the project's virtual environment (a .pth file),
tests/conftest.py for the test session; elsewhere (a cluster started with
`ray start`), set it on every node (docs/serving.md).
"""

import os

from starlette.middleware import Middleware

from .guard import Guard

PROXY_CAP_ENV = "LOOKAHEAD_PROXY_MAX_BODY_BYTES"
DEFAULT_PROXY_CAP = 1 << 20  # ingress.max_body_bytes's default: an app that sets more must raise this too
PROXY_DRAIN_BYTES = 1 << 30  # draining in the proxy holds nothing: read a refused body to its end up to this


def proxy_cap() -> int:
    raw = os.environ.get(PROXY_CAP_ENV)
    if raw is None:
        return DEFAULT_PROXY_CAP
    if not raw.isdigit() or int(raw) < 1024:
        raise ValueError(f"{PROXY_CAP_ENV}={raw!r}: must be a whole number of bytes, at least 1024")
    return int(raw)


def middlewares() -> list[Middleware]:
    """For RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve_app.proxy_guard:middlewares."""
    cap = proxy_cap()
    return [Middleware(Guard, settings=lambda: (cap, ()), drain_bytes=PROXY_DRAIN_BYTES)]
