"""Single stream over the first prompts of a set: each step's kind and time, from the payoff's records."""
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from lookahead.models import load_model, encode
from lookahead.runner import ModelRunner
from lookahead.config import LookaheadConfig
from lookahead.generate import LookaheadDecoder
from lookahead.sequence import StopCriteria
from lookahead.prompt_sets import read_prompts
from lookahead.payoff import Payoff
from lookahead import heap
setname, limit = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3: Payoff.allow = lambda self, rows: True
lm = load_model("smollm2-135m-instruct")
runner = ModelRunner(lm.model); runner.check_tree_masks()
dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
stop = StopCriteria(128, frozenset(lm.eos_token_ids))
prompts = [encode(lm.tokenizer, r["prompt"], True) for r in read_prompts(ROOT / f"benchmarks/prompts/{setname}.jsonl", limit, 0)]
warm = prompts[0][:64]
dec.generate(warm, stop=StopCriteria(8, frozenset(lm.eos_token_ids))); dec.memory.clear(); heap.settle()
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
