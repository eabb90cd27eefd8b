#!/usr/bin/env bash
# The H200 image has no bubblewrap and reaches no registry: put Debian's bwrap binary into .gpu2/ (carried with
# every GPU call; run after each rebuild of .gpu2/, which empties it: docs/CONTRIBUTING-gpu.md). On the GPU machine,
# bench/gpu_session.sh and docs/CONTRIBUTING-gpu.md's commands export CODA_AGENT_BWRAP=$PWD/.gpu2/bwrap.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
tmp="$(mktemp -d)"
(cd "$tmp" && apt-get download bubblewrap >/dev/null && dpkg -x bubblewrap_*.deb x)
install -m 0755 "$tmp/x/usr/bin/bwrap" .gpu2/bwrap
rm -rf "$tmp"
echo "bwrap $(.gpu2/bwrap --version | cut -d' ' -f2) is in .gpu2/"
