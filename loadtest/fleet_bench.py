"""Replicas that learn together, measured: power-of-two routing with per-replica memories against prefix-affinity
routing with the fleet memory, on repeated-prefix traffic through the whole server.

    .venv/bin/python -m loadtest.fleet_bench --docs 8 --questions 5 --clients 4 --max-tokens 64 --out results/fleet

The workload: `--docs` passages of the shipped narrativeqa set (from `--offset`), each asked its own
`--questions` questions, interleaved (every passage's first question, then every passage's second, ...), sent by
`--clients` concurrent streaming chat clients over HTTP, greedy; `--repeats 2` sends each round twice, as when
users ask what others asked before (answers repeat across users). Each arm is a fresh app of two SmolLM2 replicas
on the same Ray cluster:

- `pow2_local`: Serve's power of two choices, each replica learning alone (`routing: pow2`, `shared_memory: false`);
- `affinity_fleet`: prefix-affinity routing and the fleet memory (the defaults);
- `midrun` (with `--midrun`): `affinity_fleet` on the next 2 x `--docs` passages, with one replica killed once a
  quarter of the requests are answered; sending pauses until Serve's replacement answers (its model load; the
  fault tests cover requests in flight), then the rest goes to the survivor and the newcomer, which joins the
  fleet memory. The newcomer's tokens a step over its first 20 requests are set against the survivor's over the
  same stretch;
- `midrun_warm` (with `--midrun`): the same workload with no replacement, so the newcomer's first 20 requests are
  also set against the same requests run by warm replicas (`midrun_matched`: which passages the newcomer took
  moves the survivor ratio by more than its cold start does).

Per arm: TTFT p50 and p90 (first content chunk), tokens a step (completion tokens / decode steps, summed),
tok/s (completion tokens / the arm's wall time), and whether every output equals the other arm's. Writes
`--out`/fleet.json and prints a markdown table.
"""

import argparse
import json
import platform
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from loadtest.prompt_sets import prompt_path, read_prompts

MODEL = "smollm2"
FIRST_N = 20  # the newcomer's first requests, over which its tokens a step are taken


def workload(docs: int, questions: int, offset: int, repeats: int = 1) -> list[dict]:
    """(passage, question) requests, questions interleaved across passages; with `repeats`, each round of questions
    is sent that many times over (a second user asking what the first asked, `docs` requests later)."""
    by_passage: dict[int, list[dict]] = {}
    for row in read_prompts(prompt_path("narrativeqa")):
        by_passage.setdefault(row["passage_id"], []).append(row)
    chosen = [by_passage[p] for p in sorted(by_passage)[offset:offset + docs]]
    if len(chosen) < docs or any(len(rows) < questions for rows in chosen):
        raise SystemExit(f"narrativeqa has no {docs} passages with {questions} questions from passage {offset}")
    return [{"id": rows[q]["id"], "prompt": rows[q]["prompt"]}
            for q in range(questions) for _ in range(repeats) for rows in chosen]


def app_args(routing: str, shared: bool, max_tokens: int, fixed_budget: int | None = None) -> dict:
    """One arm's app: two SmolLM2 replicas; with `fixed_budget`, PIA's fixed draft budget (`adaptive: false`,
    `decoding_length` that many) instead of drafts sized from the measured step costs, so that how many tokens a
    step accepts depends on the drafts alone, not on how the machine timed its steps."""
    lookahead = {"shared_memory": shared}
    if fixed_budget is not None:
        lookahead |= {"adaptive": False, "decoding_length": fixed_budget}
    return {"models": [{
        "name": MODEL, "model": "smollm2-135m-instruct", "dtype": "float32", "device": "cpu", "torch_threads": 1,
        "routing": routing, "lookahead": lookahead,
        "limits": {"max_prompt_tokens": 2048, "max_new_tokens": max_tokens, "default_max_tokens": max_tokens},
        "deployment": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}, "graceful_shutdown_timeout_s": 5},
    }]}


