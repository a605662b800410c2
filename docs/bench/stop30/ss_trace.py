"""Single stream over the first prompts of a set: each step's kind and time, from the payoff's records."""
import sys

from common import load
from lookahead.sequence import StopCriteria
from lookahead.payoff import Payoff
from lookahead import heap

setname, limit = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3: Payoff.allow = lambda self, rows: True
dec, prompts, stop = load(setname, limit, 128)
warm = prompts[0][:64]
dec.generate(warm, stop=StopCriteria(8, stop.eos_token_ids)); dec.memory.clear(); heap.settle()
log = []
orig = Payoff.record
def rec(self, rows, proposed, tokens, seconds):
    log.append((proposed, tokens, seconds, self.pays(rows))); return orig(self, rows, proposed, tokens, seconds)
Payoff.record = rec
for i, ids in enumerate(prompts):
    log.clear()
    g = dec.generate(ids, stop=stop)
    d = [(t, s) for p, t, s, _ in log if p]; h = [(t, s) for p, t, s, _ in log if not p]
    r = lambda x: sum(t for t, _ in x) / sum(s for _, s in x) if x else 0
    print(f"prompt {i}: {len(g.tokens)} tokens, {len(log)} steps; proposing {len(d)} at {r(d):.1f} tok/s, held {len(h)} at {r(h):.1f} tok/s")
    if i == 0:
        print("   ", " ".join(f"{'D' if p else 'h'}{t}:{s*1e3:.0f}" for p, t, s, _ in log[:130]))
