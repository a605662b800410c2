"""ABBA on/off runs of one level in one process; prints each run's tok/s."""
import sys

from common import SCHED, load
from lookahead.config import LookaheadConfig
from lookahead import bench_engine, heap

setname, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dec, prompts, stop = load(setname, 16, 64)
sched = SCHED
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
