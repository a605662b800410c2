"""Bench JSON -> the markdown table: a held-out slice and a sampled run say so."""

import json

from benchmarks.bench_report import table

ARM = {"per_request_tok_s": 10.0, "p50_latency_s": 1.0, "p95_latency_s": 2.0, "mean_accepted": 1.5,
       "prompt_tokens": 100, "cached_prompt_tokens": 0}


def level(identical):
    return {"concurrency": 4, "on_tok_s": 30.0, "off_tok_s": 25.0, "ratio": 1.2, "identical": identical,
            "on": ARM, "off": ARM}


def test_held_out_and_sampled_runs_are_labelled(tmp_path):
    runs = {"held.json": {"prompts_file": "benchmarks/prompts/mtbench.jsonl", "skip": 16, "levels": [level(True)]},
            "t1.json": {"prompts_file": "benchmarks/prompts/mtbench.jsonl", "levels": [level(None)]},
            "bad.json": {"prompts_file": "benchmarks/prompts/humaneval.jsonl", "skip": 0, "levels": [level(False)]}}
    paths = []
    for name, summary in runs.items():
        (tmp_path / name).write_text(json.dumps({"summary": {**summary, "machine": "test"}}))
        paths.append(tmp_path / name)
    held, sampled, bad = table(paths).splitlines()[2:5]
    assert held.startswith("| mtbench (held out: from prompt 17) | 4 |") and held.endswith("| yes | - |")
    assert sampled.startswith("| mtbench | 4 |") and sampled.endswith("| sampled | - |")
    assert bad.startswith("| humaneval | 4 |") and bad.endswith("| NO | - |")


def test_the_full_batch_ratio_and_its_share_of_the_wall_time_are_shown(tmp_path):
    full = {"on_tok_s": 110.0, "off_tok_s": 100.0, "ratio": 1.1, "on_share": 0.62, "off_share": 0.9,
            "on_steps": 150, "off_steps": 249}
    path = tmp_path / "c4.json"
    path.write_text(json.dumps({"summary": {"prompts_file": "mtbench.jsonl", "machine": "test",
                                            "levels": [{**level(True), "full_batch": full}]}}))
    assert table([path]).splitlines()[2].endswith("| yes | 1.10x (62% / 90%) |")
