"""What the stop-30 scripts share: SmolLM2 with lookahead's defaults, a prompt set, its stop criteria."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from lookahead.config import LookaheadConfig  # noqa: E402
from lookahead.generate import LookaheadDecoder  # noqa: E402
from lookahead.models import encode, load_model  # noqa: E402
from lookahead.prompt_sets import read_prompts  # noqa: E402
from lookahead.runner import ModelRunner  # noqa: E402
from lookahead.scheduler import SchedulerConfig  # noqa: E402
from lookahead.sequence import StopCriteria  # noqa: E402

SCHED = SchedulerConfig(max_batch_size=16, max_tokens_per_step=256)


def load(setname: str, limit: int, max_new_tokens: int):
    """(decoder, chat-encoded prompts of the set's first `limit`, stop criteria)."""
    lm = load_model("smollm2-135m-instruct")
    runner = ModelRunner(lm.model)
    runner.check_tree_masks()
    dec = LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)
    stop = StopCriteria(max_new_tokens, frozenset(lm.eos_token_ids))
    rows = read_prompts(ROOT / f"benchmarks/prompts/{setname}.jsonl", limit, 0)
    return dec, [encode(lm.tokenizer, r["prompt"], True) for r in rows], stop


def three_arms(dec, prompts, stop, conc: int, rounds: int, state: dict) -> dict[str, float]:
    """Pooled tok/s of three arms, each round in a rotating order (reversed every other round): "pay" and
    "nopay" run lookahead with `state["pay"]` True / False (the caller's patch of the payoff check reads it),
    "off" runs plain. Each arm first serves two prompts unmeasured."""
    from lookahead import bench_engine, heap

    arms = {"pay": (dec.config, True), "nopay": (dec.config, False), "off": (LookaheadConfig(enabled=False), True)}
    for cfg, pay in arms.values():
        state["pay"] = pay
        bench_engine.run_level(dec, prompts[:2], 2, stop, cfg, SCHED)
    heap.settle()
    tot = {k: [0, 0.0] for k in arms}
    names = list(arms)
    for r in range(rounds):
        order = names[r % 3:] + names[:r % 3]
        for name in order[::-1] if r % 2 else order:
            cfg, state["pay"] = arms[name]
            run = bench_engine.run_level(dec, prompts, conc, stop, cfg, SCHED)
            tot[name][0] += run.tokens
            tot[name][1] += run.wall_s
    return {k: t / s for k, (t, s) in tot.items()}
