"""One real Ray cluster and Serve instance for the whole test session; apps are deployed per module.

Autoscaling metrics are pushed every 0.5 s here (Ray's default is 10 s) so the
autoscaling test sees a burst while it lasts.
"""

import os
import socket

import pytest

os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_url():
    ray = pytest.importorskip("ray")
    from ray import serve

    port = _free_port()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def deploy(name: str, args: dict) -> str:
    """Deploy the app under /<name>; returns its base URL path prefix."""
    from ray import serve

    from serve_app.builder import build_app
    from serve_app.config import AppConfig

    serve.run(build_app(AppConfig.model_validate(args)), name=name, route_prefix=f"/{name}")
    return f"/{name}"


def smollm2_model(name: str = "smollm2", **overrides) -> dict:
    base = {
        "name": name,
        "model": "smollm2-135m-instruct",
        "dtype": "float32",
        "device": "cpu",
        "torch_threads": 2,
        "batching": {"max_batch_size": 8, "batch_wait_timeout_s": 0.05},
        "limits": {"max_prompt_tokens": 1024, "max_new_tokens": 512, "default_max_tokens": 32},
        "deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 1}, "graceful_shutdown_timeout_s": 5},
    }
    for k, v in overrides.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base
