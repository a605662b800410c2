"""The Ray driver of a multi-node test, in a child process: `python -m tests.cluster_driver GCS_ADDRESS HTTP_PORT`.

A pytest process can be connected to one Ray cluster only, and the session's
own (tests/conftest.py) may be that one; so the test talks to the two-node
cluster through this process, one JSON object per line each way:
{"op": ..., ...} in, {"ok": true, ...} or {"ok": false, "error": ...} out.
"""

import json
import os
import sys
import time
import traceback
from dataclasses import asdict


def main(address: str, http_port: int) -> None:
    # Replies go to the original stdout; anything Ray or Serve prints goes to stderr (the driver log).
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj, default=str) + "\n")
        replies.flush()

    import ray
    from ray import serve

    from serve_app.builder import build_app
    from serve_app.config import AppConfig

    ray.init(address=address, namespace="multinode-test", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": http_port, "location": "EveryNode"})
    blockers: list = []

    @ray.remote(num_cpus=0)
    class Blocker:  # holds resources on one node, so the scheduler must place new actors elsewhere
        def ready(self) -> bool:
            return True

    def deploy(app: str, args: dict) -> dict:
        serve.run(build_app(AppConfig.model_validate(args)), name=app, route_prefix=f"/{app}")
        return {}

    def replicas(app: str, deployment: str) -> dict:
        status = serve.status().applications.get(app)
        states = status.deployments[deployment].replica_states if status and deployment in status.deployments else {}
        return {"states": dict(states), "app_status": str(status.status) if status else None}

    def loads(app: str, deployment: str, expect: int = 1, calls: int = 8, timeout: float = 60) -> dict:
        """Every replica's ReplicaLoad, by actor name, once `expect` replicas have answered (the router
        learns of a new replica a moment after it runs)."""
        handle = serve.get_deployment_handle(deployment, app_name=app)
        seen: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < expect and time.monotonic() < deadline:
            for r in [handle.replica_load.remote() for _ in range(calls)]:
                try:
                    load = r.result(timeout_s=30)
                except Exception:  # noqa: BLE001 - a replica that just died: the others still answer
                    continue
                seen[load.actor] = asdict(load)
        return {"loads": seen}

    def nodes() -> dict:
        """Alive nodes by the custom resource that names them: {"node_a": node id, ...}."""
        alive = [n for n in ray.nodes() if n["Alive"]]
        return {"nodes": {r: n["NodeID"] for n in alive for r in n["Resources"] if r.startswith("node_")}}

    def block(resource: str, cpus: float) -> dict:
        b = Blocker.options(num_cpus=cpus, resources={resource: 0.001}).remote()
        ray.get(b.ready.remote(), timeout=60)
        blockers.append(b)
        return {}

    def unblock() -> dict:
        while blockers:
            ray.kill(blockers.pop())
        return {}

    def delete(app: str) -> dict:
        serve.delete(app)
        return {}

    ops = {"deploy": deploy, "replicas": replicas, "loads": loads, "nodes": nodes, "block": block,
           "unblock": unblock, "delete": delete}
    reply({"ok": True, "ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            reply({"ok": True, **ops[op](**request)})
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
            reply({"ok": False, "error": f"{op}: {e!r}", "trace": traceback.format_exc()[-2000:]})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
