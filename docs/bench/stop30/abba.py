"""ABBA on/off runs of one level in one process; prints each run's tok/s."""
import sys, time
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
from lookahead import bench_engine, heap
setname, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lm = load_model("smollm2-135m-instruct")
runner = ModelRunner(lm.model); runner.check_tree_masks()
dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
stop = StopCriteria(64, frozenset(lm.eos_token_ids))
prompts = [encode(lm.tokenizer, r["prompt"], True) for r in read_prompts(ROOT / f"benchmarks/prompts/{setname}.jsonl", 16, 0)]
sched = SchedulerConfig(max_batch_size=16, max_tokens_per_step=256)
arms = {"on": dec.config, "off": LookaheadConfig(enabled=False)}
for cfg in arms.values():
    bench_engine.run_level(dec, prompts[:2], 2, stop, cfg, sched)
heap.settle()
tot = {"on": [0, 0.0], "off": [0, 0.0]}
for r in range(rounds):
    for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
        run = bench_engine.run_level(dec, prompts, conc, stop, arms[name], sched)
        tot[name][0] += run.tokens; tot[name][1] += run.wall_s
        print(f"{name:3s} {run.tok_s:6.1f}", end="  ", flush=True)
print()
print("ratio", (tot["on"][0] / tot["on"][1]) / (tot["off"][0] / tot["off"][1]))
