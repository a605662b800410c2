"""Replay the fleet bench's drafting on recorded greedy outputs: what routing and the fleet memory do to tokens a
step, with no model, no server and no clock.

`loadtest/fleet_bench.py` measures the whole server, where tokens a step also depend on the planner's
measured costs: on a CPU every draft token costs a share of a step, so a replica drafts only its likeliest
few, and a busy moment cuts the trees of whatever runs then. This replays the same workload with the engine's
own drafting (`Sequence`, its n-gram index, the output memory trie, the calibration and the planner, as in
`plan_replay`) on two replicas, priced by a fixed step table, so two arms differ by what their memories hold
and nothing else:

- `pow2_local`: each request to the replica with fewer running (ties alternate), each memory its own;
- `affinity_fleet`: each passage's requests to the replica that took its first (while that one runs no more
  than one request more than the other, as the prefix-affinity router's balance check), and every finished
  output reaches the other replica's memory `--lag` finished requests later (the sync period, in requests);
- `affinity_local` and `pow2_fleet`: one of the two changes alone.

The midrun replay (the bench's `midrun` arm) replaces replica 0 once a quarter of the requests are answered by a
newcomer holding the fleet memory's snapshot, and sets its first 20 requests against the survivor's same stretch
and against the same requests run with no replacement (the matched figure).

Both replicas step in lockstep, `--clients` requests in flight in all. Tokens a step are completion tokens over
the decode steps of every request, summed (what the bench reports).

    python -m benchmarks.fleet_replay --table gpu
    python -m benchmarks.fleet_replay --table docs/bench/stop31/run2-narrativeqa.json

The recorded outputs (`benchmarks/greedy_fleet_smollm2.json`, the bench's workload: narrativeqa passages 0-7
and 8-23, 5 questions each, interleaved, 48 new tokens, SmolLM2-135M-Instruct fp32, chat template) come from
`--record`, which runs the model once (minutes on a CPU; timing plays no part).
"""

import argparse
import copy
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from lookahead.config import LookaheadConfig
from lookahead.core.calibration import CalibrationTable
from lookahead.core.step_table import StepTable
from lookahead.core.trie import TokenTrie
from lookahead.engine.sequence import Sequence, StopCriteria
from lookahead.model.sampling import SamplingParams

from .plan_replay import replay_step, table_of

RECORDED = Path(__file__).with_name("greedy_fleet_smollm2.json")
WORKLOADS = {"first8": (8, 0), "next16": (16, 8)}  # name: (passages, first passage), 5 questions each
QUESTIONS, NEW_TOKENS = 5, 48
MAX_TOKENS_PER_STEP = 256  # the server's default `batching.max_tokens_per_step`, as plan_replay's


@dataclass
class Replica:
    memory: TokenTrie
    calibration: CalibrationTable = field(default_factory=CalibrationTable)
    running: list = field(default_factory=list)  # (Sequence, recorded output, request index)
    name: int = 0  # 0 and 1 start the run; a newcomer is 2


@dataclass
class Finished:
    request: int  # index in sending order
    replica: int  # Replica.name
    tokens: int
    steps: int  # decode steps


@dataclass
class ArmFigures:
    done: list[Finished] = field(default_factory=list)  # in finishing order

    @property
    def tokens_per_step(self) -> float:
        return rate(self.done)


def rate(done: list[Finished]) -> float:
    """Completion tokens over decode steps, summed (what the bench reports)."""
    return sum(f.tokens for f in done) / max(sum(f.steps for f in done), 1)


