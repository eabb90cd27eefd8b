#!/usr/bin/env bash
# The committed H200 evidence, in device calls of at most 10 minutes each. On a fresh GPU machine first run
# `bash .gpu/stage1.sh` (docs/CONTRIBUTING-gpu.md), then, one call after another while the machine stays warm:
#   source .gpu2/env.sh && bash bench/gpu_session.sh SECONDS PHASE[:CAP] ...
# (.gpu and the tracked tree together pass the device tool's 64 MiB carry limit: move bench/results out of the tree
# for the stage1 call, and back after; no phase reads it.)
# What the phases took on one H200 (2026-12-03; size the calls by them, a cold machine is the slower): the whole-suite
# bench 462-730 s over one or two calls, guards 168-282 s (at f1f6218, with the load-ahead kernel's tests, 330 s
# covered 30 of its 45 tests on a cold machine: give it a call of its own), more 253 s, tune-human about 45 s per
# kernel at TUNE_BUDGET 50, tune-run 161 s at TUNE_BUDGET 120; accept 6-11 minutes for its three
# own tasks, the soft-capped cross-entropy alone up to 382 s, and about 2 minutes for each suite task (H100,
# 2026-12-05-e): split it with ACCEPT_TASKS over calls, that task in a call of its own. A device call lasts at most 600 s, and the machine
# goes back after 30 s idle between calls. e2e on an H100 (2026-12-06-f, fresh machine, with compile): --layers 2 about
# 85 s, --layers 16 about 80 s, --preset 8b --layers 2 about 55 s since the peak's trace and the joules a step (c4cdc9c);
# a phase's cap is SECONDS less the copy-back margin, so give each call 30 s more than that.
# The phases run in order, each cut off at CAP seconds or at the call's end (SECONDS from now, less a margin for the
# copy back), whichever comes first:
#   bench     the whole-suite bench, or the tasks BENCH_TASKS names (resumes .gpuwork/bench.json, or BENCH_JSON:
#             every task's correctness first, then timing; with TEARDOWN_CUPTI=1 exported, the runners finalize
#             CUPTI after each traced batch)
#   trust     the verifier's GPU tests: the adversarial cases first (a phase cut short still ran them), the human
#             kernels, the QuACK backend's tile counter, the tensor files between GPUs
#   guards    trust without the human kernels' correctness, which the bench's check phase runs with the same verifier
#   launch    the QuACK backend's GPU tests alone (tests/test_gpu_primitives.py: its launch path, tile counter, splits)
#   ahead     the load-ahead kernel against QuACK's, bit for bit, every human kernel forced onto each
#             (tests/test_gpu_ahead.py)
#   ops       the torch ops' GPU tests: a two-layer Llama-3 1B stack's gradients at a real size, the glue passes' kernels
#   more      the other GPU tests: the tuner, the agent, one end-to-end layer
#   e2e       coda-agent bench-e2e --preset 1b --layers 2: CODA's ops, with and without K-major dgrad weights, against
#             torch.compile (max-autotune faults building the 1B head at this batch, 2026-12-06-h; its build with the
#             GEMMs on cuBLAS is --variant compile-max-autotune-cublas; E2E_ARGS replaces the
#             arguments, e.g. "--preset 1b --layers 16 --steps 5 --warmup 2 --variant compile"; E2E_TAG names the
#             JSON, .gpuwork/e2e<tag>.json). A max-autotune build ignores the call's end: give it a call of its own
#   tune-run  the agent with a scripted model on a task without a human kernel (bench/tune_demo): the candidate's
#             deliberately poor gemm config is tuned on the GPU, the record keeps the speed before and after
#   accept    the agent end to end on the tasks of bench/accept (outside the suite, no human kernel: a Gemma-2 LM head
#             with soft-capped cross-entropy at V 256000, which needs about 104 GiB and so an H200: an 80 GB H100 refuses
#             it in one line, 2026-12-06-b; a GELU backward with the saved pre-activation as C, a residual
#             + LayerNorm-statistics forward) and on two suite tasks (gemm_residual, gemm_rmsnorm: five bench shapes
#             each, so give them a call of their own), each with its scripted model (a flawed reply, then a correct kernel with
#             a poor gemm config) at its one bench shape, ACCEPT_TUNE_BUDGET (default 45) seconds of tuning per run,
#             ACCEPT_TASKS to run fewer; then bench/accept/accept.py checks every run's record and exits non-zero
#             unless each one's best.py is correct on the GPU, timed, tuned (a @schedule adopted), and every runner
#             ran in bubblewrap as nobody (the cache files it wrote belong to uid 65534); run records in
#             .gpuwork/accept/<task>/, the checks and a table of issue 47's bars (verify, tune stage, configs) in
#             accept.log and accept/accept.json. Run it (and commit its log
#             and records) whenever the verifier, the sandbox, the primitives or the agent change
#   tune-human  `bench --tune` on the human kernels of the narrow-N rows (issue 9), or TUNE_TASKS (tasks and
#             --shape options): the diffs that would pin winners, TUNE_BUDGET seconds of search per kernel, the
#             search (a failed one's too) in TUNE_JSON (default .gpuwork/tune-human.json)
#   cublas    bench/probes/cublas_kernels.py: the kernel cuBLAS runs at every bench GEMM shape, and its time
#   probe     bench/probes/gpu_probe.sh without ncu: the schedule probe's kernels built in parallel, then timed
#             (PROBE_ARGS, or PROBE_ARGS_FILE with one argument per line, names the rows and variants, e.g.
#             bench/probes/args/swiglu_bwd_fold.txt, or kmajor_dgrad.txt: the RMSNorm-backward dgrad GEMMs of the
#             Llama stack on their weight as stored against a K-major copy, at the kernel's tile and at 192x192;
#             three_warp_groups.txt, swiglu_bwd_192x128.txt, c_rows_three_warp_groups.txt: three-warp-group tiles;
#             clocks.txt: each variant also run alone with its SM clock and power sampled, bench/probes/steady.py;
#             swizzle.txt, cluster_one.txt: every gemm call at its own config with the fields of --override replaced;
#             suite_twin.txt: all 65 suite rows on QuACK's kernel and the load-ahead one beside the twin and cuBLAS,
#             the whole suite's QuACK-path twin, 90 s on an H100; dsl_version.txt: nine rows for a DSL version A/B;
#             c_bar.txt: the C rows beside cuBLAS's own C-reading GEMM and the epilogue's bytes moved alone;
#             c_m_major.txt: the C rows with C column-major, the same bytes in 128-byte TMA rows (h100-2026-12-07-g);
#             lm_head_dgrad.txt: the LM heads' dgrad GEMMs at the sweep, swizzled and K-major;
#             long_k_coop.txt: that dgrad's cooperative twins and ahead_stages.py:LongKSm90 (4 A/B stages at long K);
#             cluster_four.txt, packed_one_by_two.txt, l2_prefetch.txt: a 2x2 cluster, 1x2 for packed, L2 prefetch);
#             results in .gpuwork/probe/, or .gpuwork/probe-T/ with PROBE_TAG=T
#   ncu-source  bench/probes/ncu_source.sh: ncu's per-instruction stall samples of a probe row's kernels (NCU_ROWS,
#             NCU_ONLY), read with bench/probes/stall_ledger.py; results in .gpuwork/ncu-source/
#   first-call  bench/probes/first_call_probe.py: a fresh process's first call of a kernel, step by step, with QuACK's
#             disk cache cold and warm, and cProfile of one (FIRST_CALL_ARGS, default gemm_residual_rmsnorm)
#   host      bench/probes/host_probe.py: the host time per call of the human kernels at the rows that timed
#             host-bound at 666e628, plain, under the op log, after a profiler session and in the sandboxed runner
#             (after a bench's check phase, whose kernels the runner then finds built); HOST_ARGS replaces --per-cpu
#             (e.g. "--row gemm_residual:llama3-1b-down", or "--profile 300 --row ...")
#   rope      bench/probes/rope_backward_probe.py: RoPE's backward pass (torch/glue.py) at the 1B stack's batch, the
#             shipped Triton kernel at several token blocks and warp counts against its first version and Inductor's
#             build, each checked against the eager op; in rope.json (about 40 s)
#   sdpa      bench/probes/sdpa_layout_probe.py: causal GQA attention at the 1B stack's batch, forward and backward, with
#             q, k, v as views of one QKV tensor (CODA's layer), each contiguous in two layouts, on each SDPA backend
#             (issue 45: CODA's SDPA forward took 46.0 ms in the 16-layer step, compile's 42.1); in sdpa.json
#   transfer  bench/probes/transfer_probe.py: 4.2 GB of outputs (the 256k head's logits) from a GPU tensor to a GPU
#             tensor through the runner protocol's tensor file, through the file by 8 threads, and through a shared
#             memfd both sides map and register with CUDA (issue 47); in transfer.json (about 60 s)
#   host-ops  bench/probes/host_op_launches.py: the CUDA kernels each host op a candidate may run launches, as the
#             runner's op log names it (the launch estimate's HOST_OP_LAUNCHES); in host-op-launches.json
#   window    the GPU tests of the checker's shared memory window and of the glue passes' kernels
#             (tests/test_window.py, tests/test_torch_glue.py)
#   epilogue-cost  bench/probes/epilogue_cost.py: gemm_rmsnorm_bwd's epilogue whole and less one part at a time,
#             beside its empty twin and cuBLAS, at the 1B stack's dgrad rows (EPI_COST_ARGS replaces the shapes);
#             in epilogue-cost.jsonl (about 90 s)
#   stage-cap bench/probes/stage_cap.py: the SwiGLU backward's plain GEMM at 256x128 cooperative with its A/B stages
#             capped, against cuBLAS (STAGE_CAP_ARGS replaces its rows, caps and tile); in stage-cap.jsonl (about 130 s)
#   step-start  bench/probes/step_start_probe.py: the host's path from a training step's start to its first GEMM
#             launch, timed and under cProfile (the 1B stack's 2 layers; STEP_START_ARGS replaces that); in step-start.json
# Each phase's log notes the time, the host's load and CPU steal at its start and end; <phase>-gpu.csv samples the
# GPU's clocks, power and throttle reasons once a second while it runs (power-capped clocks move kernel times).
# Everything lands in .gpuwork/ (git-ignored: it stays on the machine between calls while it is warm) and comes back
# as $OUT/gpuwork.tar.gz. Set CODA_AGENT_GIT_COMMIT to the hash itself, written into the command here: the tree
# travels without its .git, and a `git rev-parse` run there read another commit's (2026-12-06-g).
set -uo pipefail
if ! [[ "${CODA_AGENT_GIT_COMMIT:-}" =~ ^[0-9a-f]{7,40}(-dirty)?$ ]]; then
  echo "gpu_session.sh: export CODA_AGENT_GIT_COMMIT=<the sent tree's commit> first (got '${CODA_AGENT_GIT_COMMIT:-}')" >&2
  exit 2
