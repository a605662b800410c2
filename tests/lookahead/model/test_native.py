"""Native kernels: built once per source into the user's cache, never half-written; no compiler means None (logged
with the reason) and the torch paths, not a crash."""

import logging

import pytest

from lookahead.model import native


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native.load.cache_clear()
    yield tmp_path
    native.load.cache_clear()


@pytest.mark.parametrize("name", ["paged_attention", "exact_linear"])
def test_a_kernel_is_built_once_into_the_users_cache(fresh, name):
    lib = native.build(name)
    assert lib.parent == fresh / "lookahead-serve" and lib.name.startswith(f"{name}-")
    stamp = lib.stat().st_mtime_ns
    assert native.build(name) == lib and lib.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.name for p in lib.parent.iterdir()] == [lib.name]  # no half-built leftovers
    assert native.load(name) is native.load(name) is not None


def test_without_a_compiler_load_says_why_and_gives_none(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CXX", str(fresh / "no-such-g++"))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.load("paged_attention") is None
    assert "paged_attention unavailable" in caplog.text and "no-such-g++" in caplog.text
    assert not list((fresh / "lookahead-serve").glob("*.so"))


def test_a_source_that_does_not_compile_gives_none_with_the_compilers_words(fresh, monkeypatch, caplog, tmp_path):
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "broken.cpp").write_text("int main( {\n")
    monkeypatch.setattr(native, "__file__", str(broken / "native.py"))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.load("broken") is None
    assert "broken unavailable" in caplog.text and "error" in caplog.text


def test_switched_off_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    assert native.load("paged_attention") is None