class Fleet:
    """Two replicas stepping in lockstep, `clients` requests in flight in all."""

    def __init__(self, routing: str, shared: bool, table: StepTable, clients: int, lag: int, la: LookaheadConfig):
        self.routing, self.shared, self.table = routing, shared, table
        self.clients, self.lag, self.la = clients, lag, la
        self.reps = [self.fresh(0), self.fresh(1)]
        self.home: dict[int, int] = {}  # passage: index in reps of the replica that took its first question
        self.pending: deque = deque()  # (due finish count, Replica, output tokens)
        self.fleet_outputs: list[list[int]] = []  # what the fleet memory's actor holds
        self.figures, self.turn = ArmFigures(), 0

    def fresh(self, name: int) -> Replica:
        return Replica(TokenTrie(self.la.branch_length + 1, self.la.stop_words), name=name)

    def run(self, rows: list[tuple[int, dict]]) -> None:
        waiting = deque(rows)
        while waiting or any(r.running for r in self.reps):
            while waiting and sum(len(r.running) for r in self.reps) < self.clients:
                self.admit(*waiting.popleft())
            for k, rep in enumerate(self.reps):
                if rep.running:
                    self.step(k, rep)
            while self.pending and self.pending[0][0] <= len(self.figures.done):
                _, rep, tokens = self.pending.popleft()
                rep.memory.add_sequence(tokens)

    def admit(self, i: int, row: dict) -> None:
        loads = [len(r.running) for r in self.reps]
        home = self.home.get(row["passage"])
        if self.routing == "affinity" and home is not None and loads[home] <= min(loads) + 1:
            k = home
        elif loads[0] != loads[1]:
            k = loads.index(min(loads))
        else:
            k, self.turn = self.turn, 1 - self.turn
        self.home.setdefault(row["passage"], k)
        seq = Sequence(list(row["prompt_ids"]), StopCriteria(len(row["out"])), SamplingParams(), self.la)
        self.reps[k].running.append((seq, list(row["out"]), i))

    def step(self, k: int, rep: Replica) -> None:
        replay_step([(seq, truth) for seq, truth, _ in rep.running], rep.memory, rep.calibration, self.table,
                    MAX_TOKENS_PER_STEP)
        for seq, _, i in rep.running:
            if not seq.finished:
                continue
            self.figures.done.append(Finished(i, rep.name, len(seq.tokens), seq.stats.steps))
            if self.shared:
                self.fleet_outputs.append(list(seq.tokens))
                self.pending.append((len(self.figures.done) + self.lag, self.reps[1 - k], list(seq.tokens)))
        rep.running = [r for r in rep.running if not r[0].finished]

    def replace(self, k: int, warm_calibration: bool, snapshot: bool = True) -> Replica:
        """Replica `k` (idle) gives way to a newcomer that pulls the fleet memory's snapshot (unless not
        `snapshot`: it then hears only what is written after it starts); the router forgets the passages it held.
        `warm_calibration`: the newcomer also takes the survivor's calibration."""
        assert not self.reps[k].running
        new = self.fresh(2)
        for tokens in self.fleet_outputs if snapshot else ():
            new.memory.add_sequence(tokens)
        if warm_calibration:
            new.calibration = copy.deepcopy(self.reps[1 - k].calibration)
        self.pending = deque((due, new if rep is self.reps[k] else rep, t) for due, rep, t in self.pending)
        self.home = {p: h for p, h in self.home.items() if h != k}
        self.reps[k] = new
        return new


def replay(rows: list[dict], routing: str, shared: bool, table: StepTable, clients: int = 4, lag: int = 2,
           la: LookaheadConfig | None = None) -> ArmFigures:
    """Two replicas over `rows` ({id, passage, prompt_ids, out}, in sending order)."""
    fleet = Fleet(routing, shared, table, clients, lag, la or LookaheadConfig())
    fleet.run(list(enumerate(rows)))
    return fleet.figures


@dataclass
class Midrun:
    newcomer: float  # tokens a step over the newcomer's first `first_n` requests
    survivor: float  # ... and the survivor's over the requests it finished in the same stretch
    survivor_requests: int
    warm: float  # the newcomer's requests as the same fleet ran them with no replacement

    @property
    def ratio(self) -> float:
        return self.newcomer / self.survivor

    @property
    def matched(self) -> float:
        """The newcomer against warm replicas on the same requests: what its start costs, apart from which
        passages it happened to take."""
        return self.newcomer / self.warm


def midrun(rows: list[dict], table: StepTable, warm_calibration: bool, clients: int = 4, lag: int = 2,
           first_n: int = 20, la: LookaheadConfig | None = None, snapshot: bool = True,
           warm_run: ArmFigures | None = None) -> Midrun:
    """The bench's `midrun` arm: prefix affinity and the fleet memory, replica 0 replaced once a quarter of the
    requests are answered (sending pauses meanwhile, as in the bench). `warm_run`: the same rows replayed with
    no replacement (`replay(rows, "affinity", True, ...)`), if the caller has it already."""
    fleet = Fleet("affinity", True, table, clients, lag, la or LookaheadConfig())
    cut = len(rows) // 4
    fleet.run(list(enumerate(rows))[:cut])
    fleet.replace(0, warm_calibration, snapshot)
    before = len(fleet.figures.done)
    fleet.run(list(enumerate(rows))[cut:])
    after = fleet.figures.done[before:]
    new = [f for f in after if f.replica == 2][:first_n]
    last = after.index(new[-1])
    surv = [f for f in after[: last + 1] if f.replica == 1]
    mine = {f.request for f in new}
    warm_run = warm_run or replay(rows, "affinity", True, table, clients, lag, la)
    warm = [f for f in warm_run.done if f.request in mine]
    return Midrun(rate(new), rate(surv), len(surv), rate(warm))


