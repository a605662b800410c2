"""Sweep concurrency against the A/B deployments: the speedup of lookahead at each load.

    python -m loadtest.sweep --config configs/smollm2-ab.yaml --levels 1,2,4,8,16 --requests 32 \\
        --prompts benchmarks/prompts/humaneval.jsonl --max-tokens 128 --out results/sweep

At each level N, locust runs headless with N users, until `--requests`
requests have been answered, once against the lookahead-on model and once
against the lookahead-off model (the same weights, see configs/smollm2-ab.yaml).
With `--config` the sweep starts `serve run CONFIG` itself and stops it at the
end; without it, it drives the server at `--url`. Each level gets its own
slice of the prompt file (both arms the same slice), so a level never replays
prompts whose outputs an earlier level already taught the lookahead memory;
`--reuse-prompts` turns that off.

Writes to `--out`: locust's CSVs per run (`c{N}_{model}_stats.csv`, ...), the
per-request records (`c{N}_{model}.jsonl`), `summary.json`, `table.md` and
`speedup.png`.
"""

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from loadtest.prompt_sets import PromptFileError, prompt_path, read_prompts

from . import report, summary
from .server import ServeProcess, wait_ready

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def run_locust(args, model: str, users: int, offset: int, out: Path) -> list[dict]:
    stem = f"c{users}_{model}"
    records = out / f"{stem}.jsonl"
    records.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-u", str(users), "-r", str(users), "-t", f"{args.run_timeout}s", "--stop-timeout", "60",
           "--host", args.url, "--csv", str(out / stem), "--loglevel", "WARNING",
           "--model", model, "--prompts", args.prompts, "--prompt-offset", str(offset),
           "--max-tokens", str(args.max_tokens), "--requests", str(args.requests), "--endpoint", args.endpoint,
           "--temperature", str(args.temperature), "--top-p", str(args.top_p), "--top-k", str(args.top_k),
           "--records", str(records)]
    with open(out / f"{stem}.log", "w", encoding="utf-8") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    got = summary.load_records(records)
    if rc not in (0, 1):  # locust exits 1 when some request failed; those are counted, not hidden
        raise RuntimeError(f"locust exited {rc}; see {out / stem}.log")
    if len(got) < args.requests:
        print(f"    warning: {len(got)}/{args.requests} requests finished within {args.run_timeout}s", flush=True)
    return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--config", help="start `serve run CONFIG` for the sweep, and stop it after")
    p.add_argument("--on-model", default="smollm2-lookahead")
    p.add_argument("--off-model", default="smollm2-plain")
    p.add_argument("--levels", default="1,2,4,8,16")
    p.add_argument("--requests", type=int, default=32, help="requests per level and arm")
    p.add_argument("--prompts", default=str(prompt_path("humaneval")),
                   help="JSONL with a \"prompt\" per line (default: the shipped humaneval set)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--reuse-prompts", action="store_true", help="every level uses the same prompts")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, the arms' texts compared; > 0: sampled, reported as such, not compared")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--run-timeout", type=int, default=1800, help="seconds one locust run may take")
    p.add_argument("--ready-timeout", type=int, default=600)
    p.add_argument("--out", default=f"results/sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args(argv)
    if not (args.temperature >= 0 and 0 < args.top_p <= 1 and args.top_k >= 0):
        p.error(f"--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0 (got {args.temperature}, "
                f"{args.top_p}, {args.top_k})")
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        p.error("--levels must list positive integers")
    if args.requests < max(levels):
        p.error(f"--requests ({args.requests}) must be at least the highest level ({max(levels)})")
    try:  # before any server starts or load runs: a bad file stops the sweep at once, naming the file and line
        read_prompts(args.prompts)
    except PromptFileError as e:
        p.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    server = ServeProcess(args.config, out / "serve.log") if args.config else None
    if server:
        print(f"starting `serve run {args.config}` (log: {out / 'serve.log'})", flush=True)
        server.__enter__()
    try:
        wait_ready(args.url, [args.on_model, args.off_model], args.ready_timeout)
        print(f"server ready at {args.url}; {len(levels)} levels x 2 arms x {args.requests} requests", flush=True)
        results = []
        for k, users in enumerate(levels):
            offset = 0 if args.reuse_prompts else k * args.requests
            per_arm = {}
            for model in (args.on_model, args.off_model):
                if server:
                    server.check_alive()
                t0 = time.monotonic()
                print(f"[{k + 1}/{len(levels)}] concurrency {users:>3}  {model:<24}", end=" ", flush=True)
                per_arm[model] = run_locust(args, model, users, offset, out)
                st = summary.arm_stats(model, per_arm[model])
                print(f"{st.tok_s:8.1f} tok/s  p50 {st.p50_latency_s:6.2f}s  failures {st.failures}"
                      f"  ({time.monotonic() - t0:.0f}s)", flush=True)
            lv = summary.level(users, args.on_model, per_arm[args.on_model], args.off_model, per_arm[args.off_model],
                               sampled=args.temperature > 0)
            print(f"    speedup {lv.ratio:.2f}x  identical {lv.identical} ({lv.compared} prompts)", flush=True)
            results.append(lv)
    finally:
        if server:
            server.__exit__(None, None, None)

    meta = {"command": "python -m loadtest.sweep " + " ".join(sys.argv[1:] if argv is None else argv),
            "url": args.url, "config": args.config, "prompts": args.prompts, "max_tokens": args.max_tokens,
            "requests_per_level": args.requests, "endpoint": args.endpoint, "distinct_prompts": not args.reuse_prompts,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, {platform.node()}",
            "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "summary.json").write_text(json.dumps(summary.as_json(results, meta), indent=2), encoding="utf-8")
    (out / "table.md").write_text(report.table(results), encoding="utf-8")
    report.plot(results, out / "speedup.png", f"{args.on_model} vs {args.off_model}; {Path(args.prompts).name}, "
                                              f"{args.max_tokens} tokens, {args.requests} requests per level")
    print(f"\n{report.table(results)}\nwrote {out}/summary.json, table.md, speedup.png", flush=True)
    failures = sum(lv.on.failures + lv.off.failures for lv in results)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
