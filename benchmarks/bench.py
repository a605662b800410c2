"""Benchmark: plain HF `generate` vs lookahead (and the project's own plain loop), same process, same prompts.

    python -m benchmarks.bench --model smollm2-135m-instruct --prompts benchmarks/prompts/humaneval.jsonl \
        --limit 20 --max-new-tokens 128 --chat --json results/humaneval.json

Per prompt, in file order, the three decoders run back to back, their order
alternating between prompts. The trie starts empty and learns across prompts as
a fresh server would. Each generation is timed end to end and over its decode
phase (after the first new token, so prefill is left out). Speedups are ratios
of summed times against the `generate` baseline measured in this run.
"""

import argparse
import json
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lookahead.core import heap
from benchmarks.agreement import Divergence, divergence
from lookahead.core.draft import DraftTree
from lookahead.config import LookaheadConfig
from benchmarks.bench_engine import print_level, run_levels
from lookahead.engine.generate import LookaheadDecoder
from lookahead.engine.sequence import Generation, StopCriteria
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model.models import encode, load_model
from loadtest.prompt_sets import PromptFileError, prompt_path, read_prompts
from lookahead.model.reference import TimedOutput, hf_generate
from lookahead.model.runner import ModelRunner
from lookahead.model.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class PromptResult:
    id: str
    prompt_tokens: int
    baseline: TimedOutput
    own_plain: Generation
    lookahead: Generation
    sampled: bool = False  # sampled outputs are equal in distribution, not token for token: nothing to compare
    vs_plain: Divergence | None = None  # where lookahead parts from the engine's own plain decoding (greedy)
    vs_generate: Divergence | None = None  # ... and from HF generate; each with the reference's top-2 gap there

    def as_json(self) -> dict:
        la, own = self.lookahead.stats, self.own_plain.stats
        return {
            "id": self.id,
            "prompt_tokens": self.prompt_tokens,
            "baseline_ids": self.baseline.tokens,
            "lookahead_ids": self.lookahead.tokens,
            "own_plain_ids": self.own_plain.tokens,
            "baseline_s": self.baseline.total_s,
            "baseline_decode_s": self.baseline.total_s - self.baseline.first_token_s,
            "lookahead_s": la.total_s,
            "lookahead_decode_s": la.total_s - la.first_token_s,
            "own_plain_s": own.total_s,
            "own_plain_decode_s": own.total_s - own.first_token_s,
            "steps": la.steps,
            "mean_accepted": la.mean_accepted,
            "mean_drafts": la.mean_drafts,
            "identical": self.lookahead.tokens == self.baseline.tokens if not self.sampled else None,
            "own_plain_identical": self.own_plain.tokens == self.baseline.tokens if not self.sampled else None,
            "plain_identical": self.lookahead.tokens == self.own_plain.tokens if not self.sampled else None,
            "vs_plain": self.vs_plain.__dict__ if self.vs_plain else None,
            "vs_generate": self.vs_generate.__dict__ if self.vs_generate else None,
        }


def summarize(rows: list[dict]) -> dict:
    def total(key):
        return sum(r[key] for r in rows)

    new_tokens = sum(len(r["baseline_ids"]) for r in rows)
    la_tokens = sum(len(r["lookahead_ids"]) for r in rows)
    own_tokens = sum(len(r["own_plain_ids"]) for r in rows)
    steps = total("steps")
    return {
        "prompts": len(rows),
        "speedup": total("baseline_s") / total("lookahead_s"),
        "decode_speedup": total("baseline_decode_s") / total("lookahead_decode_s"),
        "own_plain_speedup": total("baseline_s") / total("own_plain_s"),
        "own_plain_decode_speedup": total("baseline_decode_s") / total("own_plain_decode_s"),
        "identical": _all(r["identical"] for r in rows),
        "own_plain_identical": _all(r["own_plain_identical"] for r in rows),
        "plain_identical": _all(r["plain_identical"] for r in rows),
        # how many prompts lookahead decoded token for token as the engine's plain decoding / as HF generate
        "plain_matches": sum(bool(r["plain_identical"]) for r in rows),
        "generate_matches": sum(bool(r["identical"]) for r in rows),
        "baseline_tok_s": new_tokens / total("baseline_s"),
        "lookahead_tok_s": la_tokens / total("lookahead_s"),
        "own_plain_tok_s": own_tokens / total("own_plain_s"),
        "mean_accepted": la_tokens / steps if steps else 0.0,
    }


