"""Issue 37 item 2 on the H200: the checker's memory at the Gemma-2 2B LM head (M 8192, V 256000, K 2304).

A: references + check_outputs + max_abs_difference in this process (peaks, seconds);
B: the correctness protocol (run_correctness) with the torch emulator backend on cuda, through the measured
   wrapper (checker peak, runner peak) against plan.memory_need;
C: the timing protocol (run_timing) likewise, short rep plan, no torch.compile.

Needs torch with a GPU and the project's pure-Python dependencies (pydantic, pyyaml, typer, rich), not QuACK: the
candidate is the task's human kernel on the torch emulator, so B and C end in cheat_detected (the emulator's GEMM is a
torch matmul) after every output check has passed; the peaks are what they measure. On the lent H200 (2026-12-03,
torch 2.11): A took 0.2 s and 0.3 GiB beyond the tensors for the three outputs' checks; B peaked at 45.3 GiB in the
checker and 38.3 GiB in the runner, C at 24.3 and 30.5 GiB (plan.memory_need: 48.0 + 38.3 and 38.6 + 30.5).
Run from the project root: ``python3 scripts/gemma_memory_probe.py [ABC]``; results in $OUT/gemma_probe.json.
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from coda_agent.tasks import find_task
from coda_agent.tasks.model import Task

GiB = 1 << 30
out_dir = os.environ.get("OUT", ".")
report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}


def say(k, v):
    report[k] = v
    print(k, json.dumps(v), flush=True)
    with open(os.path.join(out_dir, "gemma_probe.json"), "w") as f:
        json.dump(report, f, indent=1)


ce = find_task("gemm_cross_entropy")
data = ce.model_dump(mode="json")
gemma = {"name": "gemma2-2b-lmhead", "dims": {"M": 8192, "V": 256000, "K": 2304}}
data.update(shapes={"small": data["shapes"]["small"], "bench": [gemma]})
task = Task.model_validate(data).bind_path(ce.path)
dims = gemma["dims"]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

from coda_agent.verifier.compare import check_outputs, max_abs_difference  # noqa: E402
from coda_agent.verifier.plan import Plan, memory_need  # noqa: E402
from coda_agent.verifier.stages import references  # noqa: E402

for st in (["gpu_correctness"], ["profile"]):
    n = memory_need(task, task.shape("bench")[0], st, 3)
    say(f"estimate {st[0]}", {"checker_gib": n.checker_bytes / GiB, "runner_gib": n.runner_bytes / GiB})
say("mem_get_info_gib", [x / GiB for x in torch.cuda.mem_get_info()])

phase = sys.argv[1] if len(sys.argv) > 1 else "ABC"

if "A" in phase:
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    inputs = task.make_inputs(dims, 0, device="cuda")
    ref32, reflp = references(task, inputs)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    say("A references", {"s": t1 - t0, "peak_gib": torch.cuda.max_memory_allocated() / GiB,
                         "held_gib": torch.cuda.memory_allocated() / GiB})
    cand = {k: v.clone() for k, v in reflp.items()}
    cand["logits"].view(-1)[12345] += 0.5  # one element off: the worst-at index must name it
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for rule in ("eager", "single_rounding"):
        t0 = time.perf_counter()
        checks = check_outputs(task, cand, ref32, reflp, dims, "gemma", 0, rule)
        torch.cuda.synchronize()
        say(f"A check_outputs {rule}", {"s": time.perf_counter() - t0, "extra_peak_gib": (torch.cuda.max_memory_allocated() - base) / GiB,
                                        "checks": [c.model_dump(include={"output", "ok", "max_abs_err", "allowed", "worst_index", "reason"}) for c in checks]})
    t0 = time.perf_counter()
    d = max_abs_difference(cand["logits"], reflp["logits"])
    torch.cuda.synchronize()
    say("A max_abs_difference", {"s": time.perf_counter() - t0, "value": d,
                                 "extra_peak_gib": (torch.cuda.max_memory_allocated() - base) / GiB})
    del inputs, ref32, reflp, cand
    torch.cuda.empty_cache()

from coda_agent.measure.timing import RepPlan  # noqa: E402
from coda_agent.verifier.gpu import run_timing  # noqa: E402
from coda_agent.verifier.stages import Context, measured, run_correctness  # noqa: E402

source = task.human_file.read_text()
if "B" in phase:
    ctx = Context(task=task, source=source, plan=Plan(stages=["gpu_correctness"], backend="torch", shape_set="bench", seeds=[0, 1, 2], timeout=540),
                  deadline=time.monotonic() + 540)
    t0 = time.perf_counter()
    res = measured("gpu_correctness", lambda c: run_correctness(c, "gpu_correctness", "torch", "cuda"))(ctx)
    say("B gpu_correctness (torch emulator on cuda)", {"s": time.perf_counter() - t0, "outcome": res.outcome.value, "reason": res.reason[:600],
                                                      "memory": res.memory.model_dump() if res.memory else None,
                                                      "memory_line": res.memory.describe() if res.memory else "",
                                                      "checks": [c.model_dump(include={"output", "seed", "ok", "max_abs_err", "allowed"}) for c in res.checks]})
    torch.cuda.empty_cache()

if "C" in phase:
    ctx = Context(task=task, source=source, plan=Plan(stages=["profile"], backend="torch", shape_set="bench", seeds=[0], timeout=540),
                  deadline=time.monotonic() + 540)
    t0 = time.perf_counter()
    res = measured("profile", lambda c: run_timing(c, compile_modes=(), device="cuda", backend_name="torch",
                                                   plan=RepPlan(warmup=1, target_s=0.05, min_reps=10, max_reps=10)))(ctx)
    say("C profile (torch emulator on cuda)", {"s": time.perf_counter() - t0, "outcome": res.outcome.value, "reason": res.reason[:600],
                                              "memory": res.memory.model_dump() if res.memory else None,
                                              "memory_line": res.memory.describe() if res.memory else ""})