def one_request(base: str, row: dict, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first, text, la, usage, rid = None, [], {}, {}, None
    body = {"model": MODEL, "messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(f"{base}/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            rid = chunk.get("id", rid)
            la = chunk.get("lookahead") or la
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - t0
                text.append(piece)
    return {"id": row["id"], "request_id": rid, "text": "".join(text), "ttft_s": first,
            "total_s": time.perf_counter() - t0,
            "tokens": usage.get("completion_tokens", 0), "steps": la.get("steps", 0)}


def replica_loads(handle) -> dict[str, dict]:
    """Each replica's (completed, new_tokens, steps), by actor name (calls go by power of two choices)."""
    out = {}
    for _ in range(4):
        out.update({ld.actor: {"completed": ld.completed, "new_tokens": ld.new_tokens, "steps": ld.steps}
                    for ld in [c.result() for c in [handle.replica_load.remote() for _ in range(4)]]})
    return out


def replica_served(handle) -> dict[str, list[str]]:
    """The request ids each replica finished lately, oldest first, by actor name."""
    out = {}
    for _ in range(4):
        out.update(dict(c.result() for c in [handle.served.remote() for _ in range(4)]))
    return out


def wait_for_replacement(handle, initial: set[str], timeout_s: float = 300.0) -> str:
    """The actor name of the replica Serve starts in place of a killed one, once it answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            fresh = set(replica_loads(handle)) - initial
        except Exception:  # noqa: BLE001 - a call routed to the dead replica; ask again
            fresh = set()
        if fresh:
            return fresh.pop()
        time.sleep(1.0)
    raise SystemExit(f"no replacement replica answered within {timeout_s:.0f} s")


def run_arm(base: str, name: str, rows: list[dict], clients: int, max_tokens: int, kill_after: int | None = None):
    """One arm's records and figures; with `kill_after`, one replica is killed once that many requests are
    answered, sending pauses until Serve's replacement answers, and the rest goes to the two."""
    from ray import serve

    handle = serve.get_deployment_handle(f"Model-{MODEL}", app_name=name)
    samples: list[tuple[float, dict]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                samples.append((time.perf_counter(), replica_loads(handle)))
            except Exception:  # noqa: BLE001 - a replica being replaced; the next sample has it
                pass
            stop.wait(1.0)

    initial = set(replica_loads(handle))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    phases = [rows] if kill_after is None else [rows[:kill_after], rows[kill_after:]]
    records, busy, midrun = [], 0.0, None
    for i, phase in enumerate(phases):
        if i == 1:
            import ray

            victim = sorted(initial)[0]
            t_kill = time.perf_counter()
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            new = wait_for_replacement(handle, initial)
            survivor = next(a for a in initial if a != victim)
            midrun = {"victim": victim, "survivor": survivor, "new": new, "start": replica_loads(handle),
                      "replacement_s": round(time.perf_counter() - t_kill, 1)}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            records += list(pool.map(lambda row: one_request(base, row, max_tokens), phase))
        busy += time.perf_counter() - t0
    time.sleep(2.0)
    stop.set()
    watcher.join(5)
    ttfts = sorted(r["ttft_s"] for r in records if r["ttft_s"] is not None)
    tokens, steps = sum(r["tokens"] for r in records), sum(r["steps"] for r in records)
    out = {"arm": name, "requests": len(records), "wall_s": round(busy, 2), "tok_s": round(tokens / busy, 2),
           "tokens_per_step": round(tokens / max(steps, 1), 3),
           "ttft_p50_s": round(statistics.median(ttfts), 3),
           "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 3), "records": records}
    if midrun:
        out["midrun"] = midrun_figures(samples + [(time.perf_counter(), replica_loads(handle))], midrun)
        mine = set(replica_served(handle).get(midrun["new"], [])[:FIRST_N])
        out["midrun"]["new_replica_rows"] = [i for i, r in enumerate(records) if r["request_id"] in mine]
    return out


def matched(midrun: dict, warm: dict) -> dict:
    """The newcomer's first requests against the same requests (by place in the workload) in `warm`, the same
    workload run with no replacement: what its start costs, apart from which passages it happened to take."""
    rows = midrun["midrun"]["new_replica_rows"]
    new = [midrun["records"][i] for i in rows]
    ref = [warm["records"][i] for i in rows]
    new_rate = sum(r["tokens"] for r in new) / max(sum(r["steps"] for r in new), 1)
    ref_rate = sum(r["tokens"] for r in ref) / max(sum(r["steps"] for r in ref), 1)
    return {"requests": len(rows), "new_tokens_per_step": round(new_rate, 3),
            "warm_tokens_per_step_same_requests": round(ref_rate, 3),
            "ratio": round(new_rate / ref_rate, 3) if ref_rate else None}


def midrun_figures(samples, midrun: dict, first_n: int = FIRST_N) -> dict:
    """The new replica's tokens a step over its first `first_n` requests, and the survivor's over the same stretch
    (from the moment the new one answered to the first sample where it had completed `first_n`)."""
    new, survivor, start = midrun["new"], midrun["survivor"], midrun["start"][midrun["survivor"]]
    seen = [ld for _, ld in samples if new in ld and survivor in ld]
    end = next((ld for ld in seen if ld[new]["completed"] >= first_n), seen[-1])
    n, s = end[new], end[survivor]
    new_rate = n["new_tokens"] / max(n["steps"], 1)
    surv_tokens, surv_steps = s["new_tokens"] - start["new_tokens"], s["steps"] - start["steps"]
    surv_rate = surv_tokens / max(surv_steps, 1)
    return {"replacement_s": midrun["replacement_s"], "new_replica_requests": n["completed"],
            "survivor_requests_same_stretch": s["completed"] - start["completed"],
            "new_tokens_per_step": round(new_rate, 3), "survivor_tokens_per_step_same_stretch": round(surv_rate, 3),
            "ratio": round(new_rate / surv_rate, 3) if surv_rate else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.fleet_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--offset", type=int, default=0, help="first narrativeqa passage")
    p.add_argument("--repeats", type=int, default=1, help="times each round of questions is sent")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--midrun", action="store_true", help="also the arm whose replica is replaced mid-run")
    p.add_argument("--fixed-budget", type=int, default=None, metavar="N",
                   help="PIA's fixed budget of N draft tokens a step (adaptive off): tokens/step free of step timing")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--out", default="results/fleet")
    args = p.parse_args(argv)

    import ray
    from ray import serve

    from serve_app.builder import build_app
    from serve_app.config import AppConfig

    rows = workload(args.docs, args.questions, args.offset, args.repeats)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    url = f"http://127.0.0.1:{args.port}"
    arms = [("pow2_local", "pow2", False, rows, None), ("affinity_fleet", "prefix_affinity", True, rows, None)]
    if args.midrun:
        more = workload(2 * args.docs, args.questions, args.offset + args.docs, args.repeats)
        arms.append(("midrun", "prefix_affinity", True, more, len(more) // 4))
        arms.append(("midrun_warm", "prefix_affinity", True, more, None))
    results = []
    try:
        for name, routing, shared, arm_rows, kill_after in arms:
            config = AppConfig.model_validate(app_args(routing, shared, args.max_tokens, args.fixed_budget))
            serve.run(build_app(config), name=name, route_prefix=f"/{name}")
            base = f"{url}/{name}"
            one_request(base, {"id": "warm-up", "prompt": "Hi"}, 1)  # both replicas are up once serve.run returns
            print(f"{name}: {len(arm_rows)} requests, {args.clients} clients", flush=True)
            results.append(run_arm(base, name, arm_rows, args.clients, args.max_tokens, kill_after))
            serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    a, b = results[0], results[1]
    same = sum(x["text"] == y["text"] for x, y in zip(a["records"], b["records"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"args": vars(args), "machine": platform.processor() or platform.machine(),
               "identical_outputs": f"{same}/{len(a['records'])}", "arms": results,
               "ttft_p50_reduction": round(1 - b["ttft_p50_s"] / a["ttft_p50_s"], 3),
               "tokens_per_step_gain": round(b["tokens_per_step"] / a["tokens_per_step"] - 1, 3),
               "tok_s_ratio": round(b["tok_s"] / a["tok_s"], 3)}
    if args.midrun:
        summary["midrun_matched"] = matched(results[2], results[3])
        summary["midrun_identical_outputs"] = \
            f"{sum(x['text'] == y['text'] for x, y in zip(results[2]['records'], results[3]['records']))}/{len(more)}"
    (out / "fleet.json").write_text(json.dumps(summary, indent=1))
    print("| arm | TTFT p50 s | TTFT p90 s | tokens/step | tok/s |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['arm']} | {r['ttft_p50_s']} | {r['ttft_p90_s']} | {r['tokens_per_step']} | {r['tok_s']} |")
    print(f"identical outputs {summary['identical_outputs']}; TTFT p50 {summary['ttft_p50_reduction']:+.1%} lower; "
          f"tokens/step {summary['tokens_per_step_gain']:+.1%}; tok/s x{summary['tok_s_ratio']}")
    for r in results:
        if "midrun" in r:
            print(f"midrun: {r['midrun']}")
    if args.midrun:
        print(f"midrun, matched: {summary['midrun_matched']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
