#!/usr/bin/env bash
# The wheel is a complete install: build it, install it into a fresh venv, then from an empty folder list the
# suite and run the README's mock job. Usage: bash scripts/check_wheel.sh (after scripts/setup.sh; PYTHON=... to
# build with another interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 711 "$work"  # as root the runners run as nobody: they must pass through to the venv (not list the folder)
"${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps -w "$work/dist" .
python3 -m venv "$work/venv"
# torch first, pinned as in setup.sh (a bare `torch` would pull a multi-GB CUDA build)
"$work/venv/bin/python" -m pip install -q "torch==2.13.0"
"$work/venv/bin/python" -m pip install -q "$work"/dist/coda_agent-*.whl
mkdir "$work/elsewhere" && cd "$work/elsewhere"
"$work/venv/bin/coda-agent" tasks --format json | "$work/venv/bin/python" -c \
  "import json, sys; n = len(json.load(sys.stdin)); assert n == 13, n; print(f'{n} tasks from the wheel')"
"$work/venv/bin/coda-agent" run gemm_residual_rmsnorm --model mock/gemm_residual_three_attempts --plain
echo "wheel check done"
