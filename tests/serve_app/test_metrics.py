"""Replica metrics: what a finished request and the engine's step totals add to the Prometheus counters."""

from collections import defaultdict

from serve_app.metrics import ReplicaMetrics


class Recorder:
    """Stands in for a Ray counter: the metric backend is beside the point, what gets counted is not."""

    def __init__(self) -> None:
        self.by_tags: dict[tuple, float] = defaultdict(float)

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        self.by_tags[tuple(sorted((tags or {}).items()))] += value


def test_engine_step_totals_become_counter_increments_once():
    m = ReplicaMetrics("smol")
    m.steps = Recorder()
    m.engine_steps({"drafting": 5, "plain": 2, "held": 0})
    m.engine_steps({"drafting": 5, "plain": 7, "held": 3})  # totals, read again: only what is new is added
    m.engine_steps({"drafting": 5, "plain": 7, "held": 3})
    assert dict(m.steps.by_tags) == {
        (("kind", "drafting"), ("model", "smol")): 5,
        (("kind", "plain"), ("model", "smol")): 7,
        (("kind", "held"), ("model", "smol")): 3,
    }


def test_a_finished_request_counts_its_prompt_and_prefix_cache_hits():
    m = ReplicaMetrics("smol")
    m.prompt, m.cached, m.requests = Recorder(), Recorder(), Recorder()
    m.finished("ok", prompt_tokens=700, cached_prompt_tokens=512)
    m.finished("ok", prompt_tokens=300)
    assert m.prompt.by_tags[(("model", "smol"),)] == 1000
    assert m.cached.by_tags[(("model", "smol"),)] == 512
