"""Per-request lookahead statistics, and where an engine's time went."""

from dataclasses import asdict, dataclass, field


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


@dataclass
class EngineTimes:
    """Where an engine's steps spent their time, summed (seconds), and how full its decode batches were."""
    prefill_s: float = 0.0  # prompt chunks, prefix-cache copies included
    plan_s: float = 0.0  # proposing every row's tree and planning the step
    forward_s: float = 0.0  # the decode forward, to its one read back
    accept_s: float = 0.0  # acceptance walks, n-gram index and calibration updates, streaming the tokens
    commit_s: float = 0.0  # keeping the accepted KV, timing the step, releasing finished rows
    steps_by_rows: dict[int, int] = field(default_factory=dict)  # decode steps, by rows in the batch
    seconds_by_rows: dict[int, float] = field(default_factory=dict)  # their time, plan to commit
    tokens_by_rows: dict[int, int] = field(default_factory=dict)  # tokens they delivered

    def add_decode(self, rows: int, plan_s: float, forward_s: float, accept_s: float, commit_s: float,
                   tokens: int) -> None:
        self.plan_s += plan_s
        self.forward_s += forward_s
        self.accept_s += accept_s
        self.commit_s += commit_s
        self.steps_by_rows[rows] = self.steps_by_rows.get(rows, 0) + 1
        self.seconds_by_rows[rows] = self.seconds_by_rows.get(rows, 0.0) + plan_s + forward_s + accept_s + commit_s
        self.tokens_by_rows[rows] = self.tokens_by_rows.get(rows, 0) + tokens

    def merged(self, other: "EngineTimes") -> "EngineTimes":
        out = EngineTimes(*(getattr(self, f) + getattr(other, f) for f in
                            ("prefill_s", "plan_s", "forward_s", "accept_s", "commit_s")))
        for mine, theirs, total in ((self.steps_by_rows, other.steps_by_rows, out.steps_by_rows),
                                    (self.seconds_by_rows, other.seconds_by_rows, out.seconds_by_rows),
                                    (self.tokens_by_rows, other.tokens_by_rows, out.tokens_by_rows)):
            for rows in mine.keys() | theirs.keys():
                total[rows] = mine.get(rows, 0) + theirs.get(rows, 0)
        return out

    @property
    def mean_rows(self) -> float:
        """Rows per decode step, weighted by each step's time: how full the batch was while it ran."""
        seconds = sum(self.seconds_by_rows.values())
        return sum(r * s for r, s in self.seconds_by_rows.items()) / seconds if seconds else 0.0

    def as_dict(self) -> dict:
        return {"prefill_s": self.prefill_s, "plan_s": self.plan_s, "forward_s": self.forward_s,
                "accept_s": self.accept_s, "commit_s": self.commit_s, "mean_rows": self.mean_rows,
                "by_rows": {r: {"steps": self.steps_by_rows[r], "s": self.seconds_by_rows[r],
                                "tokens": self.tokens_by_rows.get(r, 0)} for r in sorted(self.steps_by_rows)}}
