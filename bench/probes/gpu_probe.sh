#!/usr/bin/env bash
# One device call (after `source .gpu2/env.sh`, see bench/gpu_session.sh): issue 9's schedule probe.
#   1. every kernel of the probe built in parallel (QuACK's disk cache keeps them for the next steps);
#   2. the timings (schedule_probe.py: as written, dynamic persistent, the config sweep, cuBLAS, QuACK's paths);
#   3. an ncu profile of the packed-mode kernel against QuACK's dgated path and a plain GEMM at coda-h2048, and of
#      gemm_rmsnorm_bwd's 192- and 208-wide tiles at llama3-1b-gateup (NCU_S=0: none).
# PROBE_ARGS replaces the probe's rows and variants (e.g. "--row gemm_residual --split 2"; the split-K sweep of
# gpu_session.sh's probe phase); PROBE_ARGS_FILE does too, one argument per line, for variant names with spaces and
# commas ("--only" lines, then "as written, dynamic"). Results in $OUT/probe.tar.gz (or .gpuwork/probe/; with
# PROBE_TAG=T, probe-T).
set -uo pipefail
work=.gpuwork/probe${PROBE_TAG:+-$PROBE_TAG}  # PROBE_TAG: two probes of one machine keep their results apart
mkdir -p "$work"
if [ -n "${PROBE_ARGS_FILE:-}" ]; then
  mapfile -t args < <(grep -v '^[[:space:]]*$' "$PROBE_ARGS_FILE")
else
  # shellcheck disable=SC2206  # PROBE_ARGS is a list of words
  args=(${PROBE_ARGS:---row gemm_swiglu_bwd --row gemm_rmsnorm_bwd --row gemm_residual
        --sweep gemm_swiglu_bwd --sweep gemm_rmsnorm_bwd --sweep gemm_residual})
fi
probe=(python3 bench/probes/schedule_probe.py "${args[@]}")
t0=$(date +%s)
# BUILD_JOBS builders at once (default 12); each holds its row's inputs on the GPU (a row over 2 GiB of inputs is
# built at its task's small shape: schedule_probe.py's PRECOMPILE_ROW_BYTES)
jobs=${BUILD_JOBS:-12}
for i in $(seq 0 $((jobs - 1))); do
  timeout "${BUILD_S:-240}" "${probe[@]}" --precompile "$i/$jobs" >"$work/build-$i.log" 2>&1 &
done
wait
echo "built in $(( $(date +%s) - t0 )) s: $(cat "$work"/build-*.log | grep -c '^built') kernels, $(cat "$work"/build-*.log | grep -c 'left out') left out"
timeout "${TIME_S:-200}" "${probe[@]}" --json "$work/probe.jsonl" >"$work/probe.log" 2>&1
echo "timed in $(( $(date +%s) - t0 )) s"; grep -A4 '^==' "$work/probe.log" | head -60
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ "${NCU_S:-200}" = 0 ]; then
  echo "ncu skipped (NCU_S=0)"
elif [ -n "$ncu" ]; then
  timeout "${NCU_S:-200}" "$ncu" --profile-from-start off --nvtx -f -o "$work/profile" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    python3 bench/probes/schedule_probe.py --ncu --row gemm_swiglu_bwd:coda-h2048 --row gemm_rmsnorm_bwd:llama3-1b-gateup \
      --sweep gemm_rmsnorm_bwd --only "as written" --only "as written, dynamic" --only cublas --only "quack gemm" \
      --only "quack gemm_dact" --only "quack gemm_dact, static" --only "128x208 pp 2x1" >"$work/ncu.log" 2>&1
  "$ncu" --import "$work/profile.ncu-rep" --page details --csv >"$work/ncu-details.csv" 2>>"$work/ncu.log"
  echo "ncu done in $(( $(date +%s) - t0 )) s"; tail -3 "$work/ncu.log"
else
  echo "no ncu on this machine"
fi
if [ -n "${OUT:-}" ]; then tar czf "$OUT/$(basename "$work").tar.gz" -C .gpuwork "$(basename "$work")"; fi
