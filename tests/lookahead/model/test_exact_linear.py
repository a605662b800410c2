"""The native exact linear: each row's outputs are the same bits whatever else shares the call, and they are the
layer's own product to the dtype's rounding; odd sizes (inputs not a whole vector, outputs not a whole tile) too."""

import pytest
import torch
import torch.nn.functional as F

from lookahead.model import exact_linear


@pytest.fixture(scope="module")
def linear():
    k = exact_linear.kernel()
    assert k is not None, "this machine has a C++ compiler (scripts/setup.sh needs one): the kernel must build"
    return k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("in_f,out_f,bias", [(576, 1536, False), (1536, 576, True), (100, 37, True), (40, 5, False)])
def test_each_row_gets_the_bits_it_gets_alone(linear, dtype, in_f, out_f, bias):
    g = torch.Generator().manual_seed(in_f)
    w = (torch.randn(out_f, in_f, generator=g) / in_f ** 0.5).to(dtype)
    b = torch.randn(out_f, generator=g) if bias else None
    x = torch.randn(41, in_f, generator=g).to(dtype)
    alone = torch.cat([linear(x[i : i + 1], w, b) for i in range(41)])
    assert alone.dtype == dtype and alone.shape == (41, out_f)
    for m in (2, 3, 4, 5, 9, 17, 41):
        assert torch.equal(linear(x[:m], w, b), alone[:m]), m
    assert torch.equal(linear(x[None, 5:12], w, b)[0], alone[5:12])  # any leading shape, any position
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(alone.double(), want, atol=2e-2, rtol=1e-2)  # one rounding to the dtype, and fp32 sums


def test_it_takes_only_what_it_has_a_path_for(linear):
    assert linear.supports(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert not linear.supports(torch.zeros(4, 8))  # fp32 models are not exact: they keep the fast linears
    assert not linear.supports(torch.zeros(8, 4, dtype=torch.bfloat16).t())  # not contiguous
