"""The verifier: static check in-process, everything that runs candidate code in a sandboxed worker.

``verify(task, source, stages)`` is the one entry point used by ``verify``, ``bench``, ``run`` and
``replay``: a human kernel and an LLM's candidate take exactly the same path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..tasks.model import Task
from .static import check_source
from .verdict import Outcome, OutputCheck, StageResult, Verdict
from .worker import Job

#: Environment variables a candidate's worker may see; nothing else (API keys never reach candidate code).
ENV_ALLOW = re.compile(
    r"^(PATH|HOME|LANG|LC_[A-Z]+|TMPDIR|TEMP|TMP|PYTHONPATH|VIRTUAL_ENV|LD_LIBRARY_PATH|CUDA_VISIBLE_DEVICES|"
    r"CUDA_HOME|CUDA_PATH|NVIDIA_[A-Z_]+|QUACK_[A-Z_]+|CUTE_DSL_[A-Z_]+|CUTLASS_[A-Z_]+|TRITON_[A-Z_]+|"
    r"OMP_NUM_THREADS|OPENBLAS_[A-Z_]+|MKL_NUM_THREADS|XDG_CACHE_HOME|PYTHONUNBUFFERED)$"
)
ENV_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)

CPU_STAGES = ("correctness",)
COMPILE_STAGES = ("compile",)

__all__ = ["Outcome", "OutputCheck", "StageResult", "Verdict", "scrubbed_env", "verify"]


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: the allowlist above, minus anything that looks like a secret."""
    env = {k: v for k, v in os.environ.items() if ENV_ALLOW.match(k) and not ENV_SECRET.search(k)}
    env.update(extra or {})
    return env


def verify(
    task: Task,
    source: str,
    stages: tuple[str, ...] | list[str] = CPU_STAGES,
    *,
    shape_set: str = "small",
    shape_names: list[str] | None = None,
    seeds: list[int] | None = None,
    timeout: float = 600.0,
    backend_label: str = "torch",
) -> Verdict:
    """Check ``source`` against ``task``: static check here, then ``stages`` in a fresh worker process."""
    violations = check_source(source)
    if violations:
        reason = "the static check rejected the candidate:\n" + "\n".join(str(v) for v in violations)
        return Verdict(
            task=task.name, task_version=task.version, backend=backend_label, outcome=Outcome.STATIC_REJECTED,
            reason=reason, stages=[StageResult(stage="static", outcome=Outcome.STATIC_REJECTED, reason=reason)],
        )
    static = StageResult(stage="static", outcome=Outcome.PASSED, reason="")
    job = Job(
        task_path=str(task.path), source=source, stages=list(stages), shape_set=shape_set,
        shape_names=shape_names, seeds=seeds if seeds is not None else [0, 1, 2], backend_label=backend_label,
    )
    with tempfile.TemporaryDirectory(prefix="coda_job_") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "verdict.json"
        job_file.write_text(job.model_dump_json())
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "coda_agent.verifier.worker", str(job_file), str(out_file)],
                env=scrubbed_env({"PYTHONPATH": _package_root()}), cwd=tmp, capture_output=True, text=True,
                timeout=timeout, stdin=subprocess.DEVNULL,
            )
            died = proc.returncode != 0
            tail = (proc.stderr or "")[-1500:]
        except subprocess.TimeoutExpired:
            died, tail = True, ""
            timed_out = True
        else:
            timed_out = False
        verdict = Verdict.model_validate_json(out_file.read_text()) if out_file.exists() else None
    if verdict is None or (died and verdict.passed):
        done = verdict.stages if verdict else []
        if timed_out:
            outcome, reason = Outcome.TIMEOUT, f"the candidate did not finish within {timeout:.0f} s"
        else:
            outcome, reason = Outcome.CRASH, f"the worker process died (exit {proc.returncode}):\n{tail}"
        verdict = Verdict(task=task.name, task_version=task.version, backend=backend_label, outcome=outcome, reason=reason, stages=done)
    verdict.stages.insert(0, static)
    verdict.timings["wall_s"] = round(time.perf_counter() - t0, 3)
    return verdict


def _package_root() -> str:
    root = str(Path(__file__).resolve().parents[2])
    current = os.environ.get("PYTHONPATH")
    return root + (os.pathsep + current if current else "")