fi
end=$(( $(date +%s) + ${1:?usage: gpu_session.sh SECONDS PHASE[:CAP] ...} - 25 ))
shift
work=.gpuwork
mkdir -p "$work"
# The runner's sandbox: the image has no bubblewrap, scripts/gpu_bwrap.sh carries Debian's binary in .gpu2/.
[ -x .gpu2/bwrap ] && export CODA_AGENT_BWRAP=$PWD/.gpu2/bwrap
# Phases that run candidates through the checker make evidence only in bubblewrap: without it the checker runs them
# as plain processes, and the escape guard fails for the setup's reason, not the product's (h100-2026-12-06-a: a
# .gpu2 rebuilt by prepare.sh had lost the binary).
for spec in "$@"; do
  case ${spec%%:*} in
    bench|trust|guards|more|tune-run|accept|tune-human|host)
      if [ -z "${CODA_AGENT_BWRAP:-}" ] && ! command -v bwrap >/dev/null; then
        echo "gpu_session: phase ${spec%%:*} runs candidates, and no bubblewrap is here: run scripts/gpu_bwrap.sh" \
          "(after every prepare.sh) and carry .gpu2 again" >&2
        exit 2
      fi ;;
  esac
done
export PYTHONUNBUFFERED=1 CODA_AGENT_RUNS_DIR=$PWD/$work/runs
# As root the checker drops its runners to nobody, who must read the carried packages: .gpu2/env.sh's pip --target
# leaves /tmp/py closed to other users (seen at 1e4df0d: every runner fell back to root), so open it, read-only.
[ "$(id -u)" = 0 ] && [ -d /tmp/py ] && chmod -R o+rX /tmp/py
# The runners write no bytecode (nobody cannot, and the sandbox sets PYTHONDONTWRITEBYTECODE), and the pip --target
# install compiled none: every runner compiled the DSL's and QuACK's modules from source again. A pip or uv install
# with bytecode has it; so does this machine from here on (the packages once while it stays warm, the tree each call:
# it travels anew; readable by nobody).
if [ -d /tmp/py/site-packages ] && [ ! -e /tmp/py/.bytecode ]; then
  python3 -m compileall -q -j 0 /tmp/py/site-packages >/dev/null 2>&1 && touch /tmp/py/.bytecode
