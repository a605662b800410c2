"""The most any drafting policy could give on this workload: an oracle that drafts exactly the accepted path.

Replays the recorded greedy outputs (16 prompts, 64 tokens, one prefill a step, N in flight) with the
engine's real `Sequence` proposing from its n-gram index and the shared output memory, priced by a
step-time table, three ways:
- plain: every row one token a step;
- rate: today's planner (`plan_step`, as the engine calls it);
- oracle: every row verifies exactly the drafts the model will accept (the longest matching path of
  its full proposed tree), so no draft is ever rejected;
- oracle-rate: the same certain drafts, but the planner (`plan_step`, each with probability 1) keeps
  the prefix of them that gives the step its best rate: where the table makes a long path cost more
  than it saves, stopping early does better than verifying it all.
The better of the two oracles is what a planner that never wastes a draft could reach with these
proposals, step by step (not a strict bound on the whole run: a step-greedy plan is not the best
plan for the run's end).

    python docs/bench/stop31/oracle_replay.py docs/bench/payoff-run2/humaneval.json

A planning aid: host work and the payoff check are left out, prefill is a flat 90 ms a request.
"""
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import json  # noqa: E402

from benchmarks.plan_replay import table_of  # noqa: E402
from lookahead import planner as P  # noqa: E402
from lookahead.calibration import CalibrationTable  # noqa: E402
from lookahead.config import LookaheadConfig  # noqa: E402
from lookahead.sampling import SamplingParams  # noqa: E402
from lookahead.sequence import Sequence, StopCriteria  # noqa: E402
from lookahead.trie import TokenTrie  # noqa: E402
from lookahead.verify import accept  # noqa: E402

PREFILL_MS = 90.0


def run(records, conc, table, mode, tokens=64):
    """(ms, steps) of serving `records` with `conc` in flight; mode 'plain', 'rate' or 'oracle'."""
    la = LookaheadConfig()
    memory, cal = TokenTrie(la.branch_length + 1, la.stop_words), CalibrationTable()
    waiting, running, ms, steps = deque(records), [], 0.0, 0
    while waiting or running:
        if waiting and len(running) < conc:  # one prefill a step, as the engine does
            r = waiting.popleft()
            ms += PREFILL_MS
            out = r["out"][:tokens]
            running.append((Sequence(list(r["prompt_ids"]), StopCriteria(len(out)), SamplingParams(), la), out))
        n = len(running)
        trees = [seq.root() if mode == "plain" else seq.propose(memory, 0.0) for seq, _ in running]
        accs = []
        for (seq, truth), tree in zip(running, trees):
            done = len(seq.tokens)
            accs.append(lambda t, d=done, truth=truth: accept(
                t, lambda row, path: truth[d + len(path)] if d + len(path) < len(truth) else -1))
        if mode == "rate":
            plan = P.plan_step([seq.candidates(t, cal, 0.0) for (seq, _), t in zip(running, trees)],
                               table, 256, True, table.error)
            trees = [t.truncated(k) for t, k in zip(trees, plan.counts)]
            step_ms, results = plan.ms, [a(t) for a, t in zip(accs, trees)]
        elif mode == "oracle-rate":
            full = [a(t) for a, t in zip(accs, trees)]
            plan = P.plan_step([P.RowDrafts([1.0] * len(acc.rows)) for acc in full], table, 256, True)
            results = [type(acc)(acc.rows[:k], acc.tokens[:k + 1]) for acc, k in zip(full, plan.counts)]
            step_ms = plan.ms
        else:
            results = [a(t) for a, t in zip(accs, trees)]  # oracle: the full tree's accepted path ...
            counts = [len(acc.rows) for acc in results]  # ... is all it verifies
            step_ms = P.cheapest(table, n, sum(c > 0 for c in counts), sum(counts), True)[1]
        ms += step_ms
        steps += 1
        still = []
        for (seq, truth), tree, acc in zip(running, trees, results):
            seq.advance(tree, acc, cal)
            if seq.finished:
                seq.close(memory, seq.finish_reason)
            else:
                still.append((seq, truth))
        running = still
    return ms, steps


if __name__ == "__main__":
    rec = json.load(open(ROOT / "benchmarks/greedy_smollm2.json"))
    table = table_of(sys.argv[1])
    print("| set | in flight | rate planner | oracle | oracle-rate | steps plain / rate / oracle / oracle-rate |\n"
          "|---|---|---|---|---|---|")
    for name in rec:
        recs = rec[name][:16]
        for c in (1, 4, 16):
            off, s0 = run(recs, c, table, "plain")
            rate, s1 = run(recs, c, table, "rate")
            orc, s2 = run(recs, c, table, "oracle")
            orr, s3 = run(recs, c, table, "oracle-rate")
            print(f"| {name} | {c} | {off / rate:.2f}x | {off / orc:.2f}x | {off / orr:.2f}x | {s0} / {s1} / {s2} / {s3} |",
                  flush=True)
