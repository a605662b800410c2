"""The GPU check's sections on SmolLM2, the embedded default: A start-up, B agreement, F speedup.

Each section fills its SectionRecord item by item (record.py) and checks its deadline between prompts and
between engine steps, so a run cut anywhere keeps what finished.
"""

import traceback
from dataclasses import dataclass, field

import torch

from benchmarks.agreement import divergence
from benchmarks.bench import _top2, hf_logits, runner_logits
from benchmarks.bench_engine import LevelRun, run_level
from benchmarks.gpu.models import Sizes, activities, prompts_of, smollm2, sync
from benchmarks.gpu.record import Deadline, SectionRecord
from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.core.draft import DraftTree, chain
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.model.reference import hf_generate
from lookahead.model.runner import ModelRunner

PLAIN = LookaheadConfig(enabled=False)


def _decoder(dtype: str, sz: Sizes):
    lm = smollm2(dtype, sz.device)
    runner = ModelRunner(lm.model)
    runner.check_tree_masks()
    return lm, runner, LookaheadDecoder(runner, LookaheadConfig(), lm.tokenizer, eos_token_ids=lm.eos_token_ids)


def _mixed_prompts(lm, n: int) -> list[list[int]]:
    """n prompts, humaneval and mtbench alternating, so the first few one at a time already span both sets."""
    a, b = prompts_of(lm, "humaneval", (n + 1) // 2), prompts_of(lm, "mtbench", n // 2)
    return [p for pair in zip(a, b) for p in pair] + a[len(b):]


def _kv_gb(runner: ModelRunner, prompts: list[list[int]], rows: int, new_tokens: int) -> float:
    """A KV budget for `rows` of these prompts at once, with room to spare: the section measures agreement or
    speed, not the device's budget (section E does), so it does not depend on it."""
    longest = max(map(len, prompts)) + new_tokens + 64
    return 1.25 * rows * longest * runner.kv_shape.token_bytes / 2**30


def _seeded(dec: LookaheadDecoder, sched: SchedulerConfig) -> SchedulerConfig:
    """`sched`, with the decoder's step table for its engines seeded now (Engine.__init__ asks the same): the
    seeding's timed forwards are start-up, not a level's share of the deadline (~70 s on 2 CPU cores in bf16,
    where every linear takes the exact path)."""
    dec.step_table(sched.max_batch_size, sched.max_tokens_per_step, sched.ragged and dec.runner.ragged)
    return sched


def _reference(lm, prompt: list[int], tokens: int, dl: Deadline, **kwargs) -> tuple[list[int], float] | None:
    """HF `generate`'s greedy output and seconds; None when `dl` cut it short (`max_time`)."""
    out = hf_generate(lm.model, prompt, tokens, lm.eos_token_ids, max_time=max(dl.left, 0.01), **kwargs)
    finished = len(out.tokens) >= tokens or (out.tokens and out.tokens[-1] in lm.eos_token_ids)
    return (out.tokens, out.total_s) if finished else None


# ---- A. start-up --------------------------------------------------------------------------------------------
def startup(rec: SectionRecord, sz: Sizes) -> None:
    for dtype in ("bfloat16", "float32"):
        if rec.over():
            break
        lm = smollm2(dtype, sz.device)
        runner = ModelRunner(lm.model)
        entry: dict = {"exact": runner.exact}
        try:
            runner.check_tree_masks()
            entry["mask_checks"] = True
        except Exception as e:  # noqa: BLE001 - the finding itself
            entry["mask_checks"] = f"{type(e).__name__}: {e}"
        entry["ragged"] = runner.ragged
        prompt = prompts_of(lm, "humaneval", 1)[0]
        ref = hf_generate(lm.model, prompt, 8, lm.eos_token_ids).tokens
        cache = runner.new_cache(len(prompt) + 16)
        runner.prefill(cache, prompt[:-1])
        tree = chain([prompt[-1], *ref[:7]])
        with torch.profiler.profile(activities=activities(sz.device)) as prof:
            tree_logits = runner.verify(cache, tree)
            sync(sz.device)
        names = {e.key for e in prof.key_averages()}
        entry["attention_kernels"] = sorted(n for n in names if any(k in n.lower() for k in
                                                                   ("attention", "sdpa", "flash", "fmha", "softmax")))
        plain = runner.new_cache(len(prompt) + 16)  # the same tokens one forward each, as plain decoding runs them
        runner.prefill(plain, prompt[:-1])
        sequential = []
        for t in tree.tokens:
            sequential.append(runner.verify(plain, DraftTree([t], [-1], [0], [1.0]))[0])
            plain.commit(plain.length, [0])
        entry["max_abs_dlogit_tree_vs_sequential"] = max(
            float((tree_logits[i] - s).abs().max()) for i, s in enumerate(sequential))
        rec.put((dtype,), entry)


# ---- B. agreement -------------------------------------------------------------------------------------------
@dataclass
class LevelAgreement:
    """One level's outputs, prompt by prompt: lookahead (on), the engine's plain decoding (off), HF `generate`
    (ref, where one was made in time) and, above level 1, the plain decoding of the same prompt alone (single)."""

    runner: ModelRunner
    model: torch.nn.Module
    prompts: list[list[int]]
    items: dict[int, dict] = field(default_factory=dict)

    def add(self, i: int, on: list[int], off: list[int], ref: list[int] | None, single: list[int] | None) -> None:
        top_plain = lambda c: _top2(runner_logits(self.runner, c))  # noqa: E731
        d = divergence(on, off, self.prompts[i], top_plain)
        self.items[i] = {"on": on, "off": off, "single": single,
                         "vs_plain": None if d is None else {"prompt": i, **d.__dict__}}
        if ref is not None:
            self.add_reference(i, ref)

    def add_reference(self, i: int, ref: list[int]) -> None:
        top_hf = lambda c: _top2(hf_logits(self.model, c))  # noqa: E731
        item = self.items[i]
        d = divergence(item["on"], ref, self.prompts[i], top_hf)
        item.update(ref=ref, vs_generate=None if d is None else {"prompt": i, **d.__dict__})

    def as_json(self) -> dict:
        items = self.items.values()
        refd = [it for it in items if "ref" in it]
        single = [it for it in items if it["single"] is not None]
        return {
            "prompts": len(self.items),
            "equal_to_plain": sum(it["vs_plain"] is None for it in items),
            "with_reference": len(refd),
            "equal_to_generate": sum(it["vs_generate"] is None for it in refd),
            "plain_equal_to_generate": sum(it["off"] == it["ref"] for it in refd),
            "plain_equal_to_plain_alone": sum(it["off"] == it["single"] for it in single) if single else None,
            "divergences_vs_plain": [it["vs_plain"] for it in items if it["vs_plain"] is not None],
            "divergences_vs_generate": [it["vs_generate"] for it in refd if it["vs_generate"] is not None],
        }


def agreement(rec: SectionRecord, sz: Sizes) -> None:
    """bf16 first (65% of the cap), fp32 after; in each, prompts one at a time for half its share (with HF
    `generate` made on the fly beside each), then one wave of `agreement_batch` at the higher level, then
    references for that wave's prompts while time is left."""
    one, many = sz.agreement_levels
    for dtype, share in (("bfloat16", 0.65), ("float32", 1.0)):
        if rec.over():
            break
        dl = rec.deadline.share(share)
        lm, runner, dec = _decoder(dtype, sz)
        prompts = _mixed_prompts(lm, max(sz.agreement_prompts, sz.agreement_batch))
        stop = StopCriteria(sz.agreement_tokens, frozenset(lm.eos_token_ids))
        rec.put((dtype,), {"exact": runner.exact, "tokens": sz.agreement_tokens, "levels": {}})
        refs: dict[int, list[int]] = {}
        alone: dict[int, list[int]] = {}
        wave = prompts[: sz.agreement_batch]
        sched = _seeded(dec, SchedulerConfig(max_batch_size=2, max_tokens_per_step=256,
                                             kv_cache_gb=_kv_gb(runner, prompts, 2, sz.agreement_tokens)))
        wave_sched = _seeded(dec, SchedulerConfig(max_batch_size=many, max_tokens_per_step=max(256, many * 8),
                                                  kv_cache_gb=_kv_gb(runner, wave, many, sz.agreement_tokens)))
        first, d1 = LevelAgreement(runner, lm.model, prompts), dl.share(0.5)
        for i, p in enumerate(prompts[: sz.agreement_prompts]):
            if rec.over(d1) or (ref := _reference(lm, p, sz.agreement_tokens, d1)) is None:
                rec.deadline_hit = True
                break
            on = run_level(dec, [p], one, stop, dec.config, sched, stop_when=rec.stop_when(d1))
            off = run_level(dec, [p], one, stop, PLAIN, sched, stop_when=rec.stop_when(d1))
            if on.truncated or off.truncated:
                break
            refs[i], alone[i] = ref[0], off.outputs[0].tokens
            first.add(i, on.outputs[0].tokens, alone[i], refs[i], None)
            rec.put((dtype, "levels", str(one)), first.as_json())
        on = run_level(dec, wave, many, stop, dec.config, wave_sched, stop_when=rec.stop_when(dl))
        off = run_level(dec, wave, many, stop, PLAIN, wave_sched, stop_when=rec.stop_when(dl))
        level = LevelAgreement(runner, lm.model, prompts)
        offs = dict(zip(off.indices(), off.outputs))
        for i, g in zip(on.indices(), on.outputs):
            if i in offs:
                level.add(i, g.tokens, offs[i].tokens, refs.get(i), alone.get(i))
        rec.put((dtype, "levels", str(many)), level.as_json())
        for i in sorted(set(level.items) - set(refs)):
            if rec.over(dl) or (ref := _reference(lm, prompts[i], sz.agreement_tokens, dl)) is None:
                rec.deadline_hit = True
                break
            level.add_reference(i, ref[0])
            rec.put((dtype, "levels", str(many)), level.as_json())


# ---- F. speedup ---------------------------------------------------------------------------------------------
def _engine_arm(run: LevelRun, prompts: int) -> dict:
    steps = sum(g.stats.steps for g in run.outputs)
    return {"tok_s": run.tok_s, "wall_s": run.wall_s, "tokens": run.tokens, "finished": len(run.outputs),
            "of": prompts, "truncated": run.truncated,
            "tokens_per_step": sum(len(g.tokens) for g in run.outputs) / steps if steps else None}


def _hf_arm(lm, prompts: list[list[int]], tokens: int, dl: Deadline, rec: SectionRecord, **kwargs) -> dict:
    outs, seconds = {}, 0.0
    for i, p in enumerate(prompts):
        if rec.over(dl) or (got := _reference(lm, p, tokens, dl, **kwargs)) is None:
            rec.deadline_hit = True
            break
        outs[i], seconds = got[0], seconds + got[1]
    n = sum(map(len, outs.values()))
    return {"tok_s": n / seconds if seconds else None, "wall_s": seconds, "tokens": n, "finished": len(outs),
            "of": len(prompts), "truncated": len(outs) < len(prompts), "outputs": outs}


def _equal(a: dict[int, list[int]], b: dict[int, list[int]]) -> dict:
    both = set(a) & set(b)
    return {"equal": sum(a[i] == b[i] for i in both), "of": len(both)}


def _ratio(a: dict, b: dict, key: str = "tok_s") -> float | None:
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def speedup(rec: SectionRecord, sz: Sizes) -> None:
    """Per set: lookahead on / off through the engine at each level (the device's own KV budget, as a served
    replica has it), and at level 1 HF `generate` and HF prompt lookup on the same prompts. An arm that fails
    is recorded as its error; the rest still run."""
    lm, runner, dec = _decoder("bfloat16" if sz.device == "cuda" else "float32", sz)
    stop = StopCriteria(sz.speed_tokens, frozenset(lm.eos_token_ids))
    rec.put(("dtype",), str(runner.dtype))
    rec.put(("exact",), runner.exact)
    sets = ("humaneval", "mtbench")
    for k, name in enumerate(sets):
        if rec.over():
            break
        dl = rec.deadline.share(1 / (len(sets) - k))  # an even share of what is left
        prompts = prompts_of(lm, name, max(sz.speed_prompts))
        levels: list[dict] = []
        rec.put((name,), levels)
        for n, count in zip(sz.speed_levels, sz.speed_prompts):
            if rec.over(dl):
                break
            ps = prompts[:count]
            level: dict = {"concurrency": n, "prompts": count}
            levels.append(level)
            outputs: dict[str, dict[int, list[int]]] = {}
            sched = SchedulerConfig(max_batch_size=n, max_tokens_per_step=max(256, 16 * n))
            for arm, cfg in (("on", dec.config), ("off", PLAIN)):
                try:
                    run = run_level(dec, ps, n, stop, cfg, sched, stop_when=rec.stop_when(dl))
                    level[arm] = _engine_arm(run, count)
                    outputs[arm] = {i: g.tokens for i, g in zip(run.indices(), run.outputs)}
                except Exception as e:  # noqa: BLE001 - one arm's failure is a finding; the others still run
                    level[arm] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
                rec.save()
            if "on" in outputs and "off" in outputs:
                level["on_equal_to_off"] = _equal(outputs["on"], outputs["off"])
            level["on_over_off"] = _ratio(level["on"], level["off"])
            if n == 1:
                for arm, kwargs in (("hf_generate", {}), ("hf_prompt_lookup", {"prompt_lookup_num_tokens": 10})):
                    try:
                        got = _hf_arm(lm, ps, sz.speed_tokens, dl, rec, **kwargs)
                        outputs[arm] = got.pop("outputs")
                        level[arm] = got
                    except Exception as e:  # noqa: BLE001
                        level[arm] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
                    rec.save()
                for a, b in (("off", "hf_generate"), ("on", "hf_generate"), ("hf_prompt_lookup", "hf_generate")):
                    if a in outputs and b in outputs:
                        level[f"{a}_equal_to_{b}"] = _equal(outputs[a], outputs[b])
                for arm in ("off", "on", "hf_prompt_lookup"):
                    level[f"{arm}_over_hf_generate"] = _ratio(level.get(arm, {}), level.get("hf_generate", {}))
            rec.save()
