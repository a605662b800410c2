"""Bench JSON files -> one markdown table (docs/benchmarks.md's).

    python -m benchmarks.bench_report results/bench/*.json
"""

import json
import sys
from pathlib import Path


def _reused(arm: dict) -> str:
    """Share of prompt tokens whose KV came from the engine's prefix cache (older JSON: not recorded)."""
    if not arm.get("prompt_tokens"):
        return "-"
    return f"{100 * arm['cached_prompt_tokens'] / arm['prompt_tokens']:.0f}%"


def _set(s: dict) -> str:
    """The prompt set's name, and where a held-out slice (`--skip`) starts."""
    name = Path(s["prompts_file"]).stem
    return f"{name} (held out: from prompt {s['skip'] + 1})" if s.get("skip") else name


def _full(level: dict) -> str:
    """The arms' ratio over the decode steps that ran with every row (older JSON: not recorded)."""
    f = level.get("full_batch")
    if not f or f["ratio"] is None:
        return "-"
    return f"{f['ratio']:.2f}x ({100 * f['on_share']:.0f}% / {100 * f['off_share']:.0f}%)"


IDENTICAL = {True: "yes", False: "NO", None: "sampled"}


def levels_table(paths: list[Path]) -> str:
    lines = [
        "| prompt set | concurrency | lookahead on tok/s | off tok/s | on/off | per-request tok/s on / off "
        "| p50 latency on / off | p95 latency on / off | tokens/step | prompt KV reused on / off | identical "
        "| on/off in steps with all rows (share of wall on / off) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    machine = ""
    for p in paths:
        s = json.loads(p.read_text())["summary"]
        machine = s["machine"]
        for l in s["levels"]:
            on, off = l["on"], l["off"]
            lines.append(
                f"| {_set(s)} | {l['concurrency']} | {l['on_tok_s']:.1f} | {l['off_tok_s']:.1f} "
                f"| {l['ratio']:.2f}x | {on['per_request_tok_s']:.1f} / {off['per_request_tok_s']:.1f} "
                f"| {on['p50_latency_s']:.1f}s / {off['p50_latency_s']:.1f}s | {on['p95_latency_s']:.1f}s / {off['p95_latency_s']:.1f}s "
                f"| {on['mean_accepted']:.2f} | {_reused(on)} / {_reused(off)} | {IDENTICAL[l['identical']]} "
                f"| {_full(l)} |"
            )
    return "\n".join(lines) + f"\n\nMachine: {machine}.\n"


def table(paths: list[Path]) -> str:
    if any("levels" in json.loads(p.read_text())["summary"] for p in paths):
        return levels_table(paths)
    lines = [
        "| prompt set | prompts | generate tok/s | own plain tok/s | lookahead tok/s | end-to-end speedup | "
        "decode speedup | own-plain decode speedup | tokens/step | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    machine = ""
    for p in paths:
        s = json.loads(p.read_text())["summary"]
        machine = s["machine"]
        lines.append(
            f"| {_set(s)} | {s['prompts']} | {s['baseline_tok_s']:.1f} | {s['own_plain_tok_s']:.1f} "
            f"| {s['lookahead_tok_s']:.1f} | {s['speedup']:.2f}x | {s['decode_speedup']:.2f}x "
            f"| {s['own_plain_decode_speedup']:.2f}x | {s['mean_accepted']:.2f} | {IDENTICAL[s['identical']]} |"
        )
    return "\n".join(lines) + f"\n\nMachine: {machine}.\n"


if __name__ == "__main__":
    print(table([Path(a) for a in sys.argv[1:]]))
