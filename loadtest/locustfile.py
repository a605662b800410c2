"""Locust users sending OpenAI-style requests to a lookahead-serve server.

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 --host http://127.0.0.1:8000 \\
        --model smollm2-lookahead --prompts benchmarks/prompts/humaneval.jsonl --max-tokens 128 --requests 32

Each user takes the next prompt (a JSONL file with a "prompt" field per line;
`--prompt-offset` skips the first ones) and sends it, streamed so that time
to first token is seen, as chat (`--endpoint chat`, default) or completion.
Greedy (`temperature` 0) unless `--temperature` says otherwise. After
`--requests` requests in all, the run stops by itself.

Per request it records, as locust events besides locust's own row (which
times the response headers):
    COMPLETION <model>     whole-request latency (ms); response length = generated tokens
    TTFT <model>           time to first token (ms)
    TOKENS_PER_S <model>   generated tokens / latency (the "response time" column holds tokens/s)
and, with `--records FILE`, one JSON line per request: index, status, timings,
tokens, the text's hash (to compare arms), and the server's lookahead stats.
A request counts as failed on any non-200 status, an error event in the
stream, a stream that ends without `[DONE]` or a finish reason, or no tokens.
Options can also come from the environment: LOADTEST_MODEL, LOADTEST_PROMPTS,
LOADTEST_MAX_TOKENS, LOADTEST_REQUESTS, LOADTEST_RECORDS.
"""

import hashlib
import itertools
import json
import os
import sys
import threading
import time

from locust import HttpUser, events, task
from locust.exception import StopUser

from loadtest.prompt_sets import PromptFileError, prompt_path, read_prompts

_lock = threading.Lock()
_state = {"next": itertools.count(), "done": 0, "prompts": None}


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    env = os.environ.get
    parser.add_argument("--model", default=env("LOADTEST_MODEL", "smollm2"), help="the `model` to request")
    parser.add_argument("--prompts", default=env("LOADTEST_PROMPTS", str(prompt_path("humaneval"))),
                        help="JSONL with a \"prompt\" per line; checked before any user starts")
    parser.add_argument("--prompt-offset", type=int, default=int(env("LOADTEST_PROMPT_OFFSET", "0")))
    parser.add_argument("--max-tokens", type=int, default=int(env("LOADTEST_MAX_TOKENS", "128")))
    parser.add_argument("--requests", type=int, default=int(env("LOADTEST_REQUESTS", "0")),
                        help="stop after this many requests in all (0: run until -t)")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default=env("LOADTEST_ENDPOINT", "chat"))
    parser.add_argument("--temperature", type=float, default=float(env("LOADTEST_TEMPERATURE", "0")))
    parser.add_argument("--top-p", type=float, default=float(env("LOADTEST_TOP_P", "1")))
    parser.add_argument("--top-k", type=int, default=int(env("LOADTEST_TOP_K", "0")), help="0 = off")
    parser.add_argument("--records", default=env("LOADTEST_RECORDS", ""), help="append per-request JSON lines here")


@events.init.add_listener
def _load_prompts(environment, **_) -> None:
    """Read and check the prompt file once, before any user starts: a bad file ends locust at once, naming it."""
    try:
        _state["prompts"] = [row["prompt"] for row in read_prompts(environment.parsed_options.prompts)]
    except PromptFileError as e:
        sys.exit(f"locustfile: {e}")


class LLMUser(HttpUser):
    """One client: sends a request, waits for its whole answer, sends the next (no think time)."""

    @task
    def generate(self) -> None:
        opts = self.environment.parsed_options
        prompts = _state["prompts"]
        with _lock:
            index = next(_state["next"])
        if opts.requests and index >= opts.requests:
            raise StopUser()
        prompt = prompts[(opts.prompt_offset + index) % len(prompts)]
        record = self._send(opts, index, prompt)
        if opts.records:
            with _lock, open(opts.records, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        with _lock:
            _state["done"] += 1
            finished = opts.requests and _state["done"] >= opts.requests
        if finished:
            self.environment.runner.quit()

    def _send(self, opts, index: int, prompt: str) -> dict:
        body = {"model": opts.model, "max_tokens": opts.max_tokens, "temperature": opts.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if opts.top_p < 1:
            body["top_p"] = opts.top_p
        if opts.top_k:
            body["top_k"] = opts.top_k
        if opts.endpoint == "chat":
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        else:
            path, body["prompt"] = "/v1/completions", prompt
        rec = {"index": index, "model": opts.model, "start": time.time(), "ok": False, "error": None,
               "ttft_s": None, "latency_s": None, "tokens": 0, "text_sha1": None, "finish_reason": None,
               "lookahead": None}
        t0 = time.perf_counter()
        text, done = [], False
        with self.client.post(path, json=body, stream=True, catch_response=True, timeout=600,
                              name=f"{opts.endpoint} {opts.model}") as resp:
            try:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                for line in resp.iter_lines():
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RuntimeError(f"error event: {chunk['error'].get('message')}")
                    if chunk.get("usage"):
                        rec["tokens"] = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices", []):
                        piece = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                        if piece:
                            if rec["ttft_s"] is None:
                                rec["ttft_s"] = time.perf_counter() - t0
                            text.append(piece)
                        if choice.get("finish_reason"):
                            rec["finish_reason"] = choice["finish_reason"]
                            rec["lookahead"] = chunk.get("lookahead")
                if not done or rec["finish_reason"] is None:
                    raise RuntimeError("the stream ended early (no [DONE] or no finish reason)")
                if rec["tokens"] <= 0:
                    raise RuntimeError("no tokens generated")
                resp.success()
                rec["ok"] = True
            except Exception as e:  # noqa: BLE001 - every failure is a failure, never a fast success
                rec["error"] = str(e)[:300]
                resp.failure(rec["error"])
        rec["latency_s"] = time.perf_counter() - t0
        rec["text_sha1"] = hashlib.sha1("".join(text).encode()).hexdigest()
        self._fire(opts.model, rec)
        return rec

    def _fire(self, model: str, rec: dict) -> None:
        fire = self.environment.events.request.fire
        exc = None if rec["ok"] else RuntimeError(rec["error"])
        fire(request_type="COMPLETION", name=model, response_time=rec["latency_s"] * 1000,
             response_length=rec["tokens"], exception=exc, context={})
        if rec["ok"]:
            fire(request_type="TTFT", name=model, response_time=(rec["ttft_s"] or rec["latency_s"]) * 1000,
                 response_length=0, exception=None, context={})
            fire(request_type="TOKENS_PER_S", name=model, response_time=rec["tokens"] / rec["latency_s"],
                 response_length=rec["tokens"], exception=None, context={})
