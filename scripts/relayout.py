"""One-off: split the flat `lookahead/` package into core/, model/, engine/ and move the benchmarks out of it.

Run once from the repository root: `python scripts/relayout.py`. It `git mv`s the modules and their tests, then
rewrites every import and every mention (`lookahead.X`, `lookahead/X.py`, `tests/lookahead/test_X.py`) in the
repository's text files. Kept in the history as the record of the move; not meant to run twice.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "core": ["trie", "ngram_index", "draft", "verify", "trie_store", "planner", "payoff", "step_table", "heap",
             "calibration"],
    "model": ["runner", "attention", "fast_linear", "exact_linear", "paged_attention", "native", "batch_cache",
              "kv_cache", "kv_memory", "prefix_cache", "sampling", "models", "tree_mask", "reference", "convert"],
    "engine": ["sequence", "scheduler", "engine", "generate", "stats"],
}
BENCH = ["bench", "bench_engine", "bench_report", "agreement"]
LOADTEST = ["prompt_sets"]  # the prompt files' reader: the load tests (an installed package) need it too
STAY = ["config", "cli"]  # lookahead/config.py, lookahead/cli.py
# where each module's dotted name goes
NEW = {m: f"lookahead.{layer}.{m}" for layer, mods in LAYERS.items() for m in mods}
NEW.update({m: f"benchmarks.{m}" for m in BENCH})
NEW.update({m: f"loadtest.{m}" for m in LOADTEST})
NEW.update({m: f"lookahead.{m}" for m in STAY})
# tests that test more than one module go with the layer they exercise
TEST_HOME = {
    "test_engine_smollm2": "engine", "test_lossless_architectures": "engine", "test_lossless_batched": "engine",
    "test_lossless_smollm2": "engine", "test_soak": "engine", "test_exact": "model", "test_exact_linear": "model",
}


def test_home(stem: str) -> str | None:
    """tests/lookahead/test_X.py -> the folder it moves to (None: it stays)."""
    name = stem[len("test_"):]
    if stem in TEST_HOME:
        return f"tests/lookahead/{TEST_HOME[stem]}"
    if name in BENCH:
        return "tests/benchmarks"
    if name in LOADTEST:
        return "tests/loadtest"
    if name in NEW and name not in STAY:
        return f"tests/lookahead/{NEW[name].split('.')[1]}"
    return None


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def move_files() -> None:
    for layer, mods in LAYERS.items():
        (ROOT / "lookahead" / layer).mkdir(exist_ok=True)
        init = ROOT / "lookahead" / layer / "__init__.py"
        init.write_text(DOCS[layer])
        git("add", str(init))
        for m in mods:
            for ext in ("/", ".py", ".cpp"):  # convert/ is a folder
                src = ROOT / "lookahead" / f"{m}{ext}"
                if (src.is_dir() and m not in LAYERS) if ext == "/" else src.exists():
                    git("mv", str(src), str(ROOT / "lookahead" / layer / f"{m}{ext}".rstrip("/")))
    bench_init = ROOT / "benchmarks" / "__init__.py"
    bench_init.write_text('"""The benchmarks: `python -m benchmarks.bench` and friends, run from the repository root.\n\n'
                          'Outside the library\'s import path: the library never imports them."""\n')
    git("add", str(bench_init))
    for m in BENCH:
        git("mv", f"lookahead/{m}.py", f"benchmarks/{m}.py")
    for m in LOADTEST:
        git("mv", f"lookahead/{m}.py", f"loadtest/{m}.py")
    tests = ROOT / "tests" / "lookahead"
    for layer in LAYERS:
        (tests / layer).mkdir(exist_ok=True)
        (tests / layer / "__init__.py").write_text("")
        git("add", str(tests / layer / "__init__.py"))
    for f in sorted(tests.glob("test_*.py")):
        home = test_home(f.stem)
        if home is not None:
            git("mv", str(f), str(ROOT / home / f.name))
    git("mv", "tests/lookahead/convert", "tests/lookahead/model/convert")


