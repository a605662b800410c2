"""The project's Triton kernels, built for sm_90 (H100, H200) on this CPU machine at the real models' shapes
(lookahead.model.triton_build): the GPU compiler accepts them, ptxas spills nothing, and a plain step and a tree
step run one compiled kernel. Launches are recorded from the real call paths (tree_attention.attend,
TritonLinear.mm), so the builds are the specialisations a GPU run compiles. The builds run in a subprocess:
this suite interprets Triton (tests/conftest.py), and an interpreting process cannot compile."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from lookahead.model import flagships, tree_attention, triton_build  # noqa: E402
from lookahead.model.flagships import FLAGSHIPS  # noqa: E402


def builds(*args: str, code: str = "") -> list[dict]:
    """The JSON lines of `python -m lookahead.model.triton_build *args`, after `code` (a change of constants)."""
    script = f"import sys\n{code}\nfrom lookahead.model import triton_build\ntriton_build.main(sys.argv[1:])"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.fixture(scope="module")
def every_model() -> list[dict]:
    return builds()


def test_a_split_walk_records_both_kernels_and_a_short_one_only_the_first():
    shape = flagships.shape("Qwen2-7B")
    split = triton_build.attention_launches(shape, rows=1, width=1, context=2048)
    assert [launch.name for launch in split] == ["tree_attention", "combine"]
    assert split[0].grid == (1, 4, -(-2049 // tree_attention.CHUNK))  # one row, 4 KV heads, 1 tile x 9 chunks
    short = triton_build.attention_launches(shape, rows=1, width=1, context=100)
    assert [launch.name for launch in short] == ["tree_attention"]


def test_every_kernel_builds_for_sm90_at_every_models_shape_without_spilling(every_model):
    assert {b["model"] for b in every_model} == set(FLAGSHIPS)
    for model in FLAGSHIPS:
        kernels = {(b["kernel"], b["constexprs"].get("SPLIT")) for b in every_model if b["model"] == model}
        assert {("tree_attention", True), ("tree_attention", False), ("combine", None), ("gemm", True),
                ("gemm", False), ("fold", None)} <= kernels, model
    for b in every_model:
        assert not b["spills"], b
        assert b["warps_per_sm"] >= 8, b  # the attention walk is latency-bound: at least 8 warps an SM


@pytest.mark.parametrize("model", FLAGSHIPS)
def test_a_plain_step_and_a_tree_step_run_one_compiled_kernel(model):
    """Width 1 and width 16 at one context, 1 row and 512 of a linear: the arguments that change from step to
    step are not specialised, so the JIT's binder (which runs in this process) makes one specialisation of each
    kernel for both. (A model's linears may differ from each other: each is fixed across steps.)"""
    shape = flagships.shape(model)
    plain = triton_build.attention_launches(shape, rows=1, width=1, context=2048)
    assert triton_build.distinct(plain + triton_build.attention_launches(shape, rows=32, width=16, context=2048)) \
        == triton_build.distinct(plain)
    for lin in shape.linears:
        one = triton_build.linear_launches(lin.out_features, lin.in_features, lin.bias, rows=1)
        assert triton_build.distinct(one + triton_build.linear_launches(lin.out_features, lin.in_features, lin.bias,
                                                                        rows=512)) == triton_build.distinct(one), lin


def test_no_step_varying_argument_is_a_constexpr(every_model):
    for b in every_model:
        assert not {"W", "NCH", "TH", "M"} & set(b["constexprs"]), b


def test_the_build_sees_a_tile_too_large_for_the_registers():
    """The tiles before the build was checked (8 queries x 16 positions on 4 warps) spill at head dim 128: the
    check can fail, and it is why tree_attention's tiles are what they are."""
    wide = builds("--models", "Qwen2-7B", "--kernels", "attention",
                  code="from lookahead.model import tree_attention as t; t.BN, t.NUM_WARPS = 16, 4")
    walks = [b for b in wide if b["kernel"] == "tree_attention"]
    assert walks and all(b["constexprs"]["BN"] == 16 for b in walks)
    assert any(b["spills"] for b in walks), walks
