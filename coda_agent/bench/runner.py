"""``coda-agent bench``: the human library against eager, torch.compile, cuBLAS and the speed of light.

Every number goes through the verifier, exactly as an LLM's candidate would:

1. peaks: the device's bf16 matmul rate and HBM bandwidth, measured here first;
2. correctness, in parallel: ``gpu_correctness`` (which also builds every QuACK kernel into the disk
   cache) and ``bench_prepare`` (compiles the torch.compile baselines into Inductor's cache), one job
   per task, a few at a time on each GPU (compiles are CPU-bound; nothing is timed in this phase);
3. timing, one task at a time on each GPU: ``bench`` times the kernel interleaved with its baselines in
   one job, on the shapes that passed.

The executor (:mod:`coda_agent.execute`: this host, or a Ray cluster) decides which GPU runs each job.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomic
from ..execute import Executor, Job
from ..measure.baselines import COMPILE_MODES
from ..measure.peaks import Peaks, speed_of_light_us
from ..provenance import driver_version, git_commit, package_versions
from ..tasks.model import ShapePoint, Task
from ..verifier.plan import Plan
from ..verifier.verdict import Outcome, Verdict
from .results import BenchRow, BenchRun, E2ERun

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    shape_set: str = "bench"
    shape_names: list[str] | None = None
    seeds: int = 3
    timeout: float = 900.0
    compile_modes: tuple[str, ...] = tuple(COMPILE_MODES)

    def points(self, task: Task) -> list[ShapePoint]:
        """The task's shapes this bench times."""
        return task.points(self.shape_set, self.shape_names)

    def plan(self, stages: Sequence[str], shape_names: Sequence[str], seeds: Sequence[int]) -> Plan:
        """A bench job's plan: ``stages`` on the GPU kernels at these shapes and seeds, with these options."""
        return Plan(stages=list(stages), backend="quack", shape_set=self.shape_set,
                    shape_names=list(shape_names), seeds=list(seeds), timeout=self.timeout,
                    compile_modes=list(self.compile_modes))


def device_slug(device: str) -> str:
    """``NVIDIA H200`` -> ``h200`` (for result file names)."""
    words = [w for w in device.lower().replace("nvidia", "").split() if w]
    return "-".join(words) or "gpu"


def _source(task: Task) -> str:
    assert task.human_file is not None
    return task.human_file.read_text()


def _submit(executor: Executor, job: Job, progress: Progress, done: str,
            detail: Callable[[Verdict], str] = lambda verdict: "") -> Future[Verdict]:
    """The job on the executor; when it ends, ``<done> <task> on <worker>: <outcome>`` to the progress
    display, with the first line of the reason when it did not pass (a check's correct rows still count: the
    reason may be a later stage's), then ``detail`` of the verdict."""
    where: list[str] = []

    def report(f: Future[Verdict]) -> None:
        if not f.cancelled():
            verdict = f.result()
            why = "" if verdict.outcome is Outcome.PASSED else (verdict.reason.strip().splitlines()
                                                                or [""])[0][:200]
            more = detail(verdict)
            progress(f"{done} {job.task.name} on {where[0]}: {verdict.outcome.value}"
                     + (f" ({why})" if why else "")
                     + (f"; {more}" if more else ""))

    future = executor.submit(job, on_start=where.append)
    future.add_done_callback(report)
    return future


def check_tasks(
    tasks: list[Task], opts: BenchOptions, progress: Progress, executor: Executor,
    on_checked: Callable[[str, Verdict], None] = lambda name, verdict: None,
) -> dict[str, Verdict]:
    """Phase 2: correctness + compile warm-up, every task submitted at once (the executor paces them);
    ``on_checked`` gets each task's verdict as it comes, in this thread."""
    futures = {
        _submit(executor, Job(t, _source(t), opts.plan(
            ("gpu_correctness", "bench_prepare"), [p.name for p in opts.points(t)], range(opts.seeds),
        ), label=t.name), progress, "checked"): t.name
        for t in tasks
    }
    verdicts = {}
    for future in as_completed(futures):
        verdicts[futures[future]] = future.result()
        on_checked(futures[future], verdicts[futures[future]])
    return {t.name: verdicts[t.name] for t in tasks}


