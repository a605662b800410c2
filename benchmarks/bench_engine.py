"""The concurrency half of the benchmark: N requests in flight through the engine, lookahead on vs off.

    python -m benchmarks.bench --prompts benchmarks/prompts/humaneval.jsonl --limit 16 --chat --concurrency 1,2,4,8,16

At each level the engine serves the prompts with N always in flight (a
finished request is replaced by the next prompt), with lookahead on and off,
each run from an empty trie and a fresh engine (so an empty prefix cache).
With `--repeats R` the arms alternate on/off, off/on, ... and each arm's runs
are pooled; `--min-seconds S` adds rounds, in pairs, to a level until each
arm has run S seconds there. Every output is compared with plain `model.generate` of that
prompt alone.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from lookahead.config import LookaheadConfig
from lookahead.engine.engine import Engine
from lookahead.engine.generate import LookaheadDecoder
from lookahead.core.calibration import CalibrationTable
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model.sampling import SamplingParams
from lookahead.engine.sequence import Generation, StopCriteria
from lookahead.engine.stats import EngineTimes


@dataclass
class LevelRun:
    wall_s: float
    outputs: list[Generation]  # the finished requests, in prompt order
    latencies_s: list[float]
    times: EngineTimes  # where the engine's steps spent the wall time
    decode_steps: dict[str, int]  # decode steps by kind: verified drafts / plain by the planner / held plain by payoff
    answered: list[int] | None = None  # outputs[i] answers prompts[answered[i]]; None: every prompt, in order
    unfinished_tokens: int = 0  # tokens that requests still running at the deadline had produced (counted in tok/s)

    @property
    def truncated(self) -> bool:
        """Stopped at its deadline: some prompts have no output."""
        return self.answered is not None

    def indices(self) -> list[int]:
        return list(range(len(self.outputs))) if self.answered is None else self.answered

    @property
    def tokens(self) -> int:
        return sum(len(g.tokens) for g in self.outputs) + self.unfinished_tokens

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @classmethod
    def merged(cls, runs: list["LevelRun"]) -> "LevelRun":
        """Repeats of one arm as one run: tokens over summed wall time, every request's latency."""
        times = EngineTimes()
        for r in runs:
            times = times.merged(r.times)
        kinds = {k: sum(r.decode_steps.get(k, 0) for r in runs) for k in runs[0].decode_steps}
        assert not any(r.truncated for r in runs), "repeats are merged whole"
        return cls(sum(r.wall_s for r in runs), [g for r in runs for g in r.outputs],
                   [t for r in runs for t in r.latencies_s], times, kinds)

    def as_json(self) -> dict:
        lat = sorted(self.latencies_s)
        steps = sum(g.stats.steps for g in self.outputs)
        return {
            "tok_s": self.tok_s,
            "per_request_tok_s": statistics.mean(len(g.tokens) / t for g, t in zip(self.outputs, self.latencies_s)),
            "p50_latency_s": lat[len(lat) // 2],
            "p95_latency_s": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))],
            "mean_accepted": self.tokens / steps if steps else 0.0,
            "prompt_tokens": sum(g.stats.prompt_tokens for g in self.outputs),
            "cached_prompt_tokens": sum(g.stats.cached_prompt_tokens for g in self.outputs),  # from the prefix cache
            "row_steps": steps,  # each request's decode steps, summed
            "times": self.times.as_dict(),
            "decode_steps": self.decode_steps,
        }


def run_level(decoder: LookaheadDecoder, prompts: list[list[int]], concurrency: int, stop: StopCriteria,
              lookahead: LookaheadConfig, sched: SchedulerConfig, sampling: SamplingParams = SamplingParams(),
              stop_when: Callable[[], bool] | None = None) -> LevelRun:
    """`stop_when`: asked between steps (a deadline, say); once it says True the run stops and reports the
    requests that finished (`LevelRun.answered`), and counts the tokens of the ones it cut short."""
    decoder.memory.clear()  # each run starts from an empty trie, like a fresh server
    decoder.calibration = CalibrationTable()
    with Engine(decoder, sched) as engine:
        pending = list(enumerate(prompts))
        in_flight: dict[int, tuple] = {}
        outputs: list[Generation | None] = [None] * len(prompts)
        latencies = [0.0] * len(prompts)
        t0 = time.perf_counter()
        while (pending or in_flight) and not (stop_when is not None and stop_when()):
            while pending and len(in_flight) < concurrency:
                i, ids = pending.pop(0)
                in_flight[i] = (engine.add_request(ids, stop=stop, lookahead=lookahead, sampling=sampling),
                                time.perf_counter())
            engine.step()
            for i, (h, started) in list(in_flight.items()):
                if h.done:
                    outputs[i] = h.result()
                    latencies[i] = time.perf_counter() - started
                    del in_flight[i]
        wall = time.perf_counter() - t0
        times, kinds = engine.times, dict(engine.decode_steps)
    if not pending and not in_flight:
        return LevelRun(wall, outputs, latencies, times, kinds)
    done = [i for i, g in enumerate(outputs) if g is not None]
    return LevelRun(wall, [outputs[i] for i in done], [latencies[i] for i in done], times, kinds, answered=done,
                    unfinished_tokens=sum(len(h.seq.tokens) for h, _ in in_flight.values()))