fi
python3 -m compileall -q -j 0 coda_agent >/dev/null 2>&1
[ "$(id -u)" = 0 ] && chmod -R o+rX /tmp/py coda_agent

machine_state() {  # one line: the time, load, the CPUs' steal and idle time so far (USER_HZ ticks), CPU 0's clock
  echo "   machine at $(date -u +%FT%TZ): load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "cpu ticks steal $(awk '/^cpu /{print $9}' /proc/stat) idle $(awk '/^cpu /{print $5}' /proc/stat);" \
    "cpu0 $(awk -F': ' '/cpu MHz/{print $2 " MHz"; exit}' /proc/cpuinfo)"
}

gpu_sampler() {  # the GPU's clocks, power, temperature and throttle reasons once a second into $work/<name>-gpu.csv
  command -v nvidia-smi >/dev/null || return 0
  local fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu="$fields" --format=csv >/dev/null 2>&1 || fields=${fields%,*}  # an older field set
  nvidia-smi --query-gpu="$fields" --format=csv,nounits -lms 1000 >>"$work/$1-gpu.csv" 2>/dev/null &
  echo $!
}

run_phase() {  # name, seconds, command...: the command's output to $work/<name>.log, its exit status noted
  local name=$1 secs=$2 t0
  shift 2
  t0=$(date +%s)
  echo "== $name: up to $secs s: $*" | tee -a "$work/$name.log"
  machine_state | tee -a "$work/$name.log"
  local sampler rc
  sampler=$(gpu_sampler "$name")
  timeout "$secs" "$@" >>"$work/$name.log" 2>&1
  rc=$?
  phase_rc=$rc
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$work/$name.log"
  machine_state | tee -a "$work/$name.log"
  tail -n 4 "$work/$name.log"
}

