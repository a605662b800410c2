"""Three arms per round, order rotating: lookahead with the payoff check, without it, and off."""
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from lookahead.models import load_model, encode
from lookahead.runner import ModelRunner
from lookahead.config import LookaheadConfig
from lookahead.generate import LookaheadDecoder
from lookahead.sequence import StopCriteria
from lookahead.scheduler import SchedulerConfig
from lookahead.prompt_sets import read_prompts
from lookahead.payoff import Payoff
from lookahead import bench_engine, heap
setname, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lm = load_model("smollm2-135m-instruct")
runner = ModelRunner(lm.model); runner.check_tree_masks()
dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
stop = StopCriteria(64, frozenset(lm.eos_token_ids))
prompts = [encode(lm.tokenizer, r["prompt"], True) for r in read_prompts(ROOT / f"benchmarks/prompts/{setname}.jsonl", 16, 0)]
sched = SchedulerConfig(max_batch_size=16, max_tokens_per_step=256)
state = {"pay": True}
orig_allow = Payoff.allow
Payoff.allow = lambda self, rows: orig_allow(self, rows) if state["pay"] else True
arms = {"pay": (dec.config, True), "nopay": (dec.config, False), "off": (LookaheadConfig(enabled=False), True)}
for cfg, pay in arms.values():
    state["pay"] = pay; bench_engine.run_level(dec, prompts[:2], 2, stop, cfg, sched)
heap.settle()
tot = {k: [0, 0.0] for k in arms}
names = list(arms)
for r in range(rounds):
    order = names[r % 3:] + names[:r % 3]
    if r % 2: order = order[::-1]
    for name in order:
        cfg, pay = arms[name]; state["pay"] = pay
        run = bench_engine.run_level(dec, prompts, conc, stop, cfg, sched)
        tot[name][0] += run.tokens; tot[name][1] += run.wall_s
rate = {k: t / s for k, (t, s) in tot.items()}
print(f"{setname} c{conc} {rounds} rounds: pay/off {rate['pay'] / rate['off']:.3f}  nopay/off {rate['nopay'] / rate['off']:.3f}  "
      f"(tok/s pay {rate['pay']:.1f} nopay {rate['nopay']:.1f} off {rate['off']:.1f})", flush=True)
