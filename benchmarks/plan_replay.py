"""Replay the engine's own drafting on recorded greedy outputs, priced by a step-time table: no model, seconds.

Under greedy decoding a tree verification accepts exactly the longest draft
path that matches the model's own continuation, so with that continuation
recorded (`benchmarks/greedy_smollm2.json`: SmolLM2-135M-Instruct, chat
template, 128 new tokens, the first 20 prompts of each set, recorded by
`python -m benchmarks.record_greedy`) every step can be replayed
without the model: the real `Sequence` proposes from its n-gram index and
the shared output memory, the real calibration and planner decide the
drafts, the acceptance walk runs against the recorded tokens, and each step
costs what the table says. The plain arm is the same rows stepping one token
at a time, priced by the same table.

    python -m benchmarks.plan_replay --table gpu --concurrency 1,4,16
    python -m benchmarks.plan_replay --table results/bench/humaneval-c.json --sets humaneval

`--table`: `gpu` (a roofline: 10 ms to read the weights, 0.05 ms a row of
KV, 10/64 ms a token of compute), `dear` (every token costs a whole step),
`flat` (every step costs the same, whatever it verifies: PIA's fixed budget,
`adaptive: false`), or a `benchmarks.bench` JSON whose summary has
`step_table_ms`.

A planning aid, not a benchmark: host work, prefill and the payoff check are
left out, and the table does not learn. The speedup is only ever measured
by `benchmarks.bench`, on and off in one run.
"""

import argparse
import json
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from lookahead.core.calibration import CalibrationTable
from lookahead.config import LookaheadConfig
from lookahead.core.planner import StepPlan, break_even, plan_step
from lookahead.model.sampling import SamplingParams
from lookahead.engine.sequence import Sequence, StopCriteria
from lookahead.core.step_table import StepTable
from lookahead.core.trie import TokenTrie
from lookahead.core.verify import accept

RECORDED = Path(__file__).with_name("greedy_smollm2.json")
GRID_ROWS = (1, 2, 4, 8, 16, 32, 64)
GRID_DRAFTS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def table_of(spec: str) -> StepTable:
    if spec == "gpu":
        return StepTable.from_function(GRID_ROWS, GRID_DRAFTS, lambda _, r, d: max(10 + 0.05 * r, (r + d) * 10 / 64))
    if spec == "dear":
        return StepTable.from_function(GRID_ROWS, GRID_DRAFTS, lambda _, r, d: 10.0 * (r + d))
    if spec == "flat":
        return StepTable.flat()
    try:
        ms = json.loads(Path(spec).read_text())["summary"]["step_table_ms"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"--table {spec}: not 'gpu', 'dear', 'flat' or a bench JSON with summary.step_table_ms ({e})")
    rows = sorted({int(r) for grid in ms.values() for r in grid})
    drafts = sorted({int(d) for grid in ms.values() for per in grid.values() for d in per})
    return StepTable(tuple(rows), tuple(drafts),
                     {lay: [[grid[str(r)][str(d)] for d in drafts] for r in rows] for lay, grid in ms.items()})


@dataclass
class Replay:
    steps: int  # decode steps of the lookahead arm
    row_steps: int  # rows stepped, summed over those steps
    tokens: int  # tokens emitted (both arms emit the same)
    drafts: int  # draft tokens verified
    built: int  # draft tokens proposed (built into trees), before the plan cut them
    on_ms: float  # the table's price of the lookahead arm's steps
    off_ms: float  # ... and of the plain arm's
    plans: list[tuple[int, ...]]  # every step's per-row draft counts, in order

    @property
    def ratio(self) -> float:
        return self.off_ms / self.on_ms


@dataclass
class ReplayStep:
    plan: StepPlan
    built: int  # draft tokens proposed, before the plan cut them
    emitted: int  # tokens the rows emitted


