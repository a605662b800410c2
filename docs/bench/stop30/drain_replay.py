"""Prototype, not adopted: in the drain (nothing left to start), plan for the time left rather than the step's rate.

A draft token of row b at depth d, if accepted, ends row b one step earlier; the step it leaves is
priced by the table at the rows still running then: T(m) - T(m - 1), m = 1 + the other rows with at
least as many tokens left (a whole step for the longest row). The drain plan maximises the expected ms
saved minus the ms the drafts add now. Replayed on the recorded greedy outputs (16 prompts, 64 tokens,
one prefill a step) priced by a CPU step table, against today's rate planner:

    python docs/bench/stop30/drain_replay.py docs/bench/payoff-run2/humaneval.json
"""
import sys, json, heapq
from pathlib import Path
from collections import deque
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from lookahead import planner as P
from lookahead.calibration import CalibrationTable
from lookahead.config import LookaheadConfig
from lookahead.sampling import SamplingParams
from lookahead.sequence import Sequence, StopCriteria
from lookahead.trie import TokenTrie
from lookahead.verify import accept
from benchmarks.plan_replay import table_of

def net_w(rows, worths, price, max_tokens, margin):
    """Drain: maximise expected ms saved later minus ms spent now; each draft i of row b saves worths[b][i] ms
    if accepted (probability p)."""
    n = len(rows); counts = [0] * n
    base = P.cheapest(price, n, 0, 0, True)[1]
    drafting = inflight = 0; saved = 0.0
    best_net, best = 0.0, list(counts)
    heap = [(-r.probs[0] * w[0], b) for b, (r, w) in enumerate(zip(rows, worths)) if r.probs]
    heapq.heapify(heap)
    while heap and n + inflight < max_tokens:
        neg, b = heapq.heappop(heap)
        drafting += counts[b] == 0; counts[b] += 1; inflight += 1; saved -= neg
        if counts[b] < len(rows[b].probs):
            i = counts[b]
            heapq.heappush(heap, (-rows[b].probs[i] * worths[b][i], b))
        net = saved - margin * (P.cheapest(price, n, drafting, inflight, True)[1] - base)
        if net > best_net:
            best_net, best = net, list(counts)
    return P._plan(rows, best, price, True)

def run(records, conc, table, mode, tokens=64, prefill_ms=90.0):
    la = LookaheadConfig()
    memory, cal = TokenTrie(la.branch_length + 1, la.stop_words), CalibrationTable()
    waiting = deque(records); running = []; ms = 0.0; steps = 0
    while waiting or running:
        if waiting and len(running) < conc:  # one prefill a step, as the engine does
            r = waiting.popleft(); ms += prefill_ms
            out = r["out"][:tokens]
            running.append((Sequence(list(r["prompt_ids"]), StopCriteria(len(out)), SamplingParams(), la), out))
        n = len(running)
        trees = [seq.propose(memory, 0.0) for seq, _ in running]
        cands = [seq.candidates(t, cal, 0.0) for (seq, _), t in zip(running, trees)]
        T = lambda k: table("packed", k, 0) if k > 0 else 0.0
        if mode == "rate":
            plan = P.plan_step(cands, table, 256, True, table.error)
        else:
            if waiting:
                plan = P.plan_step(cands, table, 256, True, table.error)
            else:
                left = [seq.remaining for seq, _ in running]
                worths = []
                for b, (t, c) in enumerate(zip(trees, cands)):
                    depths = t.depths[1:len(c.probs) + 1]
                    w = []
                    for d in depths:
                        m = 1 + sum(1 for j, x in enumerate(left) if j != b and x >= left[b] - d + 1)
                        w.append(T(m) - T(m - 1))
                    worths.append(w)
                plan = net_w(cands, worths, table, 256, 1.0 + table.error)
        ms += plan.ms; steps += 1
        still = []
        for (seq, truth), tree, k in zip(running, trees, plan.counts):
            tree, done = tree.truncated(k), len(seq.tokens)
            acc = accept(tree, lambda row, path: truth[done + len(path)] if done + len(path) < len(truth) else -1)
            seq.advance(tree, acc, cal)
            if seq.finished: seq.close(memory, seq.finish_reason)
            else: still.append((seq, truth))
        running = still
    return ms, steps

def plain(records, conc, table, tokens=64, prefill_ms=90.0):
    waiting = deque(min(tokens, len(r["out"])) for r in records); rows = []; ms = 0.0
    while waiting or rows:
        if waiting and len(rows) < conc:
            rows.append(waiting.popleft()); ms += prefill_ms
        ms += table("packed", len(rows), 0)
        rows = [x - 1 for x in rows if x > 1]
    return ms

rec = json.load(open(ROOT / "benchmarks/greedy_smollm2.json"))
table = table_of(sys.argv[1])
for name in rec:
    recs = rec[name][:16]
    for c in (1, 4, 16):
        off = plain(recs, c, table)
        line = f"{name:14s} c{c:2d}"
        for mode in ("rate", "drain"):
            on, steps = run(recs, c, table, mode)
            line += f"  {mode} {off / on:5.2f}x ({steps} steps)"
        print(line, flush=True)