def repeated(rows: list[dict], repeats: int) -> list[dict]:
    """Each round of questions (one per passage, as recorded) sent `repeats` times over, as the bench's `--repeats`."""
    docs = len({r["passage"] for r in rows})
    rounds = [rows[i:i + docs] for i in range(0, len(rows), docs)]
    return [r for chunk in rounds for _ in range(repeats) for r in chunk]


def record(out: Path) -> None:
    """The workloads' plain greedy outputs, by `generate` (the model's own loop)."""
    import torch

    from loadtest.fleet_bench import workload
    from lookahead.model.models import encode, load_model
    from lookahead.model.reference import hf_generate
    from loadtest.prompt_sets import prompt_path, read_prompts

    passage = {r["id"]: r["passage_id"] for r in read_prompts(prompt_path("narrativeqa"))}
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    lm = load_model("smollm2-135m-instruct", dtype="float32", device="cpu")
    recorded = {}
    for name, (docs, offset) in WORKLOADS.items():
        rows = []
        for w in workload(docs, QUESTIONS, offset):
            ids = encode(lm.tokenizer, w["prompt"], chat=True)
            rows.append({"id": w["id"], "passage": passage[w["id"]], "prompt_ids": ids,
                         "out": hf_generate(lm.model, ids, NEW_TOKENS, lm.eos_token_ids).tokens})
            print(f"{w['id']}: {len(rows[-1]['out'])} tokens", flush=True)
        recorded[name] = rows
    out.write_text(json.dumps(recorded))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default="gpu",
                    help="gpu | dear | flat | a benchmarks.bench JSON (summary.step_table_ms)")
    ap.add_argument("--recorded", type=Path, default=RECORDED)
    ap.add_argument("--record", action="store_true", help="record the outputs into --recorded first")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--lag", type=int, default=2, help="finished requests before an output reaches the other")
    ap.add_argument("--repeats", type=int, default=1, help="send each round of questions this many times over")
    ap.add_argument("--decoding-length", type=int, default=LookaheadConfig().decoding_length,
                    help="most draft tokens a step (with --table flat: the fleet bench's --fixed-budget)")
    args = ap.parse_args(argv)
    if args.record:
        record(args.recorded)
    try:
        recorded = json.loads(args.recorded.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"--recorded {args.recorded}: {e} (make it with --record)")
    table, la = table_of(args.table), LookaheadConfig(decoding_length=args.decoding_length)
    print("| workload | arm | tokens/step | vs pow2, own memory |")
    print("|---|---|---|---|")
    warm_runs = {}  # workload: its affinity_fleet replay, the midrun's reference
    for name, rows in recorded.items():
        rows, base = repeated(rows, args.repeats), None
        for arm, routing, shared in (("pow2_local", "pow2", False), ("affinity_local", "affinity", False),
                                     ("pow2_fleet", "pow2", True), ("affinity_fleet", "affinity", True)):
            f = warm_runs[name] = replay(rows, routing, shared, table, args.clients, args.lag, la)
            base = base or f.tokens_per_step
            print(f"| {name} | {arm} | {f.tokens_per_step:.3f} | {f.tokens_per_step / base - 1:+.1%} |")
    print("\n| workload | newcomer's calibration | newcomer's first 20 | survivor, same stretch (requests) | ratio | "
          "the same 20, no replacement | matched ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in recorded.items():
        for warm in (False, True):
            m = midrun(repeated(rows, args.repeats), table, warm, args.clients, args.lag, la=la,
                       warm_run=warm_runs[name])
            print(f"| {name} | {'the survivor' if warm else 'cold'} | {m.newcomer:.3f} | {m.survivor:.3f} "
                  f"({m.survivor_requests}) | {m.ratio:.3f} | {m.warm:.3f} | {m.matched:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
