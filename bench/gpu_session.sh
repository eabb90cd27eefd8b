#!/usr/bin/env bash
# The committed H200 evidence in one device call: the whole-suite bench, which writes
# bench/results/<device>-<date>.json and .md itself, then every GPU test (the kernels, the adversarial GPU cases,
# the tuner, the torch ops at a real size, one layer of the end-to-end bench). The end-to-end numbers come from
# `coda-agent bench-e2e` (bench/README.md), a call of their own. On a fresh GPU machine first run
# `bash .gpu/stage1.sh` (see ../shared/gpu/README.md), then:
#   source .gpu2/env.sh && bash bench/gpu_session.sh [pytest -k expression]
# Set CODA_AGENT_GIT_COMMIT when the tree travels without .git. A bench cut off by the timeout is resumed by the next
# session (same commit): run this again. Results are copied to $OUT when it is set.
set -o pipefail
# The runner's sandbox: the image has no bubblewrap, scripts/gpu_bwrap.sh carries Debian's binary in .gpu2/.
[ -x .gpu2/bwrap ] && export CODA_AGENT_BWRAP=$PWD/.gpu2/bwrap
t0=$(date +%s)
PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-540}" python3 -m coda_agent bench --resume --jobs "${BENCH_JOBS:-6}" 2>&1 | tee /tmp/bench.log
echo "bench: exit $? after $(( $(date +%s) - t0 )) s"
if [ -n "${OUT:-}" ]; then cp bench/results/*-"$(date +%F)".* /tmp/bench.log "$OUT"/ 2>/dev/null; fi
left=$(( ${SESSION_SECONDS:-590} - ($(date +%s) - t0) ))
if [ "$left" -gt 30 ]; then
  timeout "$left" python3 -m pytest -m gpu -n 0 -q -rfE -p no:cacheprovider tests/ ${1:+-k "$1"} 2>&1 | tee /tmp/gpu-tests.log
  if [ -n "${OUT:-}" ]; then cp /tmp/gpu-tests.log "$OUT"/; fi
fi
echo "session: $(( $(date +%s) - t0 )) s"