def replay_step(running: list[tuple[Sequence, list[int]]], memory: TokenTrie, calibration: CalibrationTable,
                table: StepTable, max_tokens: int, prune: bool = True) -> ReplayStep:
    """One step of the running rows ((request, its recorded output)) as the engine plans it: propose from the
    request's index and `memory`, plan against `table`, accept what the recording confirms, advance. A row
    that finishes is closed into `memory`."""
    floor = break_even(table, len(running), max_tokens) if prune else 0.0
    trees = [seq.propose(memory, floor) for seq, _ in running]
    plan = plan_step([seq.candidates(t, calibration, floor) for (seq, _), t in zip(running, trees)],
                     table, max_tokens, ragged=True, margin=table.error)
    emitted = 0
    for (seq, truth), tree, k in zip(running, trees, plan.counts):
        tree, done = tree.truncated(k), len(seq.tokens)
        acc = accept(tree, lambda row, path: truth[done + len(path)] if done + len(path) < len(truth) else -1)
        emitted += len(seq.advance(tree, acc, calibration))
        if seq.finished:
            seq.close(memory, seq.finish_reason)
    return ReplayStep(plan, sum(t.num_drafts for t in trees), emitted)


def replay(records: list[dict], concurrency: int, table: StepTable, max_tokens: int = 256,
           prune: bool = True, la: LookaheadConfig | None = None) -> Replay:
    """Continuous batching of `concurrency` rows over `records` ({prompt_ids, out}), on and off."""
    la = la or LookaheadConfig()
    memory, calibration = TokenTrie(la.branch_length + 1, la.stop_words), CalibrationTable()
    waiting = deque(records)
    running: list[tuple[Sequence, list[int]]] = []
    out = Replay(0, 0, 0, 0, 0, 0.0, 0.0, [])
    plain_rows: list[int] = []  # remaining tokens of each row of the plain arm, stepped apart
    plain_waiting = deque(len(r["out"]) for r in records)
    while waiting or running:
        while waiting and len(running) < concurrency:
            r = waiting.popleft()
            running.append((Sequence(list(r["prompt_ids"]), StopCriteria(len(r["out"])), SamplingParams(), la),
                            list(r["out"])))
        st = replay_step(running, memory, calibration, table, max_tokens, prune)
        out.built += st.built
        out.plans.append(tuple(st.plan.counts))
        out.on_ms += st.plan.ms
        out.steps += 1
        out.row_steps += len(running)
        out.drafts += st.plan.inflight
        out.tokens += st.emitted
        running = [(seq, truth) for seq, truth in running if not seq.finished]
    while plain_waiting or plain_rows:
        while plain_waiting and len(plain_rows) < concurrency:
            plain_rows.append(plain_waiting.popleft())
        out.off_ms += table("packed", len(plain_rows), 0)
        plain_rows = [left - 1 for left in plain_rows if left > 1]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True,
                    help="gpu | dear | flat | a benchmarks.bench JSON (summary.step_table_ms)")
    ap.add_argument("--recorded", type=Path, default=RECORDED)
    ap.add_argument("--sets", default=None, help="comma-separated; default: every set recorded")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens-per-step", type=int, default=256)
    args = ap.parse_args(argv)
    try:
        recorded = json.loads(args.recorded.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"--recorded {args.recorded}: {e}")
    table = table_of(args.table)
    sets = args.sets.split(",") if args.sets else list(recorded)
    unknown = [s for s in sets if s not in recorded]
    if unknown:
        sys.exit(f"--sets: {unknown} not in {args.recorded} (it has {sorted(recorded)})")
    print("| set | rows | prompts | on/off (priced) | tokens / row-step | drafts / step |")
    print("|---|---|---|---|---|---|")
    for name in sets:
        for c in (int(x) for x in args.concurrency.split(",")):
            r = replay(recorded[name], c, table, args.max_tokens_per_step)
            print(f"| {name} | {c} | {len(recorded[name])} | {r.ratio:.2f}x | {r.tokens / r.row_steps:.2f} | "
                  f"{r.drafts / r.steps:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
