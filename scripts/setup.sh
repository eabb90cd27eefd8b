#!/usr/bin/env bash
# One-shot set-up: a project virtualenv with the CPU build of torch and coda-agent (+ dev tools, Ray), and bubblewrap.
# Idempotent; re-running only installs what changed. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, the CPU build: a local wheel where pip's find-links has one (its dependencies come with the
# project's below), else from PyTorch's CPU index; never PyPI's torch, which on Linux is a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q --no-index --no-deps "torch==2.13.0" 2>/dev/null \
    || .venv/bin/python -m pip install -q "torch==2.13.0" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
fi
# ray: the Ray executor's tests (tests/test_execute_ray.py) run on a local cluster; the wheel installs in seconds.
.venv/bin/python -m pip install -q -e ".[dev,ray]"
# Candidates run inside bubblewrap (the verifier's OS sandbox); without it they run as plain processes.
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo "sudo -n")
  { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 \
    || echo "note: could not install bubblewrap; candidates will run WITHOUT an OS sandbox (apt-get install bubblewrap)"
fi
# As root, candidates run as nobody (never as root): nobody must pass through the folders above Python and the
# checkout (o+x: traversal, not listing), or no runner starts. A pyenv Python under /root is the usual case.
if [ "$(id -u)" = 0 ]; then
  opened=$(.venv/bin/python -c 'import os,sys,pathlib
done = []
for p in {sys.base_prefix, os.path.realpath(sys.executable), os.getcwd()}:
    for d in pathlib.Path(p).resolve().parents:
        mode = os.stat(d).st_mode
        if not mode & 0o001:
            os.chmod(d, mode | 0o001)
            done.append(str(d))
print(" ".join(sorted(set(done))))')
  [ -z "$opened" ] || echo "note: opened $opened to other users for traversal (o+x, not listing): the sandbox runs candidates as nobody"
fi
echo "set-up done: $(.venv/bin/coda-agent --help >/dev/null && echo coda-agent ready)"
