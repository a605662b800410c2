"""Request bodies -> jobs: unsupported parameters and out-of-bounds values are refused, naming the field."""

import pytest

from serve_app.admission import check_context, to_job
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


@pytest.mark.parametrize("prompt,max_tokens,param", [(950, 100, "max_tokens"), (1010, 1, "prompt")])
def test_a_request_past_the_context_window_is_refused_naming_the_field(prompt, max_tokens, param):
    job = to_job(comp(max_tokens=max_tokens), CFG)
    with pytest.raises(Rejected) as e:
        check_context(prompt, job, headroom=17, context=1024)
    assert e.value.error.status == 400 and e.value.error.param == param
    assert "1024" in e.value.error.message
    if param == "max_tokens":
        assert "at most 57 new tokens" in e.value.error.message  # 1024 - 950 - 17


def test_a_request_that_fits_the_context_window_passes():
    check_context(900, to_job(comp(max_tokens=100), CFG), headroom=17, context=1024)  # 1017 <= 1024
    check_context(10**6, to_job(comp(max_tokens=100), CFG), headroom=17, context=None)  # unknown: not checked
    with pytest.raises(Rejected):
        check_context(900, to_job(comp(max_tokens=100), CFG), headroom=25, context=1024)  # one over
