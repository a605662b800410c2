"""The KV budget through real HTTP: admission by memory, /stats, and the 400 for what could never fit.

SmolLM2 in fp32 on CPU with `memory.kv_cache_gb: 0.05`: 46,080 bytes a token,
so 1,152 tokens of KV (72 blocks of 16). Twelve chat requests of 300-700
prompt tokens with `max_tokens` 64 each need 430-830 tokens at worst, so at
most two run at once and the rest wait in the queue for room. All must
complete with the same text as when sent one at a time, and the peak held
must stay within the budget.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from lookahead.model.models import encode
from tests.conftest import load_prompts
from tests.serving import ANSWER_TIMEOUT, deploy, smollm2_model

pytestmark = pytest.mark.slow
APP = "kvbudget"
MODEL_ID = "smollm2-kv"
BUDGET_GB = 0.05
TOKEN_BYTES = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M: layers x (K, V) x kv_heads x head_dim x fp32
BLOCK = 16


@pytest.fixture(scope="module")
def base(serve_url):
    from ray import serve

    model = smollm2_model(MODEL_ID, memory={"kv_cache_gb": BUDGET_GB},
                          batching={"max_batch_size": 12, "batch_wait_timeout_s": 0.05},
                          limits={"max_prompt_tokens": 2048, "max_new_tokens": 2048, "max_engine_queue": 64})
    prefix = deploy(APP, {"models": [model]})
    yield serve_url + prefix
    serve.delete(APP)


@pytest.fixture(scope="module")
def prompts(smollm2):
    """The first twelve narrativeqa prompts of 300-700 tokens through the chat template."""
    out = []
    for row in load_prompts("narrativeqa"):
        n = len(encode(smollm2.tokenizer, row["prompt"], chat=True))
        if 300 <= n <= 700:
            out.append(row["prompt"])
        if len(out) == 12:
            return out
    raise AssertionError("narrativeqa has fewer than twelve prompts of 300-700 tokens")


def chat(base, text, max_tokens=64):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    return requests.post(f"{base}/v1/chat/completions", json=body, timeout=ANSWER_TIMEOUT)


def stats(base) -> dict:
    r = requests.get(f"{base}/stats", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["models"][MODEL_ID]


def test_twelve_long_requests_queue_for_memory_and_equal_one_at_a_time(base, prompts):
    budget = stats(base)
    blocks = int(BUDGET_GB * 2**30) // (BLOCK * TOKEN_BYTES)
    assert budget["kv_budget_bytes"] == blocks * BLOCK * TOKEN_BYTES  # 1,152 tokens of fp32 KV
    assert budget["kv_budget_terms"]["source"] == f"memory.kv_cache_gb={BUDGET_GB:g}"  # why: the operator's setting

    seen_waiting = []
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(chat, base, p) for p in prompts]
        while not all(f.done() for f in futures):
            seen_waiting.append(stats(base)["waiting"])
        together = [f.result() for f in futures]
    assert [r.status_code for r in together] == [200] * 12, [r.text[:200] for r in together if r.status_code != 200]
    assert max(seen_waiting) > 0  # memory, not the 12 rows, held requests back

    alone = [chat(base, p) for p in prompts]
    assert [r.status_code for r in alone] == [200] * 12
    text = lambda r: r.json()["choices"][0]["message"]["content"]  # noqa: E731
    assert [text(r) for r in together] == [text(r) for r in alone]

    after = stats(base)
    assert 0 < after["kv_peak_bytes"] <= after["kv_budget_bytes"]
    assert after["running"] == 0 and after["waiting"] == 0
    assert after["kv_used_bytes"] == after["prefix_cache_bytes"]  # what is left is the prefix cache's, in budget


def test_a_request_that_could_never_fit_the_budget_is_a_400_naming_the_limit(base, smollm2):
    long_doc = max(load_prompts("narrativeqa"), key=lambda r: len(r["prompt"]))["prompt"]
    assert len(encode(smollm2.tokenizer, long_doc, chat=True)) > 1152
    r = chat(base, long_doc)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages" and "KV budget of 1152 tokens" in err["message"]

    r = chat(base, "Tell me a story.", max_tokens=1100)  # the prompt fits; this many new tokens could not
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and "KV budget of 1152 tokens" in err["message"]
    assert chat(base, "Tell me a story.", max_tokens=8).status_code == 200  # and the replica serves on
