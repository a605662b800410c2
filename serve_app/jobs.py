"""What crosses between the ingress and a model replica: jobs in, events out.

The ingress turns an HTTP body into a `Job` (already validated against the
model's limits); a group of jobs goes to one replica in one streaming call;
the replica streams back lists of `Event`s, each tagged with its job's index
in the group. Plain dataclasses: they travel through Ray by pickling.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: str | list[int] | None = None  # completions: text or token ids
    messages: tuple[tuple[str, str], ...] | None = None  # chat: (role, text) turns
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    lookahead_enabled: bool | None = None  # None: the model's setting
    decoding_length: int | None = None
    branch_length: int | None = None


@dataclass(frozen=True)
class JobError:
    status: int  # HTTP status to answer with
    message: str
    param: str | None = None  # the request field at fault
    type: str = "invalid_request_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


class Rejected(Exception):
    """Raised where a job is refused; carries the `JobError` the client gets."""

    def __init__(self, error: JobError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass
class Event:
    index: int  # the job's position in its group
    text: str = ""  # new text since the previous event
    started: bool = False  # the job passed the replica's checks and is queued in its engine
    finish_reason: str | None = None  # "stop" | "length" | "cancelled"; set on the job's last event
    usage: Usage | None = None  # with the last event
    lookahead: dict = field(default_factory=dict)  # the request's lookahead stats, with the last event
    error: JobError | None = None  # the job failed; this is its last event

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None
