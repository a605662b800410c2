"""The runner's CPU matmul paths agree with F.linear, switch off outside the runner, and respect the memory guard."""

import pytest
import torch
import torch.nn.functional as F

from lookahead.model import fast_linear
from lookahead.model.fast_linear import FastLinears


def model(bias: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 80, bias=bias), torch.nn.Linear(80, 24, bias=bias))


@pytest.mark.parametrize("via_wx", [0, 1, 2])  # the timed choice, forced: each path runs whatever this CPU picks
@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_every_row_count_matches_f_linear(pack, bias, via_wx):
    if pack and not fast_linear._packed_supported():
        pytest.skip("this torch has no oneDNN linear")
    m = model(bias)
    fast = FastLinears(m, enabled=True, pack=pack)
    assert fast.packed == pack
    if pack:
        assert m[0]._lookahead_rows_via_wx in (0, 1, 2)  # measured when packing
        for lin in m:
            lin._lookahead_rows_via_wx = via_wx
    for rows in (1, 2, 3, 5, 16, 17, 40):
        x = torch.randn(1, rows, 48)
        want = F.linear(F.linear(x, m[0].weight, m[0].bias), m[1].weight, m[1].bias)
        with fast.active():
            got = m(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_stock_path_outside_the_runner():
    m = model(True)
    fast = FastLinears(m, enabled=True, pack=True)
    x = torch.randn(4, 48)
    calls = []
    real = fast_linear._fast_linear
    fast_linear._fast_linear = lambda *a: calls.append(1) or real(*a)
    try:
        m(x)  # not inside active(): plain F.linear, as model.generate (the baseline) needs
        assert not calls
        with fast.active():
            m(x)
        assert len(calls) == 2
    finally:
        fast_linear._fast_linear = real


def test_packing_is_skipped_when_the_copies_would_crowd_memory(monkeypatch):
    if not fast_linear._packed_supported():
        pytest.skip("this torch has no oneDNN linear")
    m = model(False)
    weights = sum(l.weight.numel() * 4 for l in m)
    monkeypatch.setattr(fast_linear, "host_available_bytes", lambda: weights)  # copies would take 100% of free memory
    assert not FastLinears(m, enabled=True).packed
    monkeypatch.setattr(fast_linear, "host_available_bytes", lambda: 100 * weights)
    assert FastLinears(model(False), enabled=True).packed
    assert not FastLinears(model(False).to(torch.float64), enabled=True).packed  # fp32 only
