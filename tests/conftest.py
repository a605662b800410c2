import os
from pathlib import Path

# Triton kernels (lookahead/model/tree_attention.py) run under Triton's interpreter in the tests: this machine has
# no GPU, and Triton reads the mode when it is first imported, which a library may do before any test runs.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from loadtest.prompt_sets import prompt_path, read_prompts
from tests.cluster import free_port

REPO = Path(__file__).resolve().parents[1]


def load_prompts(name: str, limit: int | None = None) -> list[dict]:
    """The first `limit` rows of a prompt set shipped in benchmarks/prompts/."""
    return read_prompts(prompt_path(name), limit)


@pytest.fixture(autouse=True)
def _fixed_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def smollm2():
    from lookahead.model.models import load_model

    return load_model("smollm2-135m-instruct")


# ---- one real Ray cluster and Serve instance for the whole session (serving and load tests) ----
# Autoscaling metrics are pushed every 0.5 s here (Ray's default is 10 s) so a test burst is seen while it lasts.
os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
# A new Serve proxy must answer its readiness check within 5 s by default, or the controller kills it and
# `serve.start` fails: seen with both cores of a 2-core machine kept busy by other processes. A test machine's
# load is not a reason to fail, so the proxy gets longer here.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")
# Ray starts its workers (every replica, the Serve controller and proxy) at niceness 15. With another process
# keeping both cores busy at niceness 0, they got ~3% of a core each: a SmolLM2 replica took over 5 minutes to
# start, and the suite would have taken hours. The tests check behaviour, not priority: workers run at 0 here.
os.environ.setdefault("RAY_worker_niceness", "0")
# The proxy's body cap, as scripts/setup.sh installs it for `serve run` (serve_app/proxy_guard.py).
os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "serve_app.proxy_guard:middlewares")


@pytest.fixture(scope="session")
def serve_url():
    ray = pytest.importorskip("ray")
    from ray import serve

    port = free_port()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2):
    """A tiny random Llama with SmolLM2's tokenizer, saved as a model folder: for serving tests where the
    model is beside the point (autoscaling, faults, overload, fuzzing) and a real one would only be slow.
    Its context is 128k tokens: those tests hold generations of up to 60,000 tokens open, and a request past
    the model's context is refused with a 400 (serve_app.admission.check_context)."""
    import transformers as tf

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(smollm2.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1 << 17,
                         eos_token_id=smollm2.eos_token_ids[0])
    tf.LlamaForCausalLM(cfg).save_pretrained(path)
    smollm2.tokenizer.save_pretrained(path)
    return str(path)
