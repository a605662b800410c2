"""The batch-invariant Triton GEMM (triton_gemm.py) under Triton's interpreter on the CPU: it is x @ W.T rounded
once from fp32 sums, a row's bits do not depend on how many rows share the call, K's fixed split is planned from
the weight and the device alone, and the engine's exact path through it decodes with lookahead exactly what it
decodes plainly. The interpreter multiplies tiles with numpy, whose float32 sums may differ by a row's place in
a tile; that a row's bits are the same at any place of a call is the GPU's MMA property, and the GPU check's
section P (`gemm`) measures it there."""

import pytest
import torch

from lookahead.core.step_table import StepTable
from lookahead.model import fast_linear, triton_gemm
from lookahead.model.runner import ModelRunner
from tests.lookahead.model.test_exact import lookahead_and_plain
from tests.lookahead.tiny_models import tiny


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_gemm.usable(torch.device("cpu"))


def linear(k: int, n: int, bias: bool, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)


@pytest.mark.parametrize("k,bias", [(300, True), (2000, False)])  # one split of K; eight (CPU_SMS = 8)
def test_it_is_the_product_rounded_once_from_fp32_sums(k, bias):
    lin = linear(k, 200, bias, 1)
    gemm = triton_gemm.TritonLinear(lin)
    assert (gemm.splits > 1) == (k == 2000)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = gemm(x, lin)
    exact = x.double() @ lin.weight.double().t() + (lin.bias.double() if bias else 0)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)  # a bf16 step at each value
    assert got.dtype == torch.bfloat16 and got.shape == (70, 200)
    assert ((got.double() - exact).abs() <= ulp).all()  # within one step of the exact value, as a rounded fp32 sum


@pytest.mark.parametrize("k", [300, 2000])
def test_a_rows_bits_do_not_depend_on_how_many_rows_share_the_call(k):
    lin = linear(k, 200, True, 3)
    gemm = triton_gemm.TritonLinear(lin)
    x = torch.randn(130, k, generator=torch.Generator().manual_seed(4)).bfloat16()
    full = gemm.mm(x, lin)
    for m in (1, 5, 64, 129):
        assert torch.equal(gemm.mm(x[:m], lin), full[:m]), m


def test_ks_split_is_fixed_by_the_weight_and_the_device():
    for n, k, sms in [(3584, 18944, 132), (18944, 3584, 132), (152064, 3584, 132), (200, 2000, 8), (64, 64, 8)]:
        ks, parts = triton_gemm.splits(n, k, sms)
        assert ks % triton_gemm.BK == 0 and (parts - 1) * ks < k <= parts * ks
    assert triton_gemm.splits(3584, 18944, 132)[1] == 10  # Qwen2-7B's down projection: 28 n-tiles, 280 programs
    assert triton_gemm.splits(152064, 3584, 132)[1] == 1  # its LM head fills an H100 with n-tiles alone


def test_the_switch_makes_it_the_exact_path(monkeypatch):
    lin = linear(64, 32, False, 5)
    assert not isinstance(fast_linear.exact_path(lin), triton_gemm.TritonLinear)
    monkeypatch.setenv(triton_gemm.ENV, "triton")
    assert isinstance(fast_linear.exact_path(lin), triton_gemm.TritonLinear)


def test_bf16_lookahead_through_it_decodes_exactly_what_plain_decoding_does(monkeypatch):
    """Every linear of the exact path through the kernel (qwen2: biased projections too), four requests at once,
    fixed budgets so every tree is verified: the tokens equal the same engine's plain decoding."""
    monkeypatch.setenv(triton_gemm.ENV, "triton")
    runner = ModelRunner(tiny("qwen2").to(torch.bfloat16))
    assert isinstance(runner.model.model.layers[0].self_attn.q_proj._lookahead_exact, triton_gemm.TritonLinear)
    drafted, plain = lookahead_and_plain(runner, 30, StepTable.flat())
    assert [g.tokens for g in drafted] == [g.tokens for g in plain]
    assert sum(g.stats.accepted_drafts for g in drafted) > 0
