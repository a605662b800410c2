"""The drafting core imports no torch: every module of lookahead.core (and the config it reads) loads in a fresh
interpreter with torch made unimportable, and leaves no torch in sys.modules."""

import pkgutil
import subprocess
import sys

import lookahead.core

CORE = sorted(f"lookahead.core.{m.name}" for m in pkgutil.iter_modules(lookahead.core.__path__))

# A finder that refuses torch (and numpy's torch-adjacent friends are not needed either way): an import of torch
# anywhere below the core fails loudly instead of passing because torch happens to be installed.
PROBE = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("the drafting core imported " + name)
sys.meta_path.insert(0, NoTorch())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print(len(sys.argv) - 1)
"""


def test_the_core_has_the_modules_the_layout_promises():
    assert {"lookahead.core.trie", "lookahead.core.ngram_index", "lookahead.core.draft", "lookahead.core.verify",
            "lookahead.core.trie_store", "lookahead.core.planner"} <= set(CORE)


def test_every_core_module_imports_without_torch():
    modules = [*CORE, "lookahead.config", "lookahead"]
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(modules))


def test_the_probe_catches_a_module_that_imports_torch():
    # the guard itself must be able to fail: the model layer imports torch
    out = subprocess.run([sys.executable, "-c", PROBE, "lookahead.model.tree_mask"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "imported torch" in out.stderr