def _all(flags) -> bool | None:
    """True / False over comparisons made; None where nothing could be compared (sampled runs)."""
    flags = list(flags)
    return None if any(f is None for f in flags) else all(flags)


def sampling_of(args) -> SamplingParams:
    """Greedy at --temperature 0 (the default), else seeded-per-request sampling with these settings."""
    if args.temperature == 0:
        return SamplingParams()
    return SamplingParams(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def run(args) -> dict:
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    runner = ModelRunner(lm.model, exact=False if args.inexact else None)
    runner.check_tree_masks()
    la_cfg = LookaheadConfig(
        decoding_length=args.decoding_length,
        branch_length=args.branch_length,
        decoding_mode=args.mode,
        adaptive=not args.fixed_budget,
    )
    decoder = LookaheadDecoder(runner, la_cfg, lm.tokenizer, eos_token_ids=lm.eos_token_ids)
    stop = StopCriteria(max_new_tokens=args.max_new_tokens, eos_token_ids=frozenset(lm.eos_token_ids))
    prompts = [(r.get("id", f"line-{i + 1}"), encode(lm.tokenizer, r["prompt"], args.chat))
               for i, r in enumerate(args.rows)]

    # Warm-up of every path, then forget what it taught, so the trie starts empty.
    warm = prompts[0][1][:64]
    hf_generate(lm.model, warm, 8, lm.eos_token_ids)
    decoder.generate(warm, stop=StopCriteria(8, frozenset(lm.eos_token_ids)))
    decoder.memory.clear()
    heap.settle()  # as a replica does once it has loaded: full collections no longer walk the model
    if args.concurrency:
        return run_concurrency(args, lm, decoder, prompts, stop)

    off = LookaheadConfig(enabled=False)
    sampling = sampling_of(args)
    hf_sampling = ({"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
                    "top_k": sampling.top_k or None} if sampling.do_sample else {})
    results = []
    for i, (pid, ids) in enumerate(prompts):
        runs = {}
        order = ["baseline", "own_plain", "lookahead"]
        for name in order if i % 2 == 0 else order[::-1]:
            if name == "baseline":
                runs[name] = hf_generate(lm.model, ids, args.max_new_tokens, lm.eos_token_ids, **hf_sampling)
            elif name == "own_plain":
                runs[name] = decoder.generate(ids, stop=stop, lookahead=off, sampling=sampling)
            else:
                runs[name] = decoder.generate(ids, stop=stop, sampling=sampling)
        res = PromptResult(pid, len(ids), runs["baseline"], runs["own_plain"], runs["lookahead"], sampling.do_sample)
        if not sampling.do_sample:
            res.vs_plain = divergence(res.lookahead.tokens, res.own_plain.tokens, ids, lambda c: _top2(runner_logits(runner, c)))
            res.vs_generate = divergence(res.lookahead.tokens, res.baseline.tokens, ids,
                                         lambda c: _top2(hf_logits(lm.model, c)))
        results.append(res.as_json())
        print_row(results[-1], i + 1, len(prompts))
    summary = summarize(results)
    summary.update(
        model=args.model,
        prompts_file=str(args.prompts),
        skip=args.skip,
        max_new_tokens=args.max_new_tokens,
        decoding_length=args.decoding_length,
        branch_length=args.branch_length,
        mode=args.mode,
        adaptive=not args.fixed_budget,
        chat=args.chat,
        sampling=sampling.__dict__,
        step_table_ms=decoder.single_engine().table.summary(),
        exact=runner.exact,
        machine=f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}, device {runner.device}",
    )
    return {"summary": summary, "prompts": results}


