"""The Grafana dashboard (dashboards/lookahead.json) plots only metrics the replicas export, under the names
Ray's Prometheus endpoint gives them.

Ray exports a `ray.serve.metrics` metric `name` as `ray_name`; a counter's samples as `ray_name_total`, a
histogram's as `ray_name_bucket`, `_sum` and `_count` (serve_app/metrics.py). The first tests check the
dashboard's expressions against the metrics serve_app/metrics.py defines; the last scrapes a running server's
metrics endpoint (the node's metrics agent, `MetricsExportPort`) and finds every plotted name there.
"""

import json
import re
import time
from pathlib import Path

import pytest
import requests

from serve_app.metrics import ReplicaMetrics
from tests.conftest import load_prompts
from tests.serving import ANSWER_TIMEOUT, deploy, smollm2_model

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "lookahead.json"
METRIC = re.compile(r"ray_lookahead_[a-z_]+")
EXPORT_TIMEOUT_S = 90  # Ray reports a worker's metrics to the agent every few seconds; a loaded machine is slower


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def plotted(dashboard: dict) -> set[str]:
    return {name for e in expressions(dashboard) for name in METRIC.findall(e)}


def exported_names() -> set[str]:
    """The Prometheus sample names serve_app/metrics.py's metrics get, as Ray exports them."""
    from ray.util.metrics import Counter, Gauge, Histogram

    m = ReplicaMetrics("dashboard-test")
    metrics = []
    for value in vars(m).values():
        metrics.extend(value.values() if isinstance(value, dict) else [value])
    names = set()
    for metric in metrics:
        if not isinstance(metric, (Counter, Gauge, Histogram)):
            continue
        name = "ray_" + metric.info["name"]
        if isinstance(metric, Counter):
            names.add(name + "_total")
        elif isinstance(metric, Histogram):
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def test_every_plotted_metric_is_one_the_replicas_define():
    names = exported_names()
    assert "ray_lookahead_accepted_draft_tokens_total" in names  # the acceptance panels' counter
    used = plotted(load_dashboard())
    assert used, "no ray_lookahead_ metric found in the dashboard's expressions"
    assert used <= names, f"plotted but not exported: {sorted(used - names)}"


def test_the_brief_s_panels_are_there():
    # Not the layout, only what each asked-for panel must plot.
    used = plotted(load_dashboard())
    for name in ("ray_lookahead_generated_tokens_total",
                 "ray_lookahead_accepted_tokens_per_step_sum", "ray_lookahead_accepted_tokens_per_step_count",
                 "ray_lookahead_accepted_tokens_per_step_bucket",
                 "ray_lookahead_draft_tokens_total", "ray_lookahead_accepted_draft_tokens_total",
                 "ray_lookahead_time_to_first_token_s_bucket", "ray_lookahead_engine_queue",
                 "ray_lookahead_kv_used_bytes", "ray_lookahead_kv_budget_bytes", "ray_lookahead_prefix_cache_bytes",
                 "ray_lookahead_running", "ray_lookahead_waiting", "ray_lookahead_decode_steps_total"):
        assert name in used, name


def test_the_dashboard_is_importable_and_filtered_by_its_variables():
    d = load_dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model_query = variables["model"]["query"]
    assert "label_values(ray_lookahead_generated_tokens_total, model)" in json.dumps(model_query)
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            # every series the expression selects is filtered on the chosen models
            selectors = re.findall(r"ray_lookahead_[a-z_]+(\{[^}]*\})?", t["expr"])
            assert selectors and all(s == '{model=~"$model"}' for s in selectors), (p["title"], t["expr"])


def test_a_finished_request_counts_its_accepted_drafts():
    class Recorder:
        def __init__(self) -> None:
            self.total = 0.0

        def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
            self.total += value

    m = ReplicaMetrics("smol")
    m.drafts, m.accepted_drafts, m.requests = Recorder(), Recorder(), Recorder()
    m.finished("ok", new_tokens=30, draft_tokens=40, per_step=1.5, accepted_draft_tokens=10)
    m.finished("ok", new_tokens=5)
    assert (m.drafts.total, m.accepted_drafts.total) == (40, 10)


# ---- a running server ----------------------------------------------------------------------------------------
APP = "dash"
MODEL_ID = "smollm2-dash"


def scrape() -> dict[str, set[str]]:
    """The sample names of this test's model on every live node's metrics endpoint: {name: {node address}}."""
    import ray

    seen: dict[str, set[str]] = {}
    for node in ray.nodes():
        if not node.get("Alive", node.get("alive")):
            continue
        addr = f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"
        try:
            text = requests.get(f"http://{addr}/metrics", timeout=10).text
        except requests.RequestException:
            continue
        for line in text.splitlines():
            if line.startswith("ray_lookahead_") and f'model="{MODEL_ID}"' in line:
                seen.setdefault(METRIC.match(line).group(0), set()).add(addr)
    return seen


@pytest.mark.slow
def test_a_running_server_exports_every_metric_the_dashboard_plots(serve_url):
    """SmolLM2 deployed as configs/smollm2.yaml does (a fixed replica count, no autoscaling), two requests that
    draft and get drafts accepted, then every metric the dashboard plots must appear on the metrics endpoint."""
    from ray import serve

    want = plotted(load_dashboard())
    base = serve_url + deploy(APP, {"models": [smollm2_model(MODEL_ID)]})
    try:
        prompt = load_prompts("humaneval", 1)[0]["prompt"]  # its answer repeats its code: drafts are accepted
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64,
                "temperature": 0}
        accepted = 0
        for _ in range(2):
            r = requests.post(f"{base}/v1/chat/completions", json=body, timeout=ANSWER_TIMEOUT)
            assert r.status_code == 200, r.text
            accepted += r.json()["lookahead"]["accepted_draft_tokens"]
        assert accepted > 0, "no draft was accepted: the draft counters would have nothing to show"

        seen: dict[str, set[str]] = {}
        deadline = time.monotonic() + EXPORT_TIMEOUT_S
        while time.monotonic() < deadline:
            seen = scrape()
            if want <= seen.keys():
                break
            time.sleep(2)
        assert want <= seen.keys(), (f"plotted but not on the metrics endpoint after {EXPORT_TIMEOUT_S} s: "
                                     f"{sorted(want - seen.keys())}; exported: {sorted(seen)}")
    finally:
        serve.delete(APP)

