"""Request bodies -> jobs: unsupported parameters and out-of-bounds values are refused, naming the field."""

import pytest

from serve_app.admission import to_job
from serve_app.config import ModelConfig
from serve_app.jobs import Rejected
from serve_app.protocol import ChatCompletionRequest, CompletionRequest

CFG = ModelConfig(name="m", model="x", limits={"max_new_tokens": 100, "default_max_tokens": 20, "max_stop_strings": 2},
                  lookahead={"decoding_length": 16, "max_decoding_length": 32, "branch_length": 8})


def comp(**kw):
    return CompletionRequest(model="m", prompt="hi", **kw)


def chat(**kw):
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                   {"type": "text", "text": "b"}]}],
                                 **kw)


@pytest.mark.parametrize("body,param", [
    (comp(n=3), "n"), (comp(best_of=2), "best_of"), (comp(echo=True), "echo"), (comp(logprobs=1), "logprobs"),
    (comp(presence_penalty=0.5), "presence_penalty"), (comp(stop=["a", "b", "c"]), "stop"), (comp(stop=""), "stop"),
    (comp(max_tokens=101), "max_tokens"), (chat(max_completion_tokens=500), "max_completion_tokens"),
    (comp(lookahead={"decoding_length": 33}), "lookahead.decoding_length"),
    (comp(lookahead={"branch_length": 9}), "lookahead.branch_length"),
    (CompletionRequest(model="m", prompt=["a", "b"]), "prompt"),
    (chat(tools=[{"type": "function"}]), "tools"), (chat(response_format={"type": "json_object"}), "response_format"),
])
def test_refused_naming_the_parameter(body, param):
    with pytest.raises(Rejected) as info:
        to_job(body, CFG)
    assert info.value.error.param == param and info.value.error.status == 400


def test_defaults_and_overrides_reach_the_job():
    job = to_job(comp(lookahead={"decoding_length": 32, "enabled": True}, stop="\n", temperature=0), CFG)
    assert job.max_tokens == 20 and job.decoding_length == 32 and job.stop == ("\n",) and job.temperature == 0
    assert job.request_id.startswith("cmpl-")
    job = to_job(chat(max_tokens=7, seed=3), CFG)
    assert job.messages == (("user", "ab"),) and job.max_tokens == 7 and job.seed == 3 and job.prompt is None
    assert to_job(CompletionRequest(model="m", prompt=[5, 6, 7]), CFG).prompt == [5, 6, 7]
