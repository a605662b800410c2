"""A short smoke of the sweep (2 levels, a few requests each) with real locust against a real server.

The server is the A/B config's two SmolLM2 deployments on the session's Ray
cluster; the sweep must write the locust CSVs, the summary, the table and
the plot, fail no request, and find the two arms' greedy texts identical.
"""

import json
from pathlib import Path

import pytest
import yaml

from tests.serving import deploy

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ab_url(serve_url):
    from ray import serve

    args = yaml.safe_load((REPO / "configs" / "smollm2-ab.yaml").read_text())["applications"][0]["args"]
    for m in args["models"]:
        m["deployment"]["ray_actor_options"] = {"num_cpus": 1}
        m["lookahead"]["adaptive"] = False  # skip the start-up cost measurement: speed is not checked here
    yield serve_url + deploy("ab", args)
    serve.delete("ab")


def test_sweep_smoke(ab_url, tmp_path):
    from loadtest import sweep
    from loadtest.prompt_sets import prompt_path

    out = tmp_path / "sweep"
    rc = sweep.main(["--url", ab_url, "--levels", "1,2", "--requests", "3", "--max-tokens", "24",
                     "--prompts", str(prompt_path("mtbench")), "--out", str(out), "--run-timeout", "300"])
    assert rc == 0
    for name in ("summary.json", "table.md", "speedup.png", "c1_smollm2-lookahead_stats.csv",
                 "c2_smollm2-plain_stats.csv", "c2_smollm2-lookahead.jsonl"):
        assert (out / name).stat().st_size > 0, name
    s = json.loads((out / "summary.json").read_text())
    assert [lv["concurrency"] for lv in s["levels"]] == [1, 2]
    for lv in s["levels"]:
        assert lv["on"]["failures"] == 0 and lv["off"]["failures"] == 0
        assert lv["on"]["requests"] == 3 and lv["off"]["requests"] == 3
        assert lv["identical"] and lv["compared"] == 3
        assert lv["on_tok_s"] > 0 and lv["off_tok_s"] > 0 and lv["ratio"] > 0
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