def time_task(task: Task, shapes: list[str], opts: BenchOptions, progress: Progress,
              executor: Executor) -> Future[Verdict]:
    """Phase 3: the ``bench`` stage (kernel + baselines, interleaved) in one job, alone on its GPU."""
    return _submit(executor, Job(task, _source(task), opts.plan(("bench",), shapes, (0,)), label=task.name),
                   progress, "timed", where_time_went)


def where_time_went(verdict: Verdict) -> str:
    """The bench stage's seconds by phase, summed over its shapes (``setup 9 s, warm-up 41 s (candidate 20 s,
    ...), timed 80 s (traced 30 s, ...), close 0 s over 5 shapes``)."""
    stage = verdict.stage("bench")
    totals: dict[str, float] = {}
    for timing in (stage.timings.values() if stage else ()):
        for phase, s in timing.seconds.items():
            totals[phase] = totals.get(phase, 0.0) + s
    if not totals or stage is None:
        return ""
    phases = []
    for phase, s in totals.items():
        if ": " in phase:  # a phase's part, shown with it
            continue
        parts = {k.removeprefix(f"{phase}: "): v for k, v in totals.items() if k.startswith(f"{phase}: ")}
        inner = f" ({', '.join(f'{k} {v:.0f} s' for k, v in parts.items())})" if parts else ""
        phases.append(f"{phase} {s:.0f} s{inner}")
    shapes = len(stage.timings)
    return ", ".join(phases) + f" over {shapes} shape{'s' * (shapes != 1)}"


def checked_rows(task: Task, opts: BenchOptions, checked: Verdict, peaks: Peaks) -> list[BenchRow]:
    """One row per shape point, from the check and the peaks; the correct ones are ``pending`` their times."""
    st = checked.stage("gpu_correctness")
    shape_info: dict[str, Any] = st.details.get("shapes", {}) if st else {}  # type: ignore[assignment]
    rows = []
    for point in opts.points(task):
        info = shape_info.get(point.name, {})
        ok = info.get("outcome") == Outcome.PASSED.value
        reason = "" if ok else info.get("reason", "") if info else checked.reason or "not checked"
        launched = info.get("launches")
        flops, nbytes = task.flops(point.dims), task.min_bytes(point.dims)
        rows.append(
            BenchRow(
                task=task.name, task_version=task.version, task_hash=task.content_hash, shape=point.name,
                dims=point.dims, correct=ok, verdict_reason=reason,
                sol_us=speed_of_light_us(flops, nbytes, peaks), flops=flops, min_bytes=nbytes,
                launches=launched.get("launches") if isinstance(launched, dict) else launched,
                family=task.family, gemms=[list(g) for g in task.gemm_shapes(point.dims)], pending=ok,
            )
        )
    return rows


def with_times(rows: list[BenchRow], timed: Verdict) -> list[BenchRow]:
    """The pending rows with the ``bench`` stage's times; a shape it could not time says why."""
    bench_st = timed.stage("bench")
    times = bench_st.timings if bench_st else {}
    out = []
    for row in rows:
        t = times.get(row.shape) if row.pending else None
        if t is not None:
            row = row.model_copy(update={
                "pending": False, "candidate": t.candidate, "eager": t.eager, "compiled": t.compiled,
                "compiled_max_autotune": t.compiled_max_autotune, "cublas": t.cublas,
            })
        elif row.pending:
            row = row.model_copy(update={"pending": False, "verdict_reason": timed.reason})
        out.append(row)
    return out