def run_concurrency(args, lm, decoder: LookaheadDecoder, prompts, stop: StopCriteria) -> dict:
    levels = [int(x) for x in args.concurrency.split(",")]
    sched = SchedulerConfig(max_batch_size=max(args.max_batch_size, max(levels)),
                            max_tokens_per_step=max(args.max_tokens_per_step, max(levels)),
                            prefix_cache_mb=args.prefix_cache_mb, ragged=not args.padded)
    refs = []
    for i, (pid, ids) in enumerate(prompts):
        refs.append(hf_generate(lm.model, ids, args.max_new_tokens, lm.eos_token_ids))
        print(f"[{i + 1:3d}/{len(prompts)}] reference {pid}: {refs[-1].total_s:.2f}s", flush=True)
    baseline_tok_s = sum(len(r.tokens) for r in refs) / sum(r.total_s for r in refs)
    print(f"generate, one request at a time: {baseline_tok_s:.2f} tok/s", flush=True)
    ids_only = [ids for _, ids in prompts]
    sampling = sampling_of(args)
    level_rows = run_levels(decoder, ids_only, [r.tokens for r in refs], levels, stop, sched, print_level,
                            repeats=args.repeats, min_seconds=args.min_seconds, warmup=args.warmup,
                            sampling=sampling)
    first = level_rows[0]
    summary = {
        "prompts": len(prompts),
        "speedup": first["on_tok_s"] / baseline_tok_s,
        "decode_speedup": None,  # the engine does not split prefill from decode; see the single-stream bench
        "identical": _all(l["identical"] for l in level_rows),
        "sampling": sampling.__dict__,
        "step_table_ms": decoder.step_table(sched.max_batch_size, sched.max_tokens_per_step,
                                            sched.ragged and decoder.runner.ragged).summary(),
        "baseline_tok_s": baseline_tok_s,
        "lookahead_tok_s": first["on_tok_s"],
        "own_plain_tok_s": first["off_tok_s"],
        "mean_accepted": first["on"]["mean_accepted"],
        "levels": level_rows,
        "model": args.model,
        "prompts_file": str(args.prompts),
        "skip": args.skip,
        "max_new_tokens": args.max_new_tokens,
        "max_batch_size": sched.max_batch_size,
        "max_tokens_per_step": sched.max_tokens_per_step,
        "prefix_cache_mb": sched.prefix_cache_mb,
        "ragged": sched.ragged,
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    rows = [{"id": pid, "prompt_tokens": len(ids), "baseline_ids": r.tokens, "baseline_s": r.total_s}
            for (pid, ids), r in zip(prompts, refs)]
    return {"summary": summary, "prompts": rows}


@torch.inference_mode()
def runner_logits(runner: ModelRunner, context: list[int]) -> torch.Tensor:
    """The next token's logits after `context`, as the engine's plain decoding computes them."""
    cache = runner.new_cache(len(context) + 1)
    runner.prefill(cache, context[:-1])
    return runner.verify(cache, DraftTree([context[-1]], [-1], [0], [1.0]))[0]


@torch.inference_mode()
def hf_logits(model, context: list[int]) -> torch.Tensor:
    """The next token's logits after `context`, as HF `generate` computes them (the stock forward)."""
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([context], device=device)).logits[0, -1].float()


def _top2(logits: torch.Tensor) -> tuple[float, float]:
    first, second = logits.float().topk(2).values.tolist()
    return first, second


def _where(d: dict | None) -> str:
    return "same" if d is None else f"at {d['position']} (gap {d['gap']:.3f})"


def print_row(r: dict, i: int, n: int) -> None:
    print(
        f"[{i:3d}/{n}] {r['id']:<22} prompt {r['prompt_tokens']:5d} new {len(r['baseline_ids']):4d} "
        f"| generate {r['baseline_s']:6.2f}s  own-plain {r['own_plain_s']:6.2f}s  lookahead {r['lookahead_s']:6.2f}s "
        f"| x{r['baseline_s'] / r['lookahead_s']:.2f} decode x{r['baseline_decode_s'] / r['lookahead_decode_s']:.2f} "
        f"| {r['mean_accepted']:.2f} tok/step | {'identical' if r['identical'] else 'DIFFERENT'}"
        + ("" if r["identical"] is None else f" | vs plain {_where(r['vs_plain'])}, vs generate {_where(r['vs_generate'])}"),
        flush=True,
    )


