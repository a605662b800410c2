"""Frozen settings of the lookahead algorithm, checked once on creation.

Names follow PIA Lookahead (Ant Group, KDD 2024) so code written against its
`decoding_kwargs` ports over: `decoding_length` is the most draft tokens in one
verification forward, `branch_length` the deepest a draft branch may reach,
`decoding_mode` how branches are picked (hier / par / one), `stop_words` the
token ids that never start a branch.
"""

from dataclasses import dataclass, field, replace
from typing import Literal

DecodingMode = Literal["hier", "par", "one"]
MODES = ("hier", "par", "one")


@dataclass(frozen=True)
class LookaheadConfig:
    enabled: bool = True
    decoding_length: int = 64  # most draft tokens verified in one forward
    branch_length: int = 12  # deepest draft branch (n-gram length - 1)
    decoding_mode: DecodingMode = "hier"
    stop_words: frozenset[int] = field(default_factory=frozenset)
    max_query_length: int = 4  # longest context suffix looked up in the trie
    min_query_length: int = 1  # shortest suffix that may still propose drafts
    # Size drafts per step from the measured forward-cost curve (none when the
    # match is weak). Off = PIA's fixed budget: always up to decoding_length.
    adaptive: bool = True
    memory_max_nodes: int = 1_000_000  # hard bound on the shared output trie
    prompt_weight: float = 1.0  # prompt-trie counts relative to memory counts
    debug: bool = False

    def __post_init__(self) -> None:
        checks = [
            ("decoding_length", self.decoding_length, 0 <= self.decoding_length <= 1024),
            ("branch_length", self.branch_length, 1 <= self.branch_length <= 256),
            ("decoding_mode", self.decoding_mode, self.decoding_mode in MODES),
            ("max_query_length", self.max_query_length, 1 <= self.max_query_length <= 64),
            ("min_query_length", self.min_query_length, 1 <= self.min_query_length <= self.max_query_length),
            ("memory_max_nodes", self.memory_max_nodes, self.memory_max_nodes >= 16),
            ("prompt_weight", self.prompt_weight, self.prompt_weight >= 0),
        ]
        for name, value, ok in checks:
            if not ok:
                raise ValueError(f"invalid lookahead setting {name}={value!r}")
        if not isinstance(self.stop_words, frozenset):
            object.__setattr__(self, "stop_words", frozenset(int(t) for t in self.stop_words))

    def with_overrides(self, **changes) -> "LookaheadConfig":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


# PIA's `decoding_kwargs` names mapped onto ours.
PIA_KWARGS = {
    "use_lookahead": "enabled",
    "decoding_length": "decoding_length",
    "branch_length": "branch_length",
    "decoding_mode": "decoding_mode",
    "stop_words": "stop_words",
    "debug_lookahead": "debug",
}


def from_pia_kwargs(base: LookaheadConfig, decoding_kwargs: dict | None) -> LookaheadConfig:
    """Apply a PIA-style `decoding_kwargs` dict; unknown names are an error, not ignored."""
    if not decoding_kwargs:
        return base
    unknown = set(decoding_kwargs) - set(PIA_KWARGS)
    if unknown:
        raise ValueError(f"unknown decoding_kwargs {sorted(unknown)}; known: {sorted(PIA_KWARGS)}")
    return replace(base, **{PIA_KWARGS[k]: v for k, v in decoding_kwargs.items()})
