"""The application config: which models to serve, and how; validated once, at `serve run`.

A Ray Serve config passes this as the application's `args`:

    applications:
      - import_path: serve_app.builder:build_app
        args:
          models:
            - name: smollm2
              model: smollm2-135m-instruct
              lookahead: {decoding_length: 64, branch_length: 12}

Every field is checked here, before any replica starts; a wrong one fails the
deploy with a message naming it (e.g. `models.0.lookahead.branch_length`).
Unknown fields are errors too: a typo must not silently fall back to a default.
"""

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LookaheadSettings(Strict):
    enabled: bool = True  # off: the same engine decodes plainly (the A/B baseline)
    decoding_length: int = Field(64, ge=0, le=1024)  # most draft tokens verified in one forward
    branch_length: int = Field(12, ge=1, le=256)  # deepest draft branch
    decoding_mode: Literal["hier", "par", "one"] = "hier"
    stop_words: list[str] = []  # strings; every token of each never starts a draft branch
    adaptive: bool = True  # size drafts from the forward-cost curve measured at start-up
    # Half-precision models: batch-invariant forwards, so lookahead gives token for token what plain decoding does
    # (lookahead/model/attention.py, fast_linear.py); off: stock kernels, faster on CPU, and outputs may differ at near-ties.
    exact: bool = True
    memory_max_nodes: int = Field(1_000_000, ge=16)  # bound on the shared output trie
    # Persist the shared output memory here (data-only format, checksummed; see lookahead/core/trie_store.py):
    # loaded at start (a corrupt or foreign file is logged and ignored), saved every interval and at shutdown.
    memory_path: str | None = None
    memory_save_interval_s: float = Field(300, gt=0)
    # One output memory for all the deployment's replicas (serve_app/fleet.py): each pushes what it learnt and
    # pulls what the others did every shared_memory_sync_s; a new replica starts from all of it. A replica that
    # cannot reach it serves on its own memory. Off: each replica learns alone.
    shared_memory: bool = True
    shared_memory_sync_s: float = Field(2.0, gt=0, le=3600)
    # Bounds on what one request may ask for in its `lookahead` object (default: the values above).
    max_decoding_length: int | None = Field(None, ge=0, le=1024)
    max_branch_length: int | None = Field(None, ge=1, le=256)

    @model_validator(mode="after")
    def _bounds(self):
        if self.max_decoding_length is not None and self.max_decoding_length < self.decoding_length:
            raise ValueError("max_decoding_length must be >= decoding_length")
        if self.max_branch_length is not None and self.max_branch_length < self.branch_length:
            raise ValueError("max_branch_length must be >= branch_length")
        return self

    @property
    def decoding_length_bound(self) -> int:
        return self.decoding_length if self.max_decoding_length is None else self.max_decoding_length

    @property
    def branch_length_bound(self) -> int:
        return self.branch_length if self.max_branch_length is None else self.max_branch_length


class BatchingSettings(Strict):
    max_batch_size: int = Field(16, ge=1, le=256)  # requests per ingress group, and rows in the engine's batch
    batch_wait_timeout_s: float = Field(0.01, ge=0, le=10)  # how long the ingress waits to fill a group
    max_tokens_per_step: int = Field(256, ge=1)  # tokens in one decode forward: rows x tree width
    prefill_chunk: int = Field(512, ge=16)  # prompt tokens prefilled per engine step
    prefix_cache_mb: int = Field(256, ge=0)  # KV of recent prompts reused by prompts that start alike (0 = off)
    ragged: bool = True  # each row sends only its own tree tokens; False pads every row to one tree width

    @model_validator(mode="after")
    def _tokens_cover_rows(self):
        if self.max_tokens_per_step < self.max_batch_size:
            raise ValueError("max_tokens_per_step must be >= max_batch_size (each row needs its root token)")
        return self


class MemorySettings(Strict):
    """The replica's KV budget: its one pool holds the running requests' ranges and the prefix cache.

    A request starts only when its worst case (prompt + max_tokens + draft headroom) fits what is free, and
    waits in the queue until then; one that could never fit the whole budget gets a 400."""

    kv_cache_gb: float | None = Field(None, gt=0)  # GiB of KV; wins on any device. None: from the device
    # On CUDA, with no kv_cache_gb: the device's memory x this, less the weights, the largest forward's
    # activation peak (measured at start) and what else is in use there, is the budget (GET /stats shows the
    # terms). On CPU, with no kv_cache_gb: a quarter of the RAM available at start.
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)


class Limits(Strict):
    max_prompt_tokens: int = Field(4096, ge=1)
    max_new_tokens: int = Field(1024, ge=1)  # the largest `max_tokens` a request may ask for
    default_max_tokens: int = Field(256, ge=1)  # used when a request gives no `max_tokens`
    max_stop_strings: int = Field(16, ge=0)
    max_engine_queue: int = Field(256, ge=1)  # requests waiting + running in one replica's engine; more: 503

    @model_validator(mode="after")
    def _default_within(self):
        if self.default_max_tokens > self.max_new_tokens:
            raise ValueError("default_max_tokens must be <= max_new_tokens")
        return self


