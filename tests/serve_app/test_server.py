"""The whole stack on real Ray Serve, real HTTP and the real SmolLM2 weights.

OpenAI's own client against both endpoints, streamed and not; greedy text
through HTTP equal to plain `generate` of the same prompt (lookahead on and
off, batched together); every error case answering a JSON body that names
the field; a disconnect cancelling only its own request; overload refused
with 503 and Retry-After; and the server still serving after all of it.
"""

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests

from lookahead.model.models import encode
from lookahead.model.reference import hf_generate
from tests.conftest import load_prompts
from tests.serving import deploy, smollm2_model

pytestmark = pytest.mark.slow
APP = "smol"
MODEL_ID = "smollm2"


@pytest.fixture(scope="module")
def base(serve_url):
    from ray import serve

    model = smollm2_model(MODEL_ID, limits={"max_engine_queue": 6})
    prefix = deploy(APP, {"models": [model]})
    yield serve_url + prefix
    serve.delete(APP)


def replica():
    from ray import serve

    return serve.get_deployment_handle(f"Model-{MODEL_ID}", app_name=APP)


def post(base, path, body, **kw):
    return requests.post(f"{base}/v1/{path}", json=body, timeout=120, **kw)


def plain_text(smollm2, text: str, max_tokens: int, chat: bool = True) -> str:
    ids = encode(smollm2.tokenizer, text, chat=chat)
    out = hf_generate(smollm2.model, ids, max_tokens, smollm2.eos_token_ids)
    return smollm2.tokenizer.decode(out.tokens, skip_special_tokens=True)


def test_openai_client_all_four_ways(base):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL_ID]

    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "What is 2+2?"}],
                                          max_tokens=16, temperature=0)
    assert chat.choices[0].message.content.strip()
    assert chat.usage.completion_tokens > 0 and chat.usage.prompt_tokens > 0
    assert chat.choices[0].finish_reason in ("stop", "length")

    parts = list(client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text.strip()
    assert parts[-1].usage.completion_tokens > 0

    comp = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert comp.choices[0].text and comp.usage.completion_tokens <= 8
    assert comp.model_extra["lookahead"]["steps"] >= 1

    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert streamed == comp.choices[0].text


def test_greedy_over_http_equals_plain_generate(base, smollm2):
    """Lossless through the whole stack: several requests batched together, lookahead on and off."""
    prompts = [r["prompt"] for r in load_prompts("humaneval", 2) + load_prompts("mtbench", 2)]
    bodies = [{"model": MODEL_ID, "messages": [{"role": "user", "content": p}], "max_tokens": 48, "temperature": 0}
              for p in prompts]
    bodies[1]["lookahead"] = {"enabled": False}
    bodies[2]["lookahead"] = {"decoding_length": 8, "branch_length": 4}
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: post(base, "chat/completions", b), bodies))
    for prompt, reply in zip(prompts, replies):
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == plain_text(smollm2, prompt, 48)
    assert replies[1].json()["lookahead"]["draft_tokens"] == 0

    # Alone, the request drafts (its output repeats its prompt's code), and the drafts are accepted.
    solo = post(base, "chat/completions", {**bodies[0], "max_tokens": 64}).json()
    assert solo["choices"][0]["message"]["content"] == plain_text(smollm2, prompts[0], 64)
    assert solo["lookahead"]["accepted_draft_tokens"] > 0 and solo["lookahead"]["mean_accepted_tokens"] > 1

    # A stop string cuts the text before it, as OpenAI does.
    want = plain_text(smollm2, prompts[0], 48)
    cut = want.index("\n") if "\n" in want else None
    r = post(base, "chat/completions", {**bodies[0], "stop": ["\n"]}).json()
    assert r["choices"][0]["message"]["content"] == (want[:cut] if cut is not None else want)


