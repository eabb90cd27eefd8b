#!/usr/bin/env bash
# One device call (after `source .gpu2/env.sh`, see bench/gpu_session.sh): where each kernel of a probe row spends
# its warps' time, per SASS instruction. ncu's PC sampling (SourceCounters) of the schedule probe's --ncu run, for
# issue 44's question: what a cooperative tile's epilogue does that its plain twin does not.
#   1. the variants built in parallel (QuACK's disk cache keeps them for the profiled run);
#   2. ncu: SpeedOfLight, WarpStateStats and SourceCounters of each variant, launched once;
#   3. the SASS page (one row per instruction: its stall samples by reason) and the details page as CSV, and
#      bench/probes/stall_ledger.py's reading of them (ledger.txt).
# NCU_ROWS names the rows (default: gemm_residual and gemm_residual_rmsnorm at llama3-1b-down), NCU_ONLY the
# variants, one per line (default: the plain twin, QuACK's kernel and the load-ahead kernel, all dynamic);
# NCU_PROBE_ARGS adds schedule_probe options (e.g. --ahead-packed: a packed 128x128 row's "ahead" variant on the
# load-ahead kernel, where the product runs QuACK's).
# NCU_CLOCKS=none profiles at the GPU's own clocks (ncu's default, base, locks the SM clock: 1.31 GHz on the H200,
# where gemm_rmsnorm_bwd's epilogue cost a quarter of what it costs at full clocks).
# Results in $OUT/ncu-source.tar.gz (or .gpuwork/ncu-source/).
set -uo pipefail
work=.gpuwork/ncu-source
mkdir -p "$work"
rows=()
for r in ${NCU_ROWS:-gemm_residual:llama3-1b-down gemm_residual_rmsnorm:llama3-1b-down}; do rows+=(--row "$r"); done
only=()
while IFS= read -r v; do [ -n "$v" ] && only+=(--only "$v"); done <<<"${NCU_ONLY:-plain twin, dynamic
as written, dynamic
as written, dynamic, ahead}"
# shellcheck disable=SC2206  # NCU_PROBE_ARGS is a list of words
probe=(python3 bench/probes/schedule_probe.py --ahead ${NCU_PROBE_ARGS:-} "${rows[@]}" "${only[@]}")
t0=$(date +%s)
jobs=${BUILD_JOBS:-6}  # builders at once; each holds its row's inputs on the GPU (see gpu_probe.sh)
for i in $(seq 0 $((jobs - 1))); do
  timeout "${BUILD_S:-200}" "${probe[@]}" --precompile "$i/$jobs" >"$work/build-$i.log" 2>&1 &
done
wait
echo "built in $(( $(date +%s) - t0 )) s: $(cat "$work"/build-*.log | grep -c '^built') kernels"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then echo "no ncu on this machine"; exit 1; fi
timeout "${NCU_S:-240}" "$ncu" --profile-from-start off --nvtx -f -o "$work/profile" --import-source no \
  --clock-control "${NCU_CLOCKS:-base}" \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  "${probe[@]}" --ncu >"$work/ncu.log" 2>&1
echo "profiled in $(( $(date +%s) - t0 )) s"; tail -3 "$work/ncu.log"
"$ncu" --import "$work/profile.ncu-rep" --page details --csv >"$work/details.csv" 2>>"$work/ncu.log"
"$ncu" --import "$work/profile.ncu-rep" --page source --print-source sass --csv >"$work/sass.csv" 2>>"$work/ncu.log" \
  || echo "the SASS page did not export (the report comes back whole)"
python3 bench/probes/stall_ledger.py "$work/sass.csv" --details "$work/details.csv" >"$work/ledger.txt" 2>&1
head -40 "$work/ledger.txt"
if [ -n "${OUT:-}" ]; then tar czf "$OUT/ncu-source.tar.gz" -C .gpuwork ncu-source; fi
