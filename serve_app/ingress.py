"""The HTTP ingress: OpenAI-compatible endpoints, routing by `model`, dynamic batching per model.

    POST /v1/completions        text completion, streamed (SSE) or not
    POST /v1/chat/completions   chat completion, streamed (SSE) or not
    GET  /v1/models             the configured model names
    GET  /health                200 while the ingress is up
    GET  /stats                 per model, the KV memory and queue of the replica that answers

Errors are JSON bodies in OpenAI's shape, `{"error": {"message", "type",
"param", "code"}}`: 400 for malformed JSON, wrong types, values out of range,
unsupported parameters and over-long prompts (naming the field), 404 for an
unknown model, 401 without a valid API key (when keys are configured; see
guard.py), 413 for an oversized body, 503 (with Retry-After) when the
model's queue is full. A stream silent for `stream_keepalive_s` (queued
behind other generations) gets an SSE comment line, which clients ignore. A client that disconnects cancels its own request
only. `reconfigure` takes `{"batching": {model: {max_batch_size,
batch_wait_timeout_s}}}` through the deployment's `user_config`.
"""

import logging
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import ray
from ray import serve
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from starlette.responses import JSONResponse

from .admission import to_job
from .cancel_board import CancelBoard
from .config import AppConfig
from .guard import Guard, load_keys
from .proxy_guard import PROXY_CAP_ENV, proxy_cap
from .jobs import JobError, Rejected
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import KEEPALIVE, ClosingStreamingResponse, Completion, error_response, sse, with_keepalive
from .route import JobStream, ModelRoute

log = logging.getLogger("ray.serve")

RETRY_AFTER_S = "2"

app = FastAPI(title="lookahead-serve", description="OpenAI-compatible LLM serving with lookahead decoding")


def _field(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else "body"


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (e.g. an undecodable body, a wrong method) in the same JSON shape as ours."""
    param = "body" if exc.status_code == 400 else None
    return error_response(JobError(exc.status_code, str(exc.detail), param), headers=getattr(exc, "headers", None))


@app.exception_handler(RecursionError)
async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    return error_response(JobError(400, "JSON nested too deeply", "body"))


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return error_response(JobError(400, f"malformed JSON: {first.get('msg')}", "body"))
    param = _field(first.get("loc", ()))
    return error_response(JobError(400, f"{param}: {first.get('msg')}", param))


def _retry_after(err: JobError) -> dict | None:
    return {"Retry-After": RETRY_AFTER_S} if err.status == 503 else None


def _guard_settings() -> tuple[int, tuple[bytes, ...]]:
    return getattr(app.state, "max_body_bytes", 1_048_576), getattr(app.state, "api_keys", ())


app.add_middleware(Guard, settings=_guard_settings)


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, config: AppConfig, handles: dict) -> None:
        if isinstance(config, dict):
            config = AppConfig.model_validate(config)
        self.config = config
        app.state.max_body_bytes = config.ingress.max_body_bytes
        if os.environ.get("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "").startswith("serve_app.proxy_guard") \
                and config.ingress.max_body_bytes > proxy_cap():
            log.warning("ingress.max_body_bytes=%d is over the proxy's cap of %d bytes (%s): bodies between the "
                        "two are refused by the proxy", config.ingress.max_body_bytes, proxy_cap(), PROXY_CAP_ENV)
        app.state.api_keys = load_keys(config.ingress.api_keys_env, config.ingress.api_keys_file)
        if app.state.api_keys:
            log.info("API keys required (%d configured)", len(app.state.api_keys))
        # The board lives and dies with this ingress replica (its node): a replica that cannot reach it may then
        # take this ingress, and so its clients, for gone. Left to the scheduler, it could sit on another node.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.board = CancelBoard.options(scheduling_strategy=here).remote()
        cfgs = {m.name: m for m in config.models}
        cap = config.ingress.max_ongoing_requests
        self.handles = handles
        self.routes = {name: ModelRoute(cfgs[name], handle, self.board, cap) for name, handle in handles.items()}

    def reconfigure(self, user_config: dict) -> None:
        for name, settings in (user_config or {}).get("batching", {}).items():
            if name in self.routes:
                self.routes[name].set_batching(settings.get("max_batch_size"), settings.get("batch_wait_timeout_s"))

    @app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @app.get("/stats")
    async def stats(self) -> dict:
        """Per model: kv_budget_bytes, kv_used_bytes, kv_peak_bytes, prefix_cache_bytes, running and waiting,
        from whichever of its replicas answers (behind the API key when keys are set)."""
        out = {}
        for name in self.routes:
            try:
                out[name] = await self.handles[name].kv_stats.remote()
            except Exception as e:  # noqa: BLE001 - one model's trouble must not hide the others
                out[name] = {"error": f"{type(e).__name__}: {e}"}
        return {"models": out}

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "lookahead-serve"}
                                           for n in self.routes]}

    @app.post("/v1/completions")
    async def completions(self, body: CompletionRequest):
        return await self._serve(body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest):
        return await self._serve(body, chat=True)

    async def _serve(self, body, chat: bool):
        route = self.routes.get(body.model)
        if route is None:
            return error_response(JobError(404, f"model {body.model!r} is not served here; see /v1/models",
                                           "model", "not_found_error"))
        try:
            job = to_job(body, route.cfg)
        except Rejected as e:
            return error_response(e.error)
        stream = route.submit(job)
        events = stream.__aiter__()
        out = Completion(job.request_id, body.model, chat)
        try:
            first = await events.__anext__()  # "started" or the reason it could not start
            if first.error is not None:
                stream.finished = True
                return error_response(first.error, _retry_after(first.error))
            if body.stream:
                usage = bool(body.stream_options and body.stream_options.include_usage)
                return ClosingStreamingResponse(self._sse(stream, events, out, usage), stream.cancel,
                                                media_type="text/event-stream")
            pieces = []
            async for e in events:
                if e.error is not None:
                    return error_response(e.error, _retry_after(e.error))
                pieces.append(e.text)
                if e.final:
                    out.finish_reason, out.usage, out.lookahead = e.finish_reason, e.usage, e.lookahead
            out.text = "".join(pieces)
            return JSONResponse(out.body())
        finally:
            if not body.stream:
                stream.cancel()  # no-op when finished; else the client went away mid-request

    async def _sse(self, stream: JobStream, events, out: Completion, include_usage: bool):
        first = True
        try:
            async for e in with_keepalive(events, self.config.ingress.stream_keepalive_s):
                if e is None:
                    yield KEEPALIVE
                    continue
                if e.error is not None:
                    yield sse(e.error.body())
                    return
                if e.final:
                    out.finish_reason, out.usage, out.lookahead = e.finish_reason, e.usage, e.lookahead
                if e.text or first or e.final:
                    yield sse(out.chunk(e.text, e.finish_reason, first=first))
                    first = False
            if include_usage:
                yield sse(out.usage_chunk())
            yield sse("[DONE]")
        finally:
            stream.cancel()
