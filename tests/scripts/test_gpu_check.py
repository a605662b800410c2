"""scripts/gpu_check.py --smoke: every section of the GPU check runs on CPU at tiny sizes, so the script the GPU
machine will run cannot rot between the sessions that have one. Every section must return its items (a run on
the GPU is short and rare), and a run killed in the middle of a section must leave that section's JSON with
what finished. The findings are checked where they are facts on any device (agreement, the memory plan), not
timings."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu.shape_sections import KERNEL_TILES
from lookahead.model import tree_attention

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "gpu_check.py")
SECTIONS = ("A_startup", "P_profile", "C_timing", "D_load", "E_memory", "F_speedup", "B_agreement")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    run = subprocess.run([sys.executable, SCRIPT, "--smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return {name: json.loads((out / f"{name}.json").read_text()) for name in SECTIONS}


def test_every_section_writes_its_file_done_and_non_empty(smoke):
    for name, record in smoke.items():
        assert record["status"] == "done" and record["error"] is None and record["result"], name
        assert record["machine"]["smoke"] is True and 0 <= record["seconds"] <= record["cap_s"] + 60


def test_startup_finds_the_masks_honoured_and_the_tree_equal_to_sequential(smoke):
    a = smoke["A_startup"]["result"]
    assert a["float32"]["mask_checks"] is True and a["bfloat16"]["mask_checks"] is True
    assert a["float32"]["max_abs_dlogit_tree_vs_sequential"] < 1e-3
    assert a["bfloat16"]["exact"] is True  # half precision takes the exact path by default: the same bits
    assert a["bfloat16"]["max_abs_dlogit_tree_vs_sequential"] == 0.0


def test_profile_lists_the_kernels_of_each_step_exact_and_stock(smoke):
    p = smoke["P_profile"]["result"]
    assert set(p["steps"]) == {"1x1", "4x4"}
    for batch in p["steps"].values():
        assert batch.pop("static_argmax_equals_eager") is True
        # the tree attention kernel runs under Triton's interpreter here (tests/conftest.py): its arm is there too
        assert batch.pop("static_fused_argmax_equals_eager") is True
        assert batch.pop("static_triton_gemm_argmax_equals_eager") is True  # (the Triton GEMM, interpreted too)
        assert set(batch) == {"exact", "exact_static", "exact_static_fused", "exact_static_triton_gemm", "stock",
                              "exact_hf_forward"}
        for step in batch.values():
            assert step["wall_ms"] > 0 and step["kernel_us"] > 0 and 0 < step["top_share_of_kernels"] <= 1
            assert 0 < len(step["top"]) <= 15 and all(k["name"] and k["calls"] >= 1 for k in step["top"])
            assert [k["total_us"] for k in step["top"]] == sorted((k["total_us"] for k in step["top"]), reverse=True)
            assert step["top_level_aten_ops"] > 0 and step["aten_ops_per_layer"] == step["top_level_aten_ops"] / 2
    assert p["cuda_graphs"]["capturing"] is False and p["cuda_graphs"]["captured"] == 0  # CPU: the same, eager


def test_profile_times_one_layers_attention_float64_and_the_kernel_at_each_chunk_and_tile(smoke):
    att = smoke["P_profile"]["result"]["attention"]
    assert att.pop("chunk_in_use") > 0
    assert att.pop("compiled") == []  # (registers and spills of what the GPU compiled: nothing, interpreted)
    assert set(att) == {"1x1", "4x4"}
    for batch in att.values():
        assert batch.pop("kernel_max_abs_diff_vs_float64") < 2 ** -6  # bf16 outputs of the same attention
        tiles = {k: batch.pop(k) for k in list(batch) if k.startswith("tile_")}
        in_use = tree_attention.BM, tree_attention.BN, tree_attention.NUM_WARPS
        assert in_use in KERNEL_TILES and set(tiles) == {"tile_{}x{}_w{}".format(*t) + ("_in_use" if t == in_use else "")
                                                         for t in KERNEL_TILES}
        for tile in tiles.values():  # every tile is the same attention, so within bf16 rounding of float64
            assert tile["us"] > 0 and tile["max_abs_diff_vs_float64"] < 2 ** -6
        assert set(batch) == {"float64_gathered_us", "kernel_chunk_128_us", "kernel_chunk_256_us",
                              "kernel_chunk_512_us", "kernel_chunk_whole_us"}
        assert all(us > 0 for us in batch.values())


def test_profile_asks_whether_the_stock_gemm_is_row_invariant_at_each_call_size(smoke):
    gemm = smoke["P_profile"]["result"]["gemm"]
    assert gemm.pop("compiled") == []  # (interpreted: nothing compiled)
    assert set(gemm) == {"gate_proj", "down_proj", "lm_head"}
    for item in gemm.values():
        assert isinstance(item["position_invariant"], bool) and item["dtype"] == "torch.bfloat16"
        assert set(item["rows"]) == {"1", "16", "128", "256", "512", "1024"}
        for m, r in item["rows"].items():
            assert r["us"] > 0 and r["padded_us"] > 0 and isinstance(r["rows_equal_to_fixed"], bool)
        assert item["rows"]["128"]["rows_equal_to_fixed"] is True  # the same call twice: the same bits
        tg = item["triton"]  # the Triton GEMM, under the interpreter here (tests/conftest.py)
        assert tg["splits"] >= 1 and isinstance(tg["position_invariant"], bool) and tg["max_abs_diff_vs_stock"] < 0.1
        assert set(tg["rows"]) == set(item["rows"]) and all(r["us"] > 0 for r in tg["rows"].values())
        assert all(r["rows_equal_to_fixed"] is True for r in tg["rows"].values())  # (the CPU's numpy shows this)


def test_agreement_has_both_levels_in_bf16_and_is_token_for_token(smoke):
    b = smoke["B_agreement"]["result"]
    assert list(b) == ["bfloat16", "float32"]  # bf16 first: it is what GPUs serve
    for dtype in b:
        levels = b[dtype]["levels"]
        assert set(levels) == {"1", "2"}, dtype
        for level in levels.values():
            assert level["equal_to_plain"] == level["prompts"] == 3, (dtype, level)
            assert level["with_reference"] == 3  # HF generate made beside each prompt, not all up front
    assert b["bfloat16"]["levels"]["2"]["plain_equal_to_plain_alone"] == 3  # exact: a batch changes no bits
    for level in b["float32"]["levels"].values():
        assert level["equal_to_generate"] == level["with_reference"]


def test_timing_and_load_report_their_points(smoke):
    c = smoke["C_timing"]["result"]
    timed = [p for p in c["points"] if "ms" in p]
    assert len(timed) == 2 * 2 * 2 and all(p["ms"] > 0 and p["table_ms"] > 0 for p in timed)
    d = smoke["D_load"]["result"]
    assert d["finished"] == d["requests"] and d["decode_steps"] > 0
    learnt = d["output_learning"]  # the CPU runs work as it is queued: no shadow, every output learnt at once
    assert learnt["in_shadow"] == 0 and learnt["at_once"] > 0 and learnt["pending"] == 0


def test_the_memory_plan_admits_what_fits_and_no_more(smoke):
    e = smoke["E_memory"]["result"]
    assert e["finished"] == e["requests"] and not e["errors"]
    assert e["plan_admits"] == 2 and e["most_at_once"] == e["plan_admits"]
    assert 0 < e["kv_peak_bytes"] <= e["kv_budget_bytes"]


def test_speedup_has_both_sets_both_arms_and_hf_beside_them(smoke):
    f = smoke["F_speedup"]["result"]
    for name in ("humaneval", "mtbench"):
        assert [lv["concurrency"] for lv in f[name]] == [1, 2]
        for lv in f[name]:
            assert lv["on"]["tok_s"] > 0 and lv["off"]["tok_s"] > 0 and lv["on_over_off"] > 0
            assert lv["on"]["finished"] == lv["off"]["finished"] == lv["prompts"]
            assert lv["on_equal_to_off"] == {"equal": lv["prompts"], "of": lv["prompts"]}  # lossless
        one = f[name][0]
        for arm in ("hf_generate", "hf_prompt_lookup"):
            assert one[arm]["tok_s"] > 0 and one[arm]["finished"] == one["prompts"]
        for arm in ("off", "on", "hf_prompt_lookup"):
            assert one[f"{arm}_over_hf_generate"] > 0
            assert one[f"{arm}_equal_to_hf_generate"]["of"] == one["prompts"]  # compared, prompt for prompt


def test_a_run_killed_in_a_section_leaves_what_that_section_finished(tmp_path):
    proc = subprocess.Popen([sys.executable, SCRIPT, "--smoke", "--sections", "B", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path, first = tmp_path / "B_agreement.json", None
    try:
        end = time.monotonic() + 600
        while time.monotonic() < end and proc.poll() is None:  # wait for the first item: one prompt of level 1
            try:
                level = json.loads(path.read_text())["result"]["bfloat16"]["levels"].get("1")
            except (FileNotFoundError, KeyError):  # not written yet, or not that far (never half a file)
                level = None
            if level:
                first = level
                break
            time.sleep(0.2)
        assert first is not None and proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        proc.kill()
    record = json.loads(path.read_text())
    assert rc == 128 + signal.SIGTERM
    assert record["status"] == "killed: SIGTERM"
    kept = record["result"]["bfloat16"]["levels"]["1"]
    assert kept["prompts"] >= first["prompts"] >= 1 and kept["equal_to_plain"] == kept["prompts"]


def test_a_budget_that_leaves_nothing_is_refused_by_name(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "--smoke", "--budget-s", "5", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "--budget-s 5" in run.stderr
    assert not list(tmp_path.iterdir())