DOCS = {
    "core": '"""The drafting core: the trie and n-gram index that propose drafts, the draft tree, the acceptance walk,\n'
            'the step planner and its price table. Pure Python over token lists: it imports no torch\n'
            '(tests/lookahead/core/test_torch_free.py holds it to that)."""\n',
    "model": '"""The model layer: the one place that touches tensors on the device. Loading (models, convert/), the\n'
             'runner\'s forwards (runner, tree_mask, attention, fast_linear and the native kernels), the KV caches\n'
             '(kv_cache, batch_cache, prefix_cache, kv_memory) and token choice (sampling)."""\n',
    "engine": '"""The engine: requests (sequence), who runs each step (scheduler), the batched loop (engine: schedule ->\n'
              'plan -> forward -> accept -> commit), and the single-request decoder (generate)."""\n',
}


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def absolute(path: Path, level: int, name: str) -> str:
    """`from <level dots><name> import` in `path` -> the absolute module it named (before the move)."""
    pkg = module_of(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    base = pkg[: len(pkg) - (level - 1)]
    return ".".join(base + ([name] if name else []))


IMPORT = re.compile(r"^(\s*)from (\.+)([\w.]*) import (.+)$", re.M)


def absolutise(text: str, path: Path) -> str:
    """Every relative import of the old lookahead/ and tests/ trees -> an absolute one (still the old names)."""

    def one(m: re.Match) -> str:
        indent, dots, name, what = m.groups()
        target = absolute(path, len(dots), name)
        if name:
            return f"{indent}from {target} import {what}"
        names = [n.strip() for n in what.strip("()").split(",")]
        return "\n".join(f"{indent}from {target} import {n}" for n in names)

    return IMPORT.sub(one, text)


def renamed(text: str) -> str:
    mods = "|".join(sorted(NEW, key=len, reverse=True))
    # lookahead.engine.Engine, from lookahead import engine
    # (not a new name already there: lookahead.engine.sequence; the docs written for the new layout have them)
    engine_new = "|".join(LAYERS["engine"])
    text = re.sub(rf"(?<![\w.])lookahead\.({mods})\b(?!\.({engine_new})\b)", lambda m: NEW[m.group(1)], text)
    text = re.sub(rf"^(\s*)from lookahead import ({mods})$",
                  lambda m: f"{m.group(1)}from {NEW[m.group(2)].rsplit('.', 1)[0]} import {m.group(2)}", text, flags=re.M)
    # paths: lookahead/engine.py, lookahead/paged_attention.cpp, lookahead/convert/
    text = re.sub(rf"(?<![\w/.-])lookahead/({mods})(\.py|\.cpp|(?<=convert)/|\b(?!/))",
                  lambda m: NEW[m.group(1)].replace(".", "/") + m.group(2), text)
    # test paths and test modules: tests/lookahead/test_engine.py, tests.lookahead.test_engine, convert/
    def test_path(m: re.Match) -> str:
        home = test_home(m.group(2))
        return m.group(0) if home is None else home.replace("/", m.group(1)) + m.group(1) + m.group(2)

    text = re.sub(r"tests([/.])lookahead[/.](test_\w+)", test_path, text)
    text = re.sub(r"tests([/.])lookahead([/.])convert\b", r"tests\1lookahead\2model\2convert", text)
    return text


SKIP = {"scripts/relayout.py", "docs/benchmarks.md"}  # docs/benchmarks.md: the commands as they were run
TEXT = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ".ini"}


def main() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    old_py = {ROOT / f for f in files if f.endswith(".py") and (f.startswith("lookahead/") or f.startswith("tests/"))}
    # 1. absolute imports, computed at the old locations
    for f in old_py:
        f.write_text(absolutise(f.read_text(), f))
    move_files()
    # 2. new names everywhere
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    for f in files:
        p = ROOT / f
        if p.suffix not in TEXT or not p.is_file() or f.startswith("docs/bench/") or f in SKIP:
            continue
        text = p.read_text()
        new = renamed(text)
        if new != text:
            p.write_text(new)
    fixups()


def fixups() -> None:
    """What the renames cannot see: names in strings, paths relative to a moved file, the package data."""
    def edit(path: str, old: str, new: str) -> None:
        p = ROOT / path
        text = p.read_text()
        assert old in text, (path, old)
        p.write_text(text.replace(old, new))

    for name, layer in (("generate", "engine"), ("sequence", "engine"), ("sampling", "model")):
        edit("lookahead/__init__.py", f'": "{name}",', f'": "{layer}.{name}",')
    edit("tests/lookahead/model/test_kv_memory.py", 'DATA = Path(__file__).parent / "data"',
         'DATA = Path(__file__).parents[1] / "data"')
    edit("tests/lookahead/model/test_kv_memory.py", 'CONFIGS = Path(__file__).parents[2] / "configs"',
         'CONFIGS = Path(__file__).parents[3] / "configs"')
    edit("pyproject.toml", 'lookahead = ["*.cpp"]', '"lookahead.model" = ["*.cpp"]')


if __name__ == "__main__":
    main()
