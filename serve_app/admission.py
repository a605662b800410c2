"""An OpenAI request body -> a `Job` for one model, or the 400 that says which field is wrong.

Checked here, at the ingress, against the model's config: parameters this
server does not support, `max_tokens` against the model's limit, the number
of stop strings, and per-request lookahead overrides against their bounds.
The prompt's length in tokens is checked by the replica, which tokenizes
(`check_context` against the model's window, `check_budget` against the
replica's KV budget; both pure).
"""

import uuid

from .config import ModelConfig
from .jobs import Job, JobError, Rejected
from .protocol import ChatCompletionRequest, CompletionRequest


def to_job(body: CompletionRequest | ChatCompletionRequest, cfg: ModelConfig) -> Job:
    bad = body.unsupported()
    if bad is not None:
        raise Rejected(JobError(400, f"unsupported value for parameter {bad!r} on this server", bad))
    chat = isinstance(body, ChatCompletionRequest)
    limits = cfg.limits
    asked = body.requested_max_tokens() if chat else body.max_tokens
    if asked is not None and asked > limits.max_new_tokens:
        param = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
        raise Rejected(JobError(400, f"{param}={asked} is more than this model allows ({limits.max_new_tokens})",
                                param))
    stop = body.stop_list()
    if len(stop) > limits.max_stop_strings:
        raise Rejected(JobError(400, f"{len(stop)} stop strings; at most {limits.max_stop_strings}", "stop"))
    if any(len(s) > 256 for s in stop):
        raise Rejected(JobError(400, "stop strings may be at most 256 characters", "stop"))
    la = body.lookahead
    bounds = cfg.lookahead
    if la is not None:
        if la.decoding_length is not None and la.decoding_length > bounds.decoding_length_bound:
            raise Rejected(JobError(400, f"lookahead.decoding_length may be at most {bounds.decoding_length_bound}",
                                    "lookahead.decoding_length"))
        if la.branch_length is not None and la.branch_length > bounds.branch_length_bound:
            raise Rejected(JobError(400, f"lookahead.branch_length may be at most {bounds.branch_length_bound}",
                                    "lookahead.branch_length"))
    prefix = "chatcmpl" if chat else "cmpl"
    return Job(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        prompt=None if chat else body.prompt_text_or_ids(),
        messages=tuple((m.role, m.text()) for m in body.messages) if chat else None,
        max_tokens=asked if asked is not None else limits.default_max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        stop=tuple(stop),
        lookahead_enabled=la.enabled if la else None,
        decoding_length=la.decoding_length if la else None,
        branch_length=la.branch_length if la else None,
    )


def check_context(prompt_tokens: int, job: Job, headroom: int, context: int | None) -> None:
    """The request must fit the model's context window: prompt + max_tokens, plus the draft tree's headroom
    past the last token (a tree's rows sit at positions up to `headroom` beyond the committed ones). Past it,
    a model with learned positions fails the whole step, every request in flight with it; so refuse the one."""
    if context is None or prompt_tokens + job.max_tokens + headroom <= context:
        return
    prompt_param = "messages" if job.messages is not None else "prompt"
    if prompt_tokens + 1 + headroom > context:
        raise Rejected(JobError(400, f"the prompt has {prompt_tokens} tokens; with {headroom} tokens of draft "
                                     f"headroom this model's {context}-token context leaves no room to generate",
                                prompt_param))
    room = context - prompt_tokens - headroom
    raise Rejected(JobError(400, f"max_tokens={job.max_tokens} does not fit this model's {context}-token context: "
                                 f"the prompt has {prompt_tokens} tokens and drafts need {headroom} more; at most "
                                 f"{room} new tokens fit", "max_tokens"))


def check_budget(prompt_tokens: int, job: Job, headroom: int, budget_tokens: int) -> None:
    """The request's worst case must fit the replica's whole KV budget, or it could never start: refuse it
    rather than let it wait for room that never comes. (One that fits waits in the queue for free room.)"""
    worst = prompt_tokens + job.max_tokens + headroom
    if worst <= budget_tokens:
        return
    if prompt_tokens + 1 + headroom > budget_tokens:
        raise Rejected(JobError(400, f"the prompt has {prompt_tokens} tokens; with {headroom} tokens of draft "
                                     f"headroom it does not fit this replica's KV budget of {budget_tokens} tokens "
                                     "(memory.kv_cache_gb)", "messages" if job.messages is not None else "prompt"))
    raise Rejected(JobError(400, f"max_tokens={job.max_tokens} does not fit this replica's KV budget of "
                                 f"{budget_tokens} tokens (memory.kv_cache_gb): the prompt has {prompt_tokens} "
                                 f"tokens and drafts need {headroom} more; at most "
                                 f"{budget_tokens - prompt_tokens - headroom} new tokens fit", "max_tokens"))