class DeploymentOptions(Strict):
    """Ray Serve options of the model's deployment (passed to `.options()`)."""

    num_replicas: int | None = Field(None, ge=1)  # fixed count; leave out when autoscaling
    autoscaling_config: dict[str, Any] | None = None  # Ray's fields; the queue-length policy is filled in
    ray_actor_options: dict[str, Any] = {"num_cpus": 1}  # GPU configs: {num_gpus: 1} -> one replica per GPU
    # Placement across nodes: Ray spreads replicas over the nodes that fit them; `resources` in
    # ray_actor_options ties them to nodes that carry a custom resource; this caps replicas on any one node.
    max_replicas_per_node: int | None = Field(None, ge=1)
    max_ongoing_requests: int = Field(64, ge=1)  # request *groups* in flight per replica
    max_queued_requests: int = Field(64, ge=-1)  # groups waiting at the handles; more answer 503
    graceful_shutdown_timeout_s: float = Field(300, ge=0)  # a removed replica finishes its generations
    health_check_period_s: float = Field(10, gt=0)
    health_check_timeout_s: float = Field(30, gt=0)

    @model_validator(mode="after")
    def _one_scaling_mode(self):
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("give num_replicas or autoscaling_config, not both")
        return self


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ModelConfig(Strict):
    name: str  # what clients put in `model`
    model: str  # alias, .gguf path, local folder or Hugging Face id
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: fp32 on CPU, bf16 on GPU
    device: str = "auto"  # auto: cuda if present, else cpu
    trust_remote_code: bool = False  # runs the checkpoint's own Python code: off unless you trust it
    device_map: str | dict[str, int | str] | None = None  # accelerate placement, e.g. "auto" across the GPUs
    max_memory: dict[str, str] | None = None  # per-device caps for device_map, e.g. {"0": "70GiB", "1": "70GiB"}
    torch_threads: int | None = Field(None, ge=1)  # CPU threads for this replica's torch
    lookahead: LookaheadSettings = LookaheadSettings()
    batching: BatchingSettings = BatchingSettings()
    memory: MemorySettings = MemorySettings()
    limits: Limits = Limits()
    deployment: DeploymentOptions = DeploymentOptions()
    # How the ingress picks a replica for a request. prefix_affinity: Ray Serve's PrefixCacheAffinityRouter
    # (serve_app/prefix_router.py), which sends a request to the replica that served the longest prefix of its
    # text, so its prefix cache and drafts hit, while the replicas' queues differ by at most routing_imbalance
    # requests; past that, and for a prompt no replica has seen, power-of-two choices. pow2: that alone.
    routing: Literal["prefix_affinity", "pow2"] = "prefix_affinity"
    routing_imbalance: int | None = Field(None, ge=0)  # None: batching.max_batch_size

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 64)")
        return v

    @property
    def deployment_name(self) -> str:
        return f"Model-{self.name}"

    @property
    def imbalance_bound(self) -> int:
        return self.batching.max_batch_size if self.routing_imbalance is None else self.routing_imbalance


class IngressOptions(Strict):
    num_replicas: int = Field(1, ge=1)
    num_cpus: float = Field(0.25, ge=0)
    max_ongoing_requests: int = Field(1000, ge=1)  # HTTP requests per ingress replica
    max_queued_requests: int = Field(2000, ge=-1)  # beyond this the proxy answers 503
    max_body_bytes: int = Field(1_048_576, ge=1024)  # bigger request bodies answer 413
    # A stream that has sent nothing for this long (queued behind other generations, say) gets an SSE comment
    # line, which clients ignore: a client's or proxy's idle timeout then means a dead server, not a long queue.
    stream_keepalive_s: float = Field(10.0, gt=0, le=300)
    # A replaced ingress replica (a redeploy changes its config whenever a model's does) keeps streaming the
    # generations it proxies for this long: as long as the models' own drain, or their streams are cut.
    graceful_shutdown_timeout_s: float = Field(300, ge=0)
    # Custom Ray resources each ingress replica needs: e.g. {"node:__internal_head__": 0.001} keeps the
    # ingress on the head node, so losing a worker node never takes the ingress with it.
    resources: dict[str, float] = {}
    # API keys (Authorization: Bearer): from this environment variable (comma-separated) and/or this file
    # (one per line). None configured = open API. Never put keys in a config file.
    api_keys_env: str | None = "LOOKAHEAD_API_KEYS"
    api_keys_file: str | None = None


class AppConfig(Strict):
    models: list[ModelConfig] = Field(min_length=1)
    ingress: IngressOptions = IngressOptions()

    @model_validator(mode="after")
    def _unique_names(self):
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {dupes}")
        return self