def print_summary(s: dict) -> None:
    if "levels" in s:
        print(f"\n{s['prompts_file']}: {s['prompts']} prompts, {s['max_new_tokens']} new tokens, {s['machine']}")
        print("| concurrency | on tok/s | off tok/s | on/off | identical |\n|---|---|---|---|---|")
        for l in s["levels"]:
            print(f"| {l['concurrency']} | {l['on_tok_s']:.1f} | {l['off_tok_s']:.1f} | {l['ratio']:.2f}x | {l['identical']} |")
        return
    print(f"\n{s['prompts_file']}: {s['prompts']} prompts, {s['max_new_tokens']} new tokens, {s['machine']}")
    print(f"  generate   {s['baseline_tok_s']:7.2f} tok/s")
    print(f"  own plain  {s['own_plain_tok_s']:7.2f} tok/s  (x{s['own_plain_speedup']:.2f}, decode x{s['own_plain_decode_speedup']:.2f})")
    print(f"  lookahead  {s['lookahead_tok_s']:7.2f} tok/s  (x{s['speedup']:.2f}, decode x{s['decode_speedup']:.2f}), "
          f"{s['mean_accepted']:.2f} tokens/step, identical: {s['identical']}"
          + (" (sampled: compared in distribution by the tests, not here)" if s["identical"] is None else
             f"; equal to the engine's plain decoding on {s['plain_matches']}/{s['prompts']} prompts, "
             f"to generate on {s['generate_matches']}/{s['prompts']}"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=Path, default=prompt_path("humaneval"),
                   help="JSONL with a \"prompt\" (and an \"id\") per line; default: the shipped humaneval set")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--skip", type=int, default=0,
                   help="leave out the file's first N prompts: with --limit, a held-out slice (the recorded runs "
                        "and the planner's targets use the first 16 of each set)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--decoding-length", type=int, default=64)
    p.add_argument("--branch-length", type=int, default=12)
    p.add_argument("--mode", choices=["hier", "par", "one"], default="hier")
    p.add_argument("--fixed-budget", action="store_true", help="PIA-style: always verify up to decoding_length drafts")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--inexact", action="store_true",
                   help="half-precision models: stock kernels instead of the exact (batch-invariant) forwards")
    p.add_argument("--concurrency", default=None, help="e.g. 1,2,4,8,16: serve N requests at once through the engine")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-tokens-per-step", type=int, default=256)
    p.add_argument("--prefix-cache-mb", type=int, default=SchedulerConfig.prefix_cache_mb,
                   help="engine prefix cache for prompts that start alike, both arms (0 = off)")
    p.add_argument("--padded", action="store_true", help="with --concurrency: pad every row to one tree width")
    p.add_argument("--repeats", type=int, default=1,
                   help="with --concurrency: rounds per level, arms alternating on/off then off/on; pooled")
    p.add_argument("--warmup", type=int, default=0,
                   help="with --concurrency: both arms first serve this many prompts, unmeasured")
    p.add_argument("--min-seconds", type=float, default=0.0,
                   help="with --concurrency: more rounds (in pairs) until each arm has run this long at the level")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, every output compared token for token; > 0: sampled, every arm alike "
                        "(the comparison is then null: sampled outputs agree in distribution, not token for token)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    try:
        sampling_of(args)
    except ValueError as e:
        p.error(str(e))
    if args.skip < 0:
        p.error(f"--skip {args.skip}: must be >= 0")
    try:  # checked before the model loads: a bad file stops the run in a second, naming the file and line
        args.rows = read_prompts(args.prompts, args.limit, args.skip)
    except PromptFileError as e:
        p.error(str(e))
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    t0 = time.time()
    out = run(args)
    print_summary(out["summary"])
    print(f"  ({time.time() - t0:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if out["summary"]["identical"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
