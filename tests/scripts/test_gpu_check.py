"""scripts/gpu_check.py --smoke: every section of the GPU check runs on CPU at tiny sizes, so the script the GPU
machine will run cannot rot between the sessions that have one. The sections' findings are checked where they
are facts on any device (fp32 agreement, the memory plan), not timings."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("A_startup", "B_agreement", "C_timing", "D_load", "E_memory", "F_speedup")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return {name: json.loads((out / f"{name}.json").read_text()) for name in SECTIONS}


def test_every_section_writes_its_file_without_error(smoke):
    for name, record in smoke.items():
        assert record["error"] is None and record["result"] is not None, name
        assert record["machine"]["smoke"] is True and record["seconds"] >= 0


def test_startup_finds_the_masks_honoured_and_the_tree_equal_to_sequential_in_fp32(smoke):
    a = smoke["A_startup"]["result"]
    assert a["float32"]["mask_checks"] is True and a["bfloat16"]["mask_checks"] is True
    assert a["float32"]["max_abs_dlogit_tree_vs_sequential"] < 1e-3
    assert a["bfloat16"]["exact"] is True  # half precision takes the exact path by default: the same bits
    assert a["bfloat16"]["max_abs_dlogit_tree_vs_sequential"] == 0.0


def test_agreement_is_token_for_token_in_both_dtypes(smoke):
    b = smoke["B_agreement"]["result"]
    for dtype in ("float32", "bfloat16"):
        for level in b[dtype]["levels"].values():
            assert level["equal_to_plain"] == level["prompts"] > 0, (dtype, level)
    for level in b["float32"]["levels"].values():
        assert level["equal_to_generate"] == level["prompts"]


def test_timing_and_load_report_their_points(smoke):
    c = smoke["C_timing"]["result"]
    timed = [p for p in c["points"] if "ms" in p]
    assert len(timed) == 2 * 2 * 2 and all(p["ms"] > 0 and p["table_ms"] > 0 for p in timed)
    d = smoke["D_load"]["result"]
    assert d["finished"] == d["requests"] and d["decode_steps"] > 0


def test_the_memory_plan_admits_what_fits_and_no_more(smoke):
    e = smoke["E_memory"]["result"]
    assert e["finished"] == e["requests"] and not e["errors"]
    assert e["plan_admits"] == 2 and e["most_at_once"] == e["plan_admits"]
    assert 0 < e["kv_peak_bytes"] <= e["kv_budget_bytes"]


def test_speedup_runs_both_sets_identical_to_plain(smoke):
    f = smoke["F_speedup"]["result"]
    for name in ("humaneval", "mtbench"):
        assert [lv["concurrency"] for lv in f[name]] == [1, 2]
        assert all(lv["identical"] and lv["ratio"] > 0 for lv in f[name])
