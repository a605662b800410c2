"""OpenAI-style request bodies: what `/v1/completions` and `/v1/chat/completions` accept.

Unknown fields are ignored, as other OpenAI-compatible servers ignore them,
so existing clients keep working. Known parameters this server cannot honour
(`n` > 1, `logprobs`, tools, ...) are refused with 400 naming the parameter,
never silently dropped. Values are range-checked here (422 -> 400 with the
field's path); limits that depend on the model (prompt tokens) are checked by
the replica that tokenizes.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Finite = dict(allow_inf_nan=False)


class LookaheadOverride(BaseModel):
    """Per-request lookahead settings, within the bounds the model's config allows."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    decoding_length: int | None = Field(None, ge=0, le=1024)
    branch_length: int | None = Field(None, ge=1, le=256)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, **Finite)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1, **Finite)
    top_k: int = Field(0, ge=-1, le=1_000_000)  # extension (vLLM): 0 or -1 = off
    repetition_penalty: float = Field(1.0, gt=0, le=10, **Finite)  # extension
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    lookahead: LookaheadOverride | None = None
    # Known OpenAI parameters with values this server does not support (see `unsupported`).
    n: int = Field(1, ge=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2, **Finite)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, **Finite)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> str | None:
        """The first parameter set to a value this server cannot honour, else None."""
        if self.n != 1:
            return "n"
        if self.presence_penalty:
            return "presence_penalty"
        if self.frequency_penalty:
            return "frequency_penalty"
        if self.logit_bias:
            return "logit_bias"
        if any(s == "" for s in self.stop_list()):
            return "stop"
        return None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0)

    def unsupported(self) -> str | None:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            return "prompt"  # several prompts in one request: send one request each
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, 1):
            return "best_of"
        if self.logprobs:
            return "logprobs"
        return super().unsupported()

    def prompt_text_or_ids(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        if self.logprobs:
            return "logprobs"
        if self.top_logprobs:
            return "top_logprobs"
        if self.tools:
            return "tools"
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice"
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format"
        return super().unsupported()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
