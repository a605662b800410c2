"""The text the prefix router matches on: a job's prompt, chat turns or token ids; nothing for other calls."""

from serve_app.jobs import Job
from serve_app.prefix_router import JobPrefixRouter, request_text, routing_text


def test_completions_chats_and_token_ids_each_give_their_prefix():
    assert routing_text(Job("r", prompt="Once upon a time")) == "Once upon a time"
    chat = Job("r", messages=(("system", "You answer about the document."), ("user", "Who is Ann?")))
    assert routing_text(chat).startswith("system:You answer about the document.\nuser:Who")
    # token ids: requests sharing leading ids share a leading string, and no shorter id list is a false prefix
    assert routing_text(Job("r", prompt=[12, 7, 300])).startswith(routing_text(Job("r", prompt=[12, 7])))
    assert not routing_text(Job("r", prompt=[12, 70])).startswith(routing_text(Job("r", prompt=[12, 7])))


def test_only_a_call_carrying_jobs_is_matched():
    job = Job("r", prompt="hello")
    assert request_text(([job], None)) == "hello"
    assert request_text(()) == ""  # replica_load(), kv_stats()
    assert request_text(("some-request-id",)) == ""  # finish_reason(request_id)
    assert request_text(([],)) == ""


def test_the_router_is_rays_prefix_cache_affinity_router():
    from serve_app import prefix_router

    assert issubclass(JobPrefixRouter, prefix_router.PrefixCacheAffinityRouter)
    assert prefix_router.PrefixCacheAffinityRouter.__name__ == "PrefixCacheAffinityRouter"
