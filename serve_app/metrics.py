"""Prometheus metrics of a model replica, through `ray.serve.metrics`.

Ray exports them with the rest of its metrics on each node's metrics agent
(`ray start --metrics-export-port=8080`, or the port in
`/tmp/ray/session_latest/metrics/prometheus/`), all prefixed `ray_`, with the
`model` tag plus Serve's deployment/replica/application tags:

    ray_lookahead_generated_tokens_total      tokens sent to clients
    ray_lookahead_draft_tokens_total          draft tokens verified
    ray_lookahead_accepted_draft_tokens_total of those, accepted (acceptance rate: the ratio)
    ray_lookahead_accepted_tokens_per_step    histogram: a request's tokens per forward (1 = plain decoding)
    ray_lookahead_time_to_first_token_s       histogram: job admitted -> first token
    ray_lookahead_requests_total              by `status`: ok | cancelled | error | rejected
    ray_lookahead_engine_queue                requests waiting + running in the engine
    ray_lookahead_prompt_tokens_total         prompt tokens of finished requests
    ray_lookahead_cached_prompt_tokens_total  of those, taken from the prefix cache (hit rate: the ratio)
    ray_lookahead_decode_steps_total          engine decode steps by `kind`: drafting (verified drafts) |
                                              plain (the budget found no draft worth its price) |
                                              held (the payoff check kept the batch plain: nothing proposed)
    ray_lookahead_kv_budget_bytes             the replica's KV budget (GET /stats has the same values)
    ray_lookahead_kv_used_bytes               held by running requests and the prefix cache
    ray_lookahead_kv_peak_bytes               the most held at once since start
    ray_lookahead_prefix_cache_bytes          held by the prefix cache
    ray_lookahead_running                     requests being prefilled or decoded
    ray_lookahead_waiting                     requests queued for KV room or a row
"""

from ray.serve.metrics import Counter, Gauge, Histogram


MEMORY_GAUGES = (
    ("kv_budget_bytes", "The replica's KV budget in bytes"),
    ("kv_used_bytes", "KV bytes held by running requests and the prefix cache"),
    ("kv_peak_bytes", "The most KV bytes held at once since start"),
    ("prefix_cache_bytes", "KV bytes held by the prefix cache"),
    ("running", "Requests being prefilled or decoded"),
    ("waiting", "Requests queued for KV room or a batch row"),
)


class ReplicaMetrics:
    def __init__(self, model: str) -> None:
        self.generated = Counter("lookahead_generated_tokens", "Tokens generated", tag_keys=("model",))
        self.drafts = Counter("lookahead_draft_tokens", "Draft tokens verified", tag_keys=("model",))
        self.accepted_drafts = Counter("lookahead_accepted_draft_tokens", "Draft tokens verified and accepted",
                                       tag_keys=("model",))
        self.accepted = Histogram("lookahead_accepted_tokens_per_step", "Tokens per verification forward, per request",
                                  boundaries=[1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0], tag_keys=("model",))
        self.ttft = Histogram("lookahead_time_to_first_token_s", "Seconds from admission to the first token",
                              boundaries=[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0], tag_keys=("model",))
        self.requests = Counter("lookahead_requests", "Requests by final status", tag_keys=("model", "status"))
        self.queue = Gauge("lookahead_engine_queue", "Requests waiting and running in the engine", tag_keys=("model",))
        self.prompt = Counter("lookahead_prompt_tokens", "Prompt tokens of finished requests", tag_keys=("model",))
        self.cached = Counter("lookahead_cached_prompt_tokens", "Prompt tokens taken from the prefix cache",
                              tag_keys=("model",))
        self.steps = Counter("lookahead_decode_steps", "Engine decode steps by kind: drafting | plain | held",
                             tag_keys=("model", "kind"))
        self.memory = {name: Gauge(f"lookahead_{name}", doc, tag_keys=("model",)) for name, doc in MEMORY_GAUGES}
        self._steps_seen: dict[str, int] = {}
        self.model = model
        self.tags = {"model": model}

    def finished(self, status: str, new_tokens: int = 0, draft_tokens: int = 0, per_step: float = 0.0,
                 first_token_s: float | None = None, prompt_tokens: int = 0, cached_prompt_tokens: int = 0,
                 accepted_draft_tokens: int = 0) -> None:
        self.requests.inc(tags={"model": self.model, "status": status})
        if prompt_tokens:
            self.prompt.inc(prompt_tokens, tags=self.tags)
        if cached_prompt_tokens:
            self.cached.inc(cached_prompt_tokens, tags=self.tags)
        if new_tokens:
            self.generated.inc(new_tokens, tags=self.tags)
        if draft_tokens:
            self.drafts.inc(draft_tokens, tags=self.tags)
        if accepted_draft_tokens:
            self.accepted_drafts.inc(accepted_draft_tokens, tags=self.tags)
        if per_step:
            self.accepted.observe(per_step, tags=self.tags)
        if first_token_s is not None:
            self.ttft.observe(first_token_s, tags=self.tags)

    def set_queue(self, queue: float) -> None:
        self.queue.set(queue, tags=self.tags)

    def set_memory(self, stats) -> None:
        """The engine's `MemoryStats` onto the gauges."""
        for name, gauge in self.memory.items():
            gauge.set(float(getattr(stats, name)), tags=self.tags)

    def engine_steps(self, totals: dict[str, int]) -> None:
        """Bring the step counters up to the engine's running totals (read from its thread; counters only grow)."""
        for kind, total in totals.items():
            delta = total - self._steps_seen.get(kind, 0)
            if delta > 0:
                self.steps.inc(delta, tags={"model": self.model, "kind": kind})
                self._steps_seen[kind] = total
