"""Per-request lookahead statistics."""

from dataclasses import asdict, dataclass


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache, not a prefill
    new_tokens: int = 0
    steps: int = 0  # verification forwards after prefill
    draft_tokens: int = 0  # draft rows verified, summed over steps
    accepted_drafts: int = 0  # draft rows accepted, summed over steps
    prefill_ms: float = 0.0
    forward_ms: float = 0.0  # decode-step forwards only, launch to argmax read back (host plus device)
    device_ms: float = 0.0  # the device's own share of forward_ms (CUDA events); equal to it off CUDA
    query_ms: float = 0.0  # trie lookups and tree building
    first_token_s: float = 0.0  # wall time from start to the first new token
    total_s: float = 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per step: accepted drafts plus the bonus token."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def mean_drafts(self) -> float:
        return self.draft_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["mean_accepted"] = round(self.mean_accepted, 4)
        d["mean_drafts"] = round(self.mean_drafts, 4)
        return d
