"""The application builder: `import_path: serve_app.builder:build_app` in a Ray Serve config.

Ray validates the config's `args` against `AppConfig` (from the annotation
below, hence no `from __future__ import annotations` in this module), then
this builds one `Model-<name>` deployment per configured model, with the
model's Ray options, and one `Ingress` that routes to them. Where a model
autoscales, its policy is the engine-queue policy (serve_app.autoscaling)
unless the config names another; with a Ray too old for custom policies it
keeps Ray's default, which scales on `target_ongoing_requests`.
"""

import logging

from ray.serve import Application

from . import autoscaling
from .config import AppConfig, ModelConfig
from .ingress import RETRY_AFTER_S, Ingress
from .model_server import LookaheadModel

log = logging.getLogger("ray.serve")


def deployment_options(m: ModelConfig) -> dict:
    d = m.deployment
    opts = {
        "name": m.deployment_name,
        "ray_actor_options": dict(d.ray_actor_options),
        "max_ongoing_requests": d.max_ongoing_requests,
        "max_queued_requests": d.max_queued_requests,
        "graceful_shutdown_timeout_s": d.graceful_shutdown_timeout_s,
        "health_check_period_s": d.health_check_period_s,
        "health_check_timeout_s": d.health_check_timeout_s,
    }
    if m.routing == "prefix_affinity":
        from ray.serve.config import RequestRouterConfig

        from .prefix_router import ROUTER_PATH

        opts["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_PATH, request_router_kwargs={"imbalanced_threshold": m.imbalance_bound})
    if d.max_replicas_per_node is not None:
        opts["max_replicas_per_node"] = d.max_replicas_per_node
    if d.autoscaling_config is not None:
        scaling = dict(d.autoscaling_config)
        if "policy" not in scaling and autoscaling.supported():
            scaling["policy"] = {"policy_function": autoscaling.POLICY_PATH}
        elif "policy" not in scaling:
            log.warning("this Ray has no custom autoscaling policies: %s scales on target_ongoing_requests (groups)",
                        m.name)
        opts["autoscaling_config"] = scaling
    else:
        opts["num_replicas"] = d.num_replicas or 1
    return opts


def build_app(args: AppConfig) -> Application:
    if isinstance(args, dict):
        args = AppConfig.model_validate(args)
    for m in args.models:
        if m.trust_remote_code:
            log.warning("model %s: trust_remote_code is ON; its checkpoint's Python code will run", m.name)
    handles = {m.name: LookaheadModel.options(**deployment_options(m)).bind(m) for m in args.models}
    ing = args.ingress
    opts = {"num_replicas": ing.num_replicas,
            "ray_actor_options": {"num_cpus": ing.num_cpus, **({"resources": ing.resources} if ing.resources else {})},
            "max_ongoing_requests": ing.max_ongoing_requests, "max_queued_requests": ing.max_queued_requests,
            "graceful_shutdown_timeout_s": ing.graceful_shutdown_timeout_s}
    try:  # Ray >= 2.55: the proxy's own 503 (ingress queue full) carries Retry-After like ours
        from ray.serve.config import BackpressureConfig

        opts["backpressure_config"] = BackpressureConfig(status_code=503, retry_after_s=float(RETRY_AFTER_S))
    except ImportError:
        pass
    return Ingress.options(**opts).bind(args, handles)
