"""The engine's host work a decode step, outside the forward: what a GPU waits on between steps.

On a GPU whose captured step costs a few milliseconds, the engine's own Python (proposing every row's tree,
planning the step, the acceptance walks, committing) is the rest of the step: the GPU check's section D
measures it there. The host work does not depend on the device, so it is measured here on the CPU with a
tiny random model (its forward is beside the point) under the same load as section D: `--rows` requests
of a repeated phrase and fresh tokens, every row drafting. Prints ms a step by phase at the full batch
(EngineTimes), and plan_step's share of planning:

    python benchmarks/engine_host.py --rows 32 --tokens 1000
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria  # noqa: E402
from lookahead.core import heap  # noqa: E402
from lookahead.core.step_table import StepTable  # noqa: E402
from lookahead.engine import engine as engine_module  # noqa: E402
from lookahead.engine.engine import Engine  # noqa: E402
from lookahead.engine.scheduler import SchedulerConfig  # noqa: E402
from lookahead.model.runner import ModelRunner  # noqa: E402
from tests.lookahead.tiny_models import tiny  # noqa: E402

PHASES = ("plan_s", "forward_s", "accept_s", "commit_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1000, help="max new tokens a request")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    runner = ModelRunner(tiny("qwen2", max_position_embeddings=4096))
    # a GPU-like table (drafts nearly free), fixed: the plans do not follow this CPU's tiny forwards
    table = StepTable.from_function((1, 8, 32, 64), (0, 16, 64, 256, 1024),
                                    lambda lay, r, d: 5 + 0.05 * r + 0.01 * d + (0.5 if lay == "split" else 0))
    table.rate = 0.0
    engine = Engine(LookaheadDecoder(runner, LookaheadConfig(), table=table),
                    SchedulerConfig(max_batch_size=args.rows, max_tokens_per_step=16 * args.rows))
    heap.settle()  # as a replica does once it has loaded: full collections no longer walk the model
    planning = [0.0]
    real = engine_module.plan_step

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = real(*a, **k)
        planning[0] += time.perf_counter() - t0
        return out

    engine_module.plan_step = timed
    g = torch.Generator().manual_seed(args.seed)
    handles = []
    for _ in range(args.rows):
        phrase = torch.randint(0, 96, (12,), generator=g).tolist()
        prompt = phrase * 4 + torch.randint(0, 96, (60,), generator=g).tolist()
        handles.append(engine.add_request(prompt, stop=StopCriteria(args.tokens)))
    while len(engine.scheduler.running) < args.rows or engine.scheduler.prefilling is not None:
        engine.step()
    before = {k: getattr(engine.times, k) for k in PHASES}
    planning[0], steps0 = 0.0, sum(engine.decode_steps.values())
    while not all(h.done for h in handles) and len(engine.scheduler.running) == args.rows:
        engine.step()
    n = sum(engine.decode_steps.values()) - steps0
    ms = {k.removesuffix("_s"): (getattr(engine.times, k) - before[k]) / n * 1e3 for k in PHASES}
    host = ms["plan"] + ms["accept"] + ms["commit"]
    print(f"{n} decode steps at {args.rows} rows; ms a step: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items())
          + f"; of plan, plan_step {planning[0] / n * 1e3:.3f}; host (all but the forward) {host:.3f}")
    engine.close()


if __name__ == "__main__":
    main()
