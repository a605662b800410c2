"""Streaming text: deltas add up to the whole text; stop strings cut before themselves, even across tokens."""

import pytest

from serve_app.detokenize import Detokenizer


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2.tokenizer


def stream(tok, text, stop=(), chunk=1):
    ids = tok(text)["input_ids"]
    d = Detokenizer(tok, stop)
    out = [d.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return "".join(out) + d.finish(), d


@pytest.mark.parametrize("chunk", [1, 3])
def test_deltas_add_up(tok, chunk):
    text = "Héllo wörld — 你好，世界! def f(x):\n    return x"
    got, d = stream(tok, text, chunk=chunk)
    assert got == tok.decode(tok(text)["input_ids"], skip_special_tokens=True)
    assert not any(ch == "\ufffd" for ch in got)


def test_stop_string_is_cut_and_never_sent(tok):
    got, d = stream(tok, "The answer is 42.\n\nNext question: why?", stop=("\n\nNext",))
    assert got == "The answer is 42." and d.stopped


def test_earliest_of_several_stops_wins(tok):
    got, _ = stream(tok, "alpha beta gamma delta", stop=("delta", "beta"))
    assert got == "alpha "


def test_no_stop_keeps_everything(tok):
    got, d = stream(tok, "alpha beta", stop=("zeta",))
    assert got == "alpha beta" and d.stopped  # finish() ends the stream either way
