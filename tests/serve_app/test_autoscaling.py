"""Autoscaling on the engine queue: the policy's arithmetic, and a burst on real Ray Serve.

The burst runs on a tiny random Llama (the model is beside the point here)
with SmolLM2's tokenizer: one replica, up to two; a burst of long requests
scales it up, and when the burst is over it scales back down.
"""

import time
from types import SimpleNamespace

import pytest

from serve_app.autoscaling import ENGINE_QUEUE, engine_queue_policy
from tests.serving import LONG, HeldStreams, deploy, wait_for


def ctx(queues, queued=0.0, calls=0.0, target=4.0, lo=1, hi=5):
    return SimpleNamespace(aggregated_metrics={ENGINE_QUEUE: dict(enumerate(queues))} if queues is not None else {},
                           total_queued_requests=queued, total_num_requests=calls,
                           config=SimpleNamespace(target_ongoing_requests=target),
                           capacity_adjusted_min_replicas=lo, capacity_adjusted_max_replicas=hi, policy_state={})


@pytest.mark.parametrize("queues,queued,calls,want", [
    ([0, 0], 0, 0, 1),  # idle: down to min
    ([8, 8], 0, 2, 4),  # 16 engine requests / 4 per replica, though Serve sees only 2 group calls
    ([3], 2, 1, 2),  # requests waiting at the handles count too
    ([40, 40], 0, 0, 5),  # capped at max
    (None, 0, 6, 2),  # no replica reported yet: fall back to Serve's call count
])
def test_policy_sizes_on_engine_queue(queues, queued, calls, want):
    assert engine_queue_policy(ctx(queues, queued, calls))[0] == want


def replicas(app: str, deployment: str) -> int:
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return status.replica_states.get("RUNNING", 0)


def test_burst_scales_up_then_down(serve_url, tiny_llama_dir):
    from ray import serve

    app = "auto"
    model = {
        "name": "tiny", "model": tiny_llama_dir, "dtype": "float32", "device": "cpu", "torch_threads": 1,
        "lookahead": {"adaptive": False},
        "batching": {"max_batch_size": 4, "batch_wait_timeout_s": 0.01},
        "limits": {"max_new_tokens": 60000, "max_engine_queue": 64},
        "deployment": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1,
                                              "target_ongoing_requests": 2, "upscale_delay_s": 0.5,
                                              "downscale_delay_s": 2, "look_back_period_s": 1},
                       "ray_actor_options": {"num_cpus": 0.5}, "graceful_shutdown_timeout_s": 5},
    }
    base = serve_url + deploy(app, {"models": [model]})
    try:
        assert replicas(app, "Model-tiny") == 1
        # Far more tokens than any machine makes before the bound below, one token per row and step (plain
        # decoding: a random model's loops would let drafts accept dozens a step); the test ends the streams.
        body = {"model": "tiny", "prompt": "Count with me: one two three", "max_tokens": 60000, "temperature": 0,
                "stream": True, "lookahead": LONG}
        rows = model["batching"]["max_batch_size"]
        t0 = time.monotonic()
        with HeldStreams(base, "/v1/completions", body, 12) as burst:
            assert wait_for(lambda: sum(c > 0 for c in burst.chunks) >= rows, 60), burst.chunks  # a full batch runs
            assert wait_for(lambda: replicas(app, "Model-tiny") == 2, 120), "did not scale up under the burst"
            up = time.monotonic() - t0
        assert not burst.errors, burst.errors
        assert all(status in (None, 200) for status in burst.statuses), burst.statuses  # None: still queued
        t1 = time.monotonic()
        assert wait_for(lambda: replicas(app, "Model-tiny") == 1, 90), "did not scale down after the burst"
        print(f"\nscaled 1 -> 2 replicas {up:.1f} s into the burst; back to 1 {time.monotonic() - t1:.1f} s after it")
    finally:
        serve.delete(app)
