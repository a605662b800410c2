"""Records -> per-level stats: throughput over the makespan, failures never counted as fast, identical texts."""

import pytest

from loadtest.report import table
from loadtest.summary import arm_stats, level


def rec(i, start, latency, tokens, ok=True, sha="a", acc=2.0):
    return {"index": i, "start": start, "latency_s": latency, "tokens": tokens if ok else 0, "ok": ok,
            "ttft_s": 0.1 if ok else None, "text_sha1": sha, "lookahead": {"mean_accepted_tokens": acc} if ok else None}


def test_throughput_is_tokens_over_makespan():
    st = arm_stats("m", [rec(0, 0.0, 2.0, 100), rec(1, 1.0, 3.0, 100)])  # span 0..4 s
    assert st.tok_s == pytest.approx(50.0) and st.requests == 2 and st.failures == 0
    assert st.mean_request_tok_s == pytest.approx((50 + 100 / 3) / 2)


def test_a_failure_adds_no_tokens_and_is_counted():
    st = arm_stats("m", [rec(0, 0.0, 2.0, 100), rec(1, 0.0, 0.01, 500, ok=False)])
    assert st.failures == 1 and st.tokens == 100 and st.p50_latency_s == 2.0


def test_level_ratio_and_identity():
    on = [rec(0, 0, 1.0, 100, sha="x"), rec(1, 0, 1.0, 100, sha="y")]
    off = [rec(0, 0, 2.0, 100, sha="x"), rec(1, 0, 2.0, 100, sha="y")]
    lv = level(2, "on", on, "off", off)
    assert lv.ratio == pytest.approx(2.0) and lv.identical and lv.compared == 2
    off[1]["text_sha1"] = "z"
    assert not level(2, "on", on, "off", off).identical
    assert "**2.00x**" in table([lv])