BAD = [
    ("completions", {"model": MODEL_ID, "prompt": "hi", "n": 2}, 400, "n"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("completions", {"model": MODEL_ID}, 400, "prompt"),
    ("completions", {"model": MODEL_ID, "prompt": "word " * 3000}, 400, "prompt"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "lookahead": {"decoding_length": 999}}, 400,
     "lookahead.decoding_length"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "lookahead": {"depth": 3}}, 400, "lookahead.depth"),
    ("completions", {"model": MODEL_ID, "prompt": "hi", "stop": ["x"] * 50}, 400, "stop"),
    ("completions", {"model": "no-such-model", "prompt": "hi"}, 404, "model"),
    ("chat/completions", {"model": MODEL_ID, "messages": []}, 400, "messages"),
    ("chat/completions", {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages.0.role"),
    ("chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}],
                          "tools": [{"type": "function"}]}, 400, "tools"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_name_the_field(base, path, body, status, param):
    r = post(base, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


def test_malformed_json_and_nan_are_400(base):
    r = requests.post(f"{base}/v1/completions", data=b'{"model": "smollm2", "prompt": ',
                      headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = requests.post(f"{base}/v1/completions", data=b'{"model": "smollm2", "prompt": "x", "temperature": NaN}',
                      headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


def test_unknown_fields_are_ignored(base):
    r = post(base, "completions", {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4, "temperature": 0,
                                   "some_future_openai_field": {"x": 1}, "user": "u1"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_a_shared_document_is_prefilled_once_and_reported_as_cached(base, smollm2):
    doc = "Context: " + " ".join(f"Line {i} of the report says the pump ran for {i * 3} hours." for i in range(20))
    first, second = doc + "\nQuestion: How long did line 2 say?", doc + "\nQuestion: How long did line 7 say?"
    bodies = [{"model": MODEL_ID, "messages": [{"role": "user", "content": q}], "max_tokens": 12, "temperature": 0}
              for q in (first, second)]
    usages, texts = [], []
    for body in bodies:
        r = post(base, "chat/completions", body)
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
        texts.append(r.json()["choices"][0]["message"]["content"])
    assert usages[0]["prompt_tokens"] > 200
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] >= 200  # the document, minus the question
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] < usages[1]["prompt_tokens"]
    assert texts == [plain_text(smollm2, q, 12) for q in (first, second)]


def _queue_empty_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if replica().queue_length.remote().result() == 0:
            return True
        time.sleep(0.1)
    return False


def test_disconnect_cancels_only_its_own_request(base):
    """Two streams in one group; the first client hangs up; the second runs to the end; the slot is freed."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    other = {**body, "max_tokens": 40}
    results = {}
    leaver_sent = threading.Event()

    def leaver():
        url = urlsplit(base)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        conn.request("POST", f"{url.path}/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        leaver_sent.set()  # the whole request is on the wire: the stayer's comes second, within the group window
        response = conn.getresponse()
        while line := response.readline():
            if line.startswith(b"data: {"):
                results["leaver_id"] = json.loads(line[6:])["id"]
                break
        conn.close()  # hang up mid-stream

    def stayer():
        assert leaver_sent.wait(60)  # second in the group: the leaver's context is the one Ray ties the call to
        r = requests.post(f"{base}/v1/chat/completions", json=other, stream=True, timeout=120)
        results["stayer"] = [ln for ln in r.iter_lines() if ln.startswith(b"data: ")]

    threads = [threading.Thread(target=leaver), threading.Thread(target=stayer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["stayer"][-1] == b"data: [DONE]"
    last = json.loads(results["stayer"][-2][6:])
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert _queue_empty_within(15), "the disconnected request kept its batch slot"
    assert wait_finish(results["leaver_id"]) == "cancelled"


def wait_finish(request_id: str, seconds: float = 5.0) -> str | None:
    """The replica's record of how a request ended (it lands just after the engine lets the request go)."""
    deadline = time.monotonic() + seconds
    while (reason := replica().finish_reason.remote(request_id).result()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return reason


def test_overload_answers_503_with_retry_after(base):
    """The engine queue holds 6; a burst of 16 long requests gets some 503s, the rest are served."""
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda _: post(base, "completions", body), range(16)))
    codes = sorted(r.status_code for r in replies)
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 1 and codes.count(200) >= 6
    refused = next(r for r in replies if r.status_code == 503)
    assert refused.headers.get("Retry-After") and refused.json()["error"]["type"] == "overloaded"
    assert _queue_empty_within(60)


def test_still_serving_after_everything(base):
    assert requests.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
    r = post(base, "completions", {"model": MODEL_ID, "prompt": "One, two,", "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
