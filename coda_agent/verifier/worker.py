"""The verifier's worker process: ``python -m coda_agent.verifier.worker JOB.json VERDICT.json``.

It runs the job's stages in order and stops at the first that fails. The verdict file is rewritten
atomically after every stage, so when the process dies (segfault, CUDA fault, timeout kill) the parent
still knows which stages had finished. Only the worker ever imports candidate code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import traceback
from pathlib import Path

from pydantic import BaseModel

from ..atomic import write_text_atomic
from .verdict import Outcome, StageResult, Verdict

#: Modules that register further stages when present (the GPU stages need a GPU worker).
OPTIONAL_STAGE_MODULES = ("coda_agent.verifier.gpu",)


class Job(BaseModel):
    """Pure data in: which task, which source, which stages, where."""

    task_path: str
    source: str
    stages: list[str]
    shape_set: str = "small"
    shape_names: list[str] | None = None
    seeds: list[int] = [0, 1, 2]
    backend_label: str = "torch"


def run_job(job: Job, out_path: Path | None = None) -> Verdict:
    from ..tasks.loader import load_task
    from .stages import STAGES, Context

    for mod in OPTIONAL_STAGE_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    task = load_task(job.task_path)
    verdict = Verdict(task=task.name, task_version=task.version, backend=job.backend_label, outcome=Outcome.PASSED)
    ctx = Context(task=task, source=job.source, shape_set=job.shape_set, shape_names=job.shape_names, seeds=job.seeds)
    for name in job.stages:
        fn = STAGES.get(name)
        t0 = time.perf_counter()
        if fn is None:
            result = StageResult(stage=name, outcome=Outcome.INFRA_ERROR, reason=f"stage {name!r} is not available on this worker (known: {', '.join(STAGES)})")
        else:
            try:
                result = fn(ctx)
            except Exception:
                result = StageResult(stage=name, outcome=Outcome.INFRA_ERROR, reason="the harness failed:\n" + traceback.format_exc(limit=6))
        result.seconds = result.seconds or time.perf_counter() - t0
        verdict.stages.append(result)
        if result.outcome is not Outcome.PASSED:
            verdict.outcome, verdict.reason = result.outcome, result.reason
        if out_path is not None:
            write_text_atomic(out_path, verdict.model_dump_json())
        if result.outcome is not Outcome.PASSED:
            break
    if verdict.passed:
        verdict.reason = "; ".join(s.reason for s in verdict.stages if s.reason)
    if out_path is not None:
        write_text_atomic(out_path, verdict.model_dump_json())
    return verdict


def main(argv: list[str]) -> int:
    job = Job.model_validate_json(Path(argv[1]).read_text())
    run_job(job, Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