def run_bench(
    tasks: list[Task], opts: BenchOptions, peaks: Peaks, device: str, command: str,
    progress: Progress = lambda _: None, checkpoint: Callable[[BenchRun], None] | None = None,
    previous: BenchRun | None = None, *, executor: Executor,
) -> BenchRun:
    """Phases 2 and 3 (the caller measured the peaks); returns the whole run, ready to write.

    ``checkpoint`` gets the run after every checked task (rows not timed yet are ``pending``; tasks not
    checked yet are left out) and again after every timed task (in the tasks' order), so an interrupted bench
    keeps what it measured. Every timing is submitted at once: with several GPUs they run side by side, one
    per device. ``previous`` (``bench --resume``) is an earlier run of the same tree and options: its finished
    tasks are kept, not measured again, and its checked ones are only timed.
    """
    from ..verifier.gpu import TIMING_METHOD

    runnable = [t for t in tasks if t.human_file is not None and t.human_file.exists()]
    kept = reusable_rows(previous, runnable, opts) if previous is not None else {}
    finished = {name for name, task_rows in kept.items() if not any(r.pending for r in task_rows)}
    if finished:
        progress(f"kept from the earlier run: {', '.join(sorted(finished))}")
    if set(kept) - finished:
        progress(f"checked by the earlier run, to be timed: {', '.join(sorted(set(kept) - finished))}")
    run = BenchRun(
        created=previous.created if kept and previous else datetime.now(timezone.utc), command=command,
        device=device, driver=driver_version(), packages=package_versions(), git_commit=git_commit(),
        peak_tflops_bf16=peaks.tflops_bf16, peak_hbm_tbps=peaks.hbm_tbps, peaks_method=peaks.how,
        timing_method=TIMING_METHOD, correctness_seeds=opts.seeds, compile_modes=list(opts.compile_modes),
        tasks=[t.name for t in runnable],
    )
    rows = dict(kept)

    def save() -> None:
        run.rows = [r for t in runnable if t.name in rows for r in rows[t.name]]
        if checkpoint is not None:
            checkpoint(run)

    by_name = {t.name: t for t in runnable}

    def checked(name: str, verdict: Verdict) -> None:
        rows[name] = checked_rows(by_name[name], opts, verdict, peaks)
        save()

    to_check = [t for t in runnable if t.name not in kept]
    check_tasks(to_check, opts, progress, executor, checked)
    if not to_check:
        save()
    todo = [t for t in runnable if t.name not in finished]
    timings = {}
    for task in todo:
        shapes = [r.shape for r in rows[task.name] if r.pending]
        if shapes:
            timings[task.name] = time_task(task, shapes, opts, progress, executor)
    for task in todo:
        if task.name in timings:
            rows[task.name] = with_times(rows[task.name], timings[task.name].result())
            save()
    return run


def reusable_rows(previous: BenchRun, tasks: list[Task], opts: BenchOptions) -> dict[str, list[BenchRow]]:
    """The rows of an earlier run that this one may keep, for the tasks it checked at the same task version
    and shape points: finished ones are kept as they are; checked ones still ``pending`` need only their
    timing."""
    kept = {}
    for task in tasks:
        rows = [r for r in previous.rows if r.task == task.name]
        wanted = [p.name for p in opts.points(task)]
        if (
            rows
            and [r.shape for r in rows] == wanted
            and all(r.task_version == task.version and r.task_hash in (None, task.content_hash) for r in rows)
        ):
            kept[task.name] = rows
    return kept


def resume_problem(previous: BenchRun, device: str, opts: BenchOptions) -> str | None:
    """Why an earlier results file cannot be resumed here (other device, tree, seeds or compile modes), or
    None."""
    if previous.device != device:
        return f"it was measured on {previous.device}, this is {device}"
    commit = git_commit()
    if previous.git_commit != commit:
        return (f"it was measured at commit {previous.git_commit or 'unknown'}, this tree is "
                f"{commit or 'unknown'}")
    if previous.correctness_seeds != opts.seeds:
        return f"it checked {previous.correctness_seeds} seeds per shape, this run asks for {opts.seeds}"
    if previous.compile_modes != list(opts.compile_modes):
        return (f"it timed torch.compile modes {', '.join(previous.compile_modes)}, this run asks for "
                f"{', '.join(opts.compile_modes)}")
    return None


def command_line() -> str:
    return shlex.join(["coda-agent", *sys.argv[1:]])


def write_run(run: BenchRun | E2ERun, json_path: Path | None, md_path: Path | None) -> list[Path]:
    """The results JSON and its markdown summary (a suite bench's or an end-to-end one's), each written
    atomically."""
    from .report import e2e_markdown, markdown_summary

    written = []
    if json_path:
        write_text_atomic(json_path, run.model_dump_json(indent=2) + "\n")
        written.append(json_path)
    if md_path:
        write_text_atomic(md_path, markdown_summary(run) if isinstance(run, BenchRun) else e2e_markdown(run))
        written.append(md_path)
    return written