def run_levels(decoder: LookaheadDecoder, prompts: list[list[int]], references: list[list[int]],
               levels: list[int], stop: StopCriteria, sched: SchedulerConfig, report, repeats: int = 1,
               min_seconds: float = 0.0, warmup: int = 0, sampling: SamplingParams = SamplingParams()) -> list[dict]:
    """Each level: the arms alternate on, off, off, on, ... over `repeats` rounds, so a drift in the
    machine's speed lands on both arms alike; each arm's repeats are pooled.

    With `warmup`, both arms first serve that many prompts, two at a time, unmeasured.
    With `min_seconds`, a level whose arms ran shorter than that gets more rounds, two at a time (so
    each arm still goes first equally often): a level of 16 requests at once is one ~12 s wave on the
    2-core CPU, against ~70 s for one request at a time, and timing noise weighs on it that much more.
    """
    arms = {"on": decoder.config, "off": LookaheadConfig(enabled=False)}
    if warmup:  # discarded: a process's first runs come out slower
        for cfg in arms.values():
            run_level(decoder, prompts[:warmup], 2, stop, cfg, sched, sampling)
    out = []
    for n in levels:
        runs: dict[str, list[LevelRun]] = {"on": [], "off": []}
        r, order = 0, []
        while not _enough(r, runs, repeats, min_seconds):
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                runs[name].append(run_level(decoder, prompts, n, stop, arms[name], sched, sampling))
                order.append({"arm": name, "tok_s": runs[name][-1].tok_s, "wall_s": runs[name][-1].wall_s})
            r += 1
        identical = None if sampling.do_sample else all(  # sampled: equal in distribution, not token for token
            g.tokens == ref for name in runs for run in runs[name] for g, ref in zip(run.outputs, references))
        # greedy: the on arm's outputs against the same engine's plain decoding of each prompt (its first off run)
        plain = [g.tokens for g in runs["off"][0].outputs]
        plain_matches = None if sampling.do_sample else sum(
            g.tokens == ref for run in runs["on"] for g, ref in zip(run.outputs, plain))
        on, off = LevelRun.merged(runs["on"]), LevelRun.merged(runs["off"])
        level = {
            "concurrency": n,
            "on_tok_s": on.tok_s,
            "off_tok_s": off.tok_s,
            "ratio": on.tok_s / off.tok_s,
            "identical": identical,
            "plain_matches": plain_matches,  # of plain_outputs: on-arm outputs equal to the engine's plain decoding
            "plain_outputs": len(plain) * len(runs["on"]),
            "full_batch": full_batch(on, off, n),
            "repeats": r,
            "runs": order,  # every run in the order it ran, to see the spread behind the pooled ratio
            "on": on.as_json(),
            "off": off.as_json(),
        }
        report(level)
        out.append(level)
    return out


def full_batch(on: LevelRun, off: LevelRun, rows: int) -> dict:
    """Both arms' decode rate over the steps that ran with all `rows` rows: the level's steady state.

    A level's whole-run ratio also holds its ramp-up (one request prefilled a step) and its drain (the
    last requests, once nothing is left to start, run with fewer rows). When every request asks for the
    same number of tokens, plain decoding keeps the rows in step and drains in a few steps; lookahead
    accepts different numbers of tokens per row, so its rows finish apart and its last requests run in
    steps of one to a few rows. `share`: the part of each arm's wall time those full steps took.
    """
    out = {}
    for name, run in (("on", on), ("off", off)):
        steps = run.times.steps_by_rows.get(rows, 0)
        seconds = run.times.seconds_by_rows.get(rows, 0.0)
        out[f"{name}_tok_s"] = run.times.tokens_by_rows.get(rows, 0) / seconds if seconds else None
        out[f"{name}_steps"] = steps
        out[f"{name}_share"] = seconds / run.wall_s
    out["ratio"] = out["on_tok_s"] / out["off_tok_s"] if out["on_tok_s"] and out["off_tok_s"] else None
    return out


def _enough(rounds: int, runs: dict[str, list[LevelRun]], repeats: int, min_seconds: float) -> bool:
    if rounds < repeats:
        return False
    if not min_seconds:
        return True
    return rounds % 2 == 0 and min(sum(run.wall_s for run in arm) for arm in runs.values()) >= min_seconds


def print_level(level: dict) -> None:
    on, off = level["on"], level["off"]
    print(
        f"concurrency {level['concurrency']:3d} | on {level['on_tok_s']:7.2f} tok/s  off {level['off_tok_s']:7.2f} tok/s "
        f"| x{level['ratio']:.2f} | per-request {on['per_request_tok_s']:.1f} vs {off['per_request_tok_s']:.1f} tok/s "
        f"| p50 {on['p50_latency_s']:.2f}s/{off['p50_latency_s']:.2f}s  p95 {on['p95_latency_s']:.2f}s/{off['p95_latency_s']:.2f}s "
        f"| {on['mean_accepted']:.2f} tok/step | "
        f"{ {True: 'identical', False: 'DIFFERENT', None: 'sampled'}[level['identical']] }"
        + ("" if level.get("plain_matches") is None else
           f" | equal to plain decoding {level['plain_matches']}/{level['plain_outputs']}"),
        flush=True,
    )
    a, b = on["times"], off["times"]
    phases = ", ".join(f"{p} {a[p + '_s']:.1f}/{b[p + '_s']:.1f}"
                       for p in ("prefill", "plan", "forward", "accept", "commit"))
    kinds = "/".join(str(v) for v in on["decode_steps"].values())
    print(f"    seconds on/off: {phases}; batch {a['mean_rows']:.1f}/{b['mean_rows']:.1f} rows; "
          f"on-arm steps {'/'.join(on['decode_steps'])} {kinds}", flush=True)
    full = level["full_batch"]
    if full["ratio"] is not None:
        print(f"    steps with all {level['concurrency']} rows: on {full['on_tok_s']:.1f} off {full['off_tok_s']:.1f} "
              f"decode tok/s, x{full['ratio']:.2f}; {100 * full['on_share']:.0f}% / {100 * full['off_share']:.0f}% "
              f"of the wall time", flush=True)