status=0
gpu_tests=(python3 -m pytest -m gpu -n 0 -v -rfE -p no:cacheprovider)

for spec in "$@"; do
  phase=${spec%%:*}
  cap=$([ "$spec" = "$phase" ] && echo 100000 || echo "${spec#*:}")
  left=$(( end - $(date +%s) ))
  secs=$(( cap < left ? cap : left ))
  if [ "$secs" -lt 30 ]; then echo "== $phase: skipped, $left s left"; continue; fi
  case $phase in
    bench) run_phase bench "$secs" python3 -m coda_agent bench --resume --no-max-autotune --jobs "${BENCH_JOBS:-5}" \
             --json "${BENCH_JSON:-$work/bench.json}" ${BENCH_TASKS:-} ;;
    trust) run_phase trust "$secs" "${gpu_tests[@]}" tests/adversarial/test_adversarial_gpu.py tests/test_gpu_kernels.py \
             tests/test_gpu_primitives.py tests/test_sandbox.py ;;
    guards) run_phase guards "$secs" "${gpu_tests[@]}" tests/adversarial/test_adversarial_gpu.py tests/test_gpu_kernels.py \
              tests/test_gpu_primitives.py tests/test_sandbox.py -k "not human_kernel_passes_gpu_correctness" ;;
    launch) run_phase launch "$secs" "${gpu_tests[@]}" tests/test_gpu_primitives.py ;;
    ahead) run_phase ahead "$secs" "${gpu_tests[@]}" tests/test_gpu_ahead.py ;;
    ops) run_phase ops "$secs" "${gpu_tests[@]}" tests/test_torch_ops.py tests/test_torch_glue.py ;;
    more) run_phase more "$secs" "${gpu_tests[@]}" tests/test_tuning.py tests/test_agent.py tests/test_bench_e2e.py ;;
    e2e) run_phase e2e "$secs" python3 -m coda_agent bench-e2e ${E2E_ARGS:---preset 1b --layers 2 --steps 10 --warmup 2 \
           --variant coda-kmajor --variant compile} --json "$work/e2e${E2E_TAG:-}.json" ;;
    tune-run) run_phase tune-run "$secs" python3 -m coda_agent run bench/tune_demo/my_residual/my_residual.yaml \
                --model mock/bench/tune_demo/untuned_residual.yaml --rounds 1 --tune-budget "${TUNE_BUDGET:-120}" ;;
    accept) run_phase accept "$secs" python3 bench/accept/accept.py --out "$work/accept" \
              --tune-budget "${ACCEPT_TUNE_BUDGET:-45}" ${ACCEPT_TASKS:-}
            [ "$phase_rc" = 0 ] || status=1 ;;  # the session's exit status says when a run failed its checks
    tune-human) run_phase tune-human "$secs" python3 -m coda_agent bench ${TUNE_TASKS:-gemm_residual gemm_residual_rmsnorm \
                  gemm_rmsnorm_bwd} --tune --tune-budget "${TUNE_BUDGET:-100}" --json "${TUNE_JSON:-$work/tune-human.json}" ;;
    cublas) run_phase cublas "$secs" python3 bench/probes/cublas_kernels.py --json "$work/cublas.jsonl" ;;
    probe) run_phase probe "$secs" env NCU_S=0 OUT= bash bench/probes/gpu_probe.sh ;;
    ncu-source) run_phase ncu-source "$secs" env OUT= bash bench/probes/ncu_source.sh ;;
    first-call) run_phase first-call "$secs" python3 bench/probes/first_call_probe.py ${FIRST_CALL_ARGS:-gemm_residual_rmsnorm} \
                  --json "$work/first-call.json" ;;
    host) run_phase host "$secs" python3 bench/probes/host_probe.py ${HOST_ARGS:---per-cpu} --json "$work/host.jsonl" ;;
    rope) run_phase rope "$secs" python3 bench/probes/rope_backward_probe.py --json "$work/rope.json" ;;
    sdpa) run_phase sdpa "$secs" python3 bench/probes/sdpa_layout_probe.py --json "$work/sdpa.json" ;;
    transfer) run_phase transfer "$secs" python3 bench/probes/transfer_probe.py --json "$work/transfer.json" ;;
    host-ops) run_phase host-ops "$secs" python3 bench/probes/host_op_launches.py --json "$work/host-op-launches.json" ;;
    window) run_phase window "$secs" "${gpu_tests[@]}" tests/test_window.py tests/test_torch_glue.py ;;
    epilogue-cost) run_phase epilogue-cost "$secs" python3 bench/probes/epilogue_cost.py \
                     ${EPI_COST_ARGS:---shape 32768,2048,3072 --shape 32768,2048,16384} --json "$work/epilogue-cost.jsonl" ;;
    stage-cap) run_phase stage-cap "$secs" python3 bench/probes/stage_cap.py \
                 ${STAGE_CAP_ARGS:---row gemm_swiglu_bwd:llama3-1b --row gemm_swiglu_bwd:coda-h2048 --caps 4,3,2} \
                 --json "$work/stage-cap.jsonl" ;;
    step-start) run_phase step-start "$secs" python3 bench/probes/step_start_probe.py ${STEP_START_ARGS:-} \
                 --json "$work/step-start.json" ;;
    *) echo "unknown phase $phase (bench, trust, guards, launch, ahead, ops, more, e2e, tune-run, accept, tune-human, cublas, probe, ncu-source, first-call, host, rope, sdpa, transfer, host-ops, window, epilogue-cost, stage-cap, step-start)"; exit 2 ;;
  esac
done
# The logs get committed: this machine's paths become the repository root ".", python3, <site-packages> and $OUT.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
py=$(python3 -c 'import sys; print(sys.executable)')
find "$work" -maxdepth 1 -type f \( -name '*.log' -o -name '*.md' \) -exec sed -i \
  -e "s#$py#python3#g" -e "s#$site#<site-packages>#g" -e "s#$PWD/#./#g" -e "s#$PWD\b#.#g" ${OUT:+-e "s#$OUT#\$OUT#g"} {} +
# so do the run records' task paths (a suite task run by name is recorded by its absolute path)
[ -d "$work/accept" ] && find "$work/accept" -name header.json -exec sed -i -e "s#\"$PWD/#\"#g" {} +
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpuwork.tar.gz" --exclude=quack_cache "$work"; fi
exit $status
