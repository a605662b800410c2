"""Deploying the app on the session's Ray Serve (fixture `serve_url` in tests/conftest.py), and waiting on it."""

import time


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


def wait_for(cond, timeout: float) -> bool:
    """Poll `cond` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.25)
    return False
