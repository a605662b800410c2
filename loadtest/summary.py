"""Per-request records (from the locustfile) -> per-level statistics for each arm, and the on/off ratio.

Throughput is generated tokens over the run's makespan (first request sent to
last answer received), counting successful requests only; a failed request
adds no tokens, so failures can only lower it. Latencies are over successful
requests. `identical` compares the two arms' texts prompt by prompt (greedy
runs must match: lookahead is lossless).
"""

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class ArmStats:
    model: str
    requests: int
    failures: int
    tokens: int
    tok_s: float  # all generated tokens / makespan
    mean_request_tok_s: float  # mean over requests of tokens / latency
    p50_latency_s: float
    p95_latency_s: float
    p50_ttft_s: float
    p95_ttft_s: float
    mean_accepted: float  # tokens per verification step, mean over requests (1.0 = plain decoding)


@dataclass
class Level:
    concurrency: int
    on: ArmStats
    off: ArmStats
    ratio: float  # on tok/s / off tok/s: the speedup
    identical: bool | None  # every prompt's text equal between the arms; None when sampled (nothing to compare)
    compared: int  # prompts answered by both arms


def load_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def arm_stats(model: str, records: list[dict]) -> ArmStats:
    ok = [r for r in records if r["ok"]]
    tokens = sum(r["tokens"] for r in ok)
    if records:
        start = min(r["start"] for r in records)
        end = max(r["start"] + r["latency_s"] for r in records)
        span = max(end - start, 1e-9)
    else:
        span = 1.0
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    acc = [r["lookahead"]["mean_accepted_tokens"] for r in ok if r.get("lookahead")]
    return ArmStats(
        model=model, requests=len(records), failures=len(records) - len(ok), tokens=tokens,
        tok_s=tokens / span if ok else 0.0,
        mean_request_tok_s=statistics.fmean(r["tokens"] / r["latency_s"] for r in ok) if ok else 0.0,
        p50_latency_s=_pct(lat, 0.5), p95_latency_s=_pct(lat, 0.95),
        p50_ttft_s=_pct(ttft, 0.5), p95_ttft_s=_pct(ttft, 0.95),
        mean_accepted=statistics.fmean(acc) if acc else 0.0,
    )


def level(concurrency: int, on_model: str, on: list[dict], off_model: str, off: list[dict],
          sampled: bool = False) -> Level:
    a, b = arm_stats(on_model, on), arm_stats(off_model, off)
    texts_on = {r["index"]: r["text_sha1"] for r in on if r["ok"]}
    texts_off = {r["index"]: r["text_sha1"] for r in off if r["ok"]}
    both = texts_on.keys() & texts_off.keys()
    return Level(concurrency, a, b, ratio=a.tok_s / b.tok_s if b.tok_s else 0.0,
                 identical=None if sampled else bool(both) and all(texts_on[i] == texts_off[i] for i in both),
                 compared=0 if sampled else len(both))


def as_json(levels: list[Level], meta: dict) -> dict:
    return {**meta, "levels": [{"concurrency": lv.concurrency, "on_tok_s": round(lv.on.tok_s, 2),
                                "off_tok_s": round(lv.off.tok_s, 2), "ratio": round(lv.ratio, 3),
                                "identical": lv.identical, "compared": lv.compared,
                                "on": asdict(lv.on), "off": asdict(lv.off)} for lv in levels]}
