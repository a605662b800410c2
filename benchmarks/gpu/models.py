"""What the GPU check's sections run on: SmolLM2 (the embedded default), random-weight models of real shapes,
the prompt sets, and the sizes of the real run and of the CPU smoke run.

Models are kept across sections (loading SmolLM2 dequantises a GGUF; a 7B model of random weights is 15 GB):
one SmolLM2 per dtype, and the last random-weight shape, dropped when another shape is asked for.
"""

import gc
from dataclasses import dataclass

import torch

from lookahead.model import flagships
from lookahead.model.models import LoadedModel, encode, load_model
from loadtest.prompt_sets import prompt_path, read_prompts

# Shapes from the checkpoints' own config.json (lookahead/model/flagships.py; Qwen-14B-Chat converted to the
# Qwen2 layout it is served as).
QWEN2_7B = flagships.qwen2_layout("Qwen2-7B")
QWEN_14B = flagships.qwen2_layout("Qwen-14B")
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


@dataclass(frozen=True)
class Sizes:
    """Everything the sections size by: the real run on one GPU, or the CPU smoke run."""

    device: str
    budget_s: float  # the default --budget-s
    caps_s: dict  # section letter -> seconds at the default budget, model loads included
    agreement_prompts: int  # most prompts one at a time (level 1): as many as fit its share of the cap
    agreement_batch: int  # prompts at the higher level
    agreement_tokens: int
    agreement_levels: tuple  # (1, higher)
    profile_shape: dict
    profile_context: int
    profile_batches: tuple  # (rows, width) of each profiled step
    kernel_runs: int  # timings of one kernel call or layer (P's attention and GEMM items): the best of these
    grid_rows: tuple
    grid_widths: tuple
    grid_contexts: tuple
    grid_shape: dict
    load_requests: int
    load_tokens: int
    memory_shape: dict
    memory_requests: int
    memory_prompt: int
    memory_kv_tokens: int | None  # the KV budget in tokens of the model's KV; None: the device's budget
    speed_tokens: int
    speed_levels: tuple
    speed_prompts: tuple  # prompts at each of speed_levels


# The default run fits 8 minutes on one H200 with everything as slow as at 625c5d5 (a SmolLM2 step ~40 ms, HF
# generate 34 tok/s, a 7B verify 65 ms): B's bf16 share holds ~2 prompts x 128 tokens one at a time (HF
# generate 3.8 s, our plain 5.3 s, lookahead 2.2 s each) and one wave of 16; F's level 1 holds 4 prompts x 64
# tokens in four arms (~30 s a set).
FULL = Sizes("cuda", 480, {"A": 30, "P": 60, "C": 50, "D": 40, "E": 70, "F": 120, "B": 85},
             agreement_prompts=32, agreement_batch=16, agreement_tokens=128, agreement_levels=(1, 16),
             profile_shape=QWEN2_7B, profile_context=2048, profile_batches=((1, 1), (32, 16)), kernel_runs=5,
             grid_rows=(1, 8, 32), grid_widths=(1, 4, 16, 32), grid_contexts=(512, 2048, 8192), grid_shape=QWEN2_7B,
             load_requests=32, load_tokens=128, memory_shape=QWEN_14B, memory_requests=32, memory_prompt=6144,
             memory_kv_tokens=None, speed_tokens=64, speed_levels=(1, 4, 16), speed_prompts=(4, 8, 16))
# Smoke: every item of every section at tiny sizes; the caps are far above what the items take on 2 cores, so
# what CI checks does not depend on the machine's speed. One run a kernel timing: the interpreted kernels take
# ~1 s a call here.
SMOKE = Sizes("cpu", 1200, {"A": 120, "P": 100, "C": 100, "D": 100, "E": 100, "F": 200, "B": 200},
              agreement_prompts=3, agreement_batch=3, agreement_tokens=12, agreement_levels=(1, 2),
              profile_shape=TINY, profile_context=64, profile_batches=((1, 1), (4, 4)), kernel_runs=1,
              grid_rows=(1, 2), grid_widths=(1, 4), grid_contexts=(32, 64), grid_shape=TINY,
              load_requests=4, load_tokens=16, memory_shape=TINY, memory_requests=6, memory_prompt=200,
              memory_kv_tokens=600,  # two of the six requests (273 tokens each) at once
              speed_tokens=12, speed_levels=(1, 2), speed_prompts=(2, 3))

SMOLLM2 = ["smollm2-135m-instruct"]  # the alias, or a .gguf path given with --smollm2
_smollm2: dict[str, LoadedModel] = {}
_shaped: dict[str, object] = {}


def smollm2(dtype: str, device: str) -> LoadedModel:
    if dtype not in _smollm2:
        _smollm2[dtype] = load_model(SMOLLM2[0], dtype=dtype, device=device)
    return _smollm2[dtype]


def shaped_model(shape: dict, device: str, dtype=torch.bfloat16):
    """A causal LM of this shape with random weights, built on `device` directly (no host copy); the last one
    asked for is kept, another shape frees it first."""
    key = repr(sorted(shape.items())) + str(dtype)
    if key not in _shaped:
        free_models()
        from transformers import AutoModelForCausalLM, Qwen2Config

        torch.manual_seed(0)
        cfg = Qwen2Config(**shape, tie_word_embeddings=False)
        with torch.device(device):
            _shaped[key] = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    return _shaped[key]


def free_models() -> None:
    _shaped.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts_of(lm: LoadedModel, name: str, n: int) -> list[list[int]]:
    return [encode(lm.tokenizer, r["prompt"], chat=True) for r in read_prompts(prompt_path(name), n)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def activities(device: str) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts
