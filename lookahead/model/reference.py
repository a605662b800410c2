"""The oracle: plain Hugging Face `generate`, timed, with the decode phase split off."""

import time
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer


class _FirstTokenClock(BaseStreamer):
    """`generate` calls put() with the prompt, then once per new token; remember when the first one came."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


@dataclass
class TimedOutput:
    tokens: list[int]
    total_s: float
    first_token_s: float  # start -> first new token (prefill + first step)


@torch.inference_mode()
def hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: list[int], **kwargs) -> TimedOutput:
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    clock = _FirstTokenClock()
    t0 = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=kwargs.pop("do_sample", False),
        eos_token_id=list(eos_token_ids) or None,
        pad_token_id=(list(eos_token_ids) or [0])[0],
        streamer=clock,
        **kwargs,
    )
    total = time.perf_counter() - t0
    first = (clock.first_token_at or time.perf_counter()) - t0
    return TimedOutput(out[0, len(prompt_ids) :].tolist(), total, first)
