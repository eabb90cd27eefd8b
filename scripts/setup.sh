#!/usr/bin/env bash
# One-shot set-up: a project virtualenv with the CPU build of torch and coda-agent (+ dev tools).
# Idempotent; re-running only installs what changed. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: on these machines 2.13.0 is a local CPU wheel; a bare `torch` would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "set-up done: $(.venv/bin/coda-agent --help >/dev/null && echo coda-agent ready)"
