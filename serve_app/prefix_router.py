"""Prefix-affinity routing: Ray Serve's `PrefixCacheAffinityRouter`, reading the prompt out of our jobs.

Ray's router keeps a character prefix tree of the prompts each replica served.
While the replicas' queues differ by at most `imbalanced_threshold` requests,
a request goes to the replica whose served prompts share the longest prefix
with its own (at least `match_rate_threshold` of it; otherwise to the replica
holding the least text); past that, and for calls that carry no prompt, to
the shorter queue of two random replicas (power of two choices). A request
that shares a system prompt, a document or a chat history with earlier ones
then lands where their KV prefix cache and output memory are.

Ray finds the text in a call's arguments by their `prompt` or `messages`
attributes. The ingress calls `generate_group(jobs, board)`, one job a call
when this router is on (serve_app/route.py), so this subclass reads the job
instead: a completion's prompt text (token ids as a digit string), or a chat's
turns, concatenated as Ray does.
"""

import logging

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

try:  # the stable name; its module also imports Ray's KV-aware router, which needs pyarrow (not in ray[serve])
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter
except ImportError:
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter

from .jobs import Job

log = logging.getLogger("ray.serve")

ROUTER_PATH = "serve_app.prefix_router:JobPrefixRouter"


def routing_text(job: Job) -> str:
    """The text the router matches prefixes on: what makes two requests share a KV prefix."""
    if job.messages is not None:
        return "".join(f"{role}:{text}\n" for role, text in job.messages)
    if isinstance(job.prompt, list):
        return "".join(f"{t}," for t in job.prompt)
    return job.prompt or ""


def request_text(args) -> str:
    """The routing text of a call whose first argument is a list of jobs ("" for any other call)."""
    if args and isinstance(args[0], list) and args[0] and isinstance(args[0][0], Job):
        return routing_text(args[0][0])
    return ""


class JobPrefixRouter(PrefixCacheAffinityRouter):
    """Ray's router, with two guards: calls without a prompt go by power of two choices, and a prefix tree that
    cannot be reached (its detached actor was on a node that died) costs the affinity, never the request."""

    _tree_failed = False

    def _extract_text_from_request(self, pending_request) -> str:
        return request_text(pending_request.args)

    def _tree_down(self, e: Exception) -> None:
        if not self._tree_failed:
            log.warning("prefix tree unreachable; routing by power of two choices: %s: %s", type(e).__name__, e)
        self._tree_failed = True

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if pending_request is None or not request_text(pending_request.args):
            # replica_load(), kv_stats() and the like: nothing to match (and Ray's match rate divides by it)
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(self, candidate_replicas, pending_request)
        try:
            return await super().choose_replicas(candidate_replicas, pending_request)
        except Exception as e:  # noqa: BLE001 - Ray's router calls its prefix-tree actor inline
            self._tree_down(e)
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(self, candidate_replicas, pending_request)

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        if pending_request is not None and request_text(pending_request.args):
            try:
                super().on_request_routed(pending_request, replica_id, result)
            except Exception as e:  # noqa: BLE001 - as above
                self._tree_down(e)
