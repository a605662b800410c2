"""Scale model replicas on the real queue: requests waiting plus running in their engines.

Ray Serve's default policy counts a replica's ongoing *calls*; the ingress
sends a whole group of requests in one call, so that count undercounts the
load by up to the group size. Each model replica therefore reports its
engine's queue (`record_autoscaling_stats`), and this custom policy, named in
the deployment's `autoscaling_config.policy`, sizes the deployment so each
replica holds about `target_ongoing_requests` engine requests. Calls queued
at the handles (not yet on any replica) count one request each, at least.
Ray's wrapper then applies the min/max bounds and the up/down delays.

Needs Ray >= 2.51 (custom autoscaling metrics and policies); the builder
falls back to Ray's default `target_ongoing_requests` policy when the
installed Ray lacks them.
"""

import math

ENGINE_QUEUE = "engine_queue"
DEFAULT_TARGET = 8.0


def engine_queue_policy(ctx) -> tuple[int, dict]:
    """Ray Serve custom autoscaling policy: (desired replicas, policy state)."""
    per_replica = (ctx.aggregated_metrics or {}).get(ENGINE_QUEUE, {})
    if per_replica:
        load = sum(per_replica.values()) + (ctx.total_queued_requests or 0.0)
    else:  # no replica has reported yet: the calls Serve sees are the best estimate
        load = ctx.total_num_requests or 0.0
    target = ctx.config.target_ongoing_requests or DEFAULT_TARGET
    desired = math.ceil(load / target) if load > 0 else 0
    desired = max(ctx.capacity_adjusted_min_replicas, min(ctx.capacity_adjusted_max_replicas, desired))
    return desired, ctx.policy_state


def supported() -> bool:
    try:
        from ray.serve.config import AutoscalingContext, AutoscalingPolicy  # noqa: F401
    except ImportError:
        return False
    return True


POLICY_PATH = f"{__name__}:engine_queue_policy"
