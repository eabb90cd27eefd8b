"""Verifier stages, run by the checker: each takes a :class:`Context` and returns a StageResult.

The checker owns the task, the inputs, both references, the comparison and the verdict; the candidate
runs only in a sandboxed runner (:mod:`.client`) that never sees any of them. :data:`STAGES` maps a stage
name to its function; the GPU stages register themselves from :mod:`.gpu`.

The correctness protocol (CPU and GPU alike) at each shape: one input set per seed, and the stress set
when the task has one (its inputs at large magnitudes: a kernel that is only stable on small values fails
there), plus a decoy when that makes one set (:func:`.plan.input_sets`), sent to the runner; a warm-up call;
then one batch calling every set in turn and the first set again, so no call follows a call on the same
inputs (stale memory never holds the right answer) and the repeat shows whether the result depends on
anything but the inputs. Every call's output is checked against the FP32 reference, every call's launches
against the task's rules, and the inputs must come back unchanged.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..measure.peaks import NOMINAL_H200, speed_of_light_us
from ..primitives import Config
from ..primitives.configs import config_from_fields, config_label
from ..settings import runs_dir
from ..tasks.loader import BUILTIN_TASK_DIR, TaskError, reference_function, task_sources, upcast
from ..tasks.model import ShapePoint, Task, torch_dtype
from . import cost
from .caches import mark_used, quack_cache_for
from .client import (
    Batch,
    CallOutput,
    CandidateRaised,
    RunnerCancelled,
    RunnerClient,
    RunnerError,
    RunnerTimedOut,
)
from .compare import check_outputs, max_abs_difference
from .plan import GPU_STAGES, InputSet, Plan, input_sets
from .trace import LaunchEstimate, LaunchTrace, calls_from_trace, gemm_shortfall, gemm_shortfall_reason
from .verdict import Outcome, OutputCheck, StageMemory, StageResult


class Stopwatch:
    """Where a stage's wall time goes, part by part (:attr:`StageResult.seconds_by_part`): the clock around
    calls the stage makes anyway, so measuring costs nothing."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.parts.items()}


@dataclass
class Context:
    """What every stage may use: the task, the candidate's source, the plan and its deadline."""

    task: Task
    source: str
    plan: Plan
    deadline: float
    #: Per shape, the kernels the checked calls launched (timed calls must launch the same).
    signatures: dict[str, Any] = field(default_factory=dict)
    #: The largest peak device memory a runner of the current stage reported (None: none did).
    runner_peak: int | None = None
    #: The current stage's parts (:func:`stage` gives each stage a fresh one and records it in its result).
    watch: Stopwatch = field(default_factory=Stopwatch)

    #: Runners a stage kept for the next stage of this verification, by backend and device
    #: (:meth:`runner`'s ``shared``); :meth:`close_runners` ends them.
    kept: dict[tuple[str, str], RunnerClient] = field(default_factory=dict)

    @contextmanager
    def runner(self, backend: str, device: str, deadline: float | None = None,
               watch: Stopwatch | None = None, shared: bool = False) -> Iterator[RunnerClient]:
        """A runner of the candidate in the sandbox, killed at the stage's deadline (or an earlier
        ``deadline``); its start and stop count in ``watch`` (the stage's parts by default: a runner working
        beside the stage's own keeps its time apart).

        ``shared``: the runner an earlier stage of this verification kept, if there is one, and kept for a
        later stage when this one ends without a runner fault. The candidate's kernels are built and loaded
        once per verification then, not once per stage (14.5 s of the profile stage's 32 s on the H200,
        h200-2026-12-05-b-notes.md); every stage still sends its own input sets and judges its own calls."""
        watch = self.watch if watch is None else watch
        client = self.kept.pop((backend, device), None) if shared else None
        if client is not None:
            try:
                with watch.part("runner reset"):
                    client.reset()
            except RunnerError:  # it died between the stages: a fresh one then
                client.close()
                client = None
        if client is None:
            cache = quack_cache_for(self.source)
            mark_used(cache)
            with watch.part("runner start"):
                client = RunnerClient(
                    self.source, backend=backend, device=device, constants=dict(self.task.constants),
                    deadline=self.deadline if deadline is None else min(deadline, self.deadline),
                    cache_dir=cache, hidden=hidden_paths(self.task),
                )
        fault = True
        try:
            yield client
            fault = False
        finally:
            if client.peak_bytes is not None:
                self.runner_peak = max(client.peak_bytes, self.runner_peak or 0)
            if shared and not fault:
                self.kept[(backend, device)] = client
            else:
                with watch.part("runner stop"):
                    client.close()

    def close_runners(self) -> None:
        """End the runners kept for a later stage (the verification is over)."""
        while self.kept:
            self.kept.popitem()[1].close()


def hidden_paths(task: Task) -> tuple[Path, ...]:
    """What the runner must not see: every task folder and the task's files, the run store, the home folder,
    and the git folders above any of them or the package (their objects hold every version of those files)."""
    try:
        folders = [s.folder for s in task_sources()]
    except TaskError:
        folders = [BUILTIN_TASK_DIR]
    out = [*folders, Path.home()]
    if task.path is not None:
        out += [task.path.parent, task.path, task.reference_file]
        if task.human_file is not None:
            out.append(task.human_file)
    out.append(runs_dir().resolve())
    above = [p.resolve() for p in (*out, Path(__file__).parent)]
    out += [d / ".git" for p in above for d in (p, *p.parents) if (d / ".git").exists()]
    return tuple(dict.fromkeys(out))


StageFn = Callable[[Context], StageResult]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    """Register a stage; its result records where its time went (:func:`timed_by_part`), a GPU stage's its
    peak device memory too (:func:`measured`)."""

    def register(fn: StageFn) -> StageFn:
        STAGES[name] = timed_by_part(measured(name, fn) if name in GPU_STAGES else fn)
        return fn

    return register


def timed_by_part(fn: StageFn) -> StageFn:
    """``fn`` on a fresh :attr:`Context.watch`, its parts recorded in the result."""

    def run(ctx: Context) -> StageResult:
        ctx.watch = Stopwatch()
        result = fn(ctx)
        result.seconds_by_part = ctx.watch.rounded()
        return result

    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def measured(name: str, fn: StageFn) -> StageFn:
    """``fn`` with its peak device memory in its result: the checker's since the stage began, and its
    runners'."""

    def run(ctx: Context) -> StageResult:
        cuda = torch.cuda.is_available()
        if cuda:
            with ctx.watch.part("release"):  # the earlier stage's cached blocks, handed back to the driver
                release("cuda")
            torch.cuda.reset_peak_memory_stats()
        ctx.runner_peak = None
        result = fn(ctx)
        if cuda:
            result.memory = StageMemory(checker_peak_bytes=int(torch.cuda.max_memory_allocated()),
                                        runner_peak_bytes=ctx.runner_peak,
                                        device_total_bytes=int(torch.cuda.get_device_properties(
                                            torch.cuda.current_device()).total_memory))
        elif ctx.runner_peak is not None:
            result.memory = StageMemory(runner_peak_bytes=ctx.runner_peak)
        return result

    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


Reference = Callable[..., dict[str, torch.Tensor]]
#: (reference file, function, its source) -> the imported function: one import per reference source, not one
#: per shape and seed; an edited file is a new key, so it is imported afresh.
_imported_references: dict[tuple[Path, str, str], Reference] = {}


def reference_of(task: Task) -> Reference:
    """The task's FP32 reference function, imported once per reference source."""
    path = task.reference_file
    key = (path.resolve(), task.reference_function, path.read_text() if path.is_file() else "")
    if key not in _imported_references:
        # a missing or broken file raises, and is not kept
        _imported_references[key] = reference_function(task)
    return _imported_references[key]


def release(device: str | torch.device) -> None:
    """Hand the device memory this process no longer uses back to the driver, so the runner (another process
    on the same GPU) can have it: the caching allocator would otherwise keep it reserved here."""
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def references(task: Task, inputs: Mapping[str, torch.Tensor],
               watch: Stopwatch | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(FP32 reference, task-dtype reference) on the same inputs; each one's time in ``watch`` (its GPU work
    waited for, so the time is not charged to the comparison that would wait for it)."""
    ref = reference_of(task)
    watch = watch or Stopwatch()
    with torch.no_grad():
        with watch.part("reference FP32"):
            ref32 = ref(**upcast(inputs), **task.constants)
            _wait(inputs)
        with watch.part("reference dtype"):
            reflp = ref(**{k: v.clone() for k, v in inputs.items()}, **task.constants)
            _wait(inputs)
    return ref32, reflp


def _wait(on: Mapping[str, torch.Tensor]) -> None:
    """Wait for the GPU work queued on the device of ``on``'s tensors (nothing on the CPU)."""
    if any(v.is_cuda for v in on.values()):
        torch.cuda.synchronize()


class Reject(Exception):
    """Ends the check of one shape with an outcome and a reason."""

    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def returned_checks(ctx: Context, out: CallOutput, ref32: Mapping[str, torch.Tensor],
                    reflp: Mapping[str, torch.Tensor], point: ShapePoint, seed: int) -> list[OutputCheck]:
    """The tolerance checks of one returned output (a non-dict or a non-tensor value fails every check)."""
    task = ctx.task
    if out.kind != "dict":
        return [OutputCheck(output=o.name, shape_point=point.name, seed=seed, ok=False,
                            reason=f"forward() must return a dict keyed by output name, got {out.kind}")
                for o in task.outputs]
    if out.bad:
        name, kind = next(iter(out.bad.items()))
        return [OutputCheck(output=name, shape_point=point.name, seed=seed, ok=False,
                            reason=f"output {name!r} must be a plain torch.Tensor, got {kind}")]
    extra = {k: None for k in out.keys if k not in out.tensors}
    return check_outputs(task, {**out.tensors, **extra}, ref32, reflp, point.dims, point.name, seed,
                         ctx.plan.tolerance_baseline)


def call_problems(ctx: Context, batch: Batch, point: ShapePoint,
                  skip_first: bool = False) -> list[dict[str, object]]:
    """Per call, what it launched; raises :class:`Reject` for the first call that breaks a launch rule."""
    described: list[dict[str, object]] = []
    traces: list[LaunchTrace | None] = [None] * len(batch.times_us)
    if batch.trace is not None:
        traces = list(calls_from_trace(batch.trace, len(batch.times_us)))
    if batch.ops is None or len(batch.ops) != len(batch.times_us):
        raise Reject(Outcome.CRASH,
                     f"the runner logged {len(batch.ops or [])} calls for {len(batch.times_us)}")
    for i, (ops, tr) in enumerate(zip(batch.ops, traces, strict=True)):
        if skip_first and i == 0:
            continue
        est = LaunchEstimate.from_ops(ops)
        problem = (tr.problem(ctx.task, point.name) if tr
                   else None) or est.problem(ctx.task, point.dims, point.name, budget=tr is None)
        if problem:
            raise Reject(*problem)
        signature = tr.signature() if tr else est.signature()
        first = ctx.signatures.setdefault(f"{point.name}:{'trace' if tr else 'ops'}", signature)
        if signature != first:
            raise Reject(Outcome.CHEAT_DETECTED, (
                f"at shape {point.name}, calls on different inputs launched different kernels "
                f"({_diff(first, signature)}): every call must do the same work, whatever the inputs and "
                "however often it is called"
            ))
        described.append({**est.describe(), **(tr.describe() if tr else {})})
    return described


def _diff(a: Any, b: Any) -> str:
    gone, new = a - b, b - a
    parts = [f"missing {', '.join(list(gone)[:2])[:120]}" if gone else "",
             f"extra {', '.join(list(new)[:2])[:120]}" if new else ""]
    return "; ".join(p for p in parts if p)


def returned_bytes_limit(task: Task, point: ShapePoint, calls: int) -> int:
    """The most bytes the checker reads back for ``calls`` kept calls at ``point``: every task output at 8
    bytes an element (so a wrong dtype still reaches the output check), plus a MiB; a runner cannot make it
    read more."""
    per_call = sum(math.prod(shape) * 8 for shape in task.output_shapes(point.dims).values())
    return calls * per_call + (1 << 20)


def check_shape(ctx: Context, client: RunnerClient, point: ShapePoint, device: str,
                checks: list[OutputCheck]) -> tuple[dict[str, object], list[dict[str, Any]]]:
    """The correctness protocol at one shape (module docstring), adding to ``checks``; raises :class:`Reject`
    on a fault. Returns what it found there and the op log of its first checked call."""
    task, watch = ctx.task, ctx.watch
    checked, decoys = input_sets(task, ctx.plan.seeds)
    # The runner knows a set by its place alone: nothing tells the candidate which one is the stress set.
    ids = {s: f"{point.name}-{i}" for i, s in enumerate(checked + decoys)}
    order = checked + decoys + [checked[0]]
    # the window's pages for the outputs to come, made while the inputs cross and the runner warms up
    client.prepare_window(len(order) * task.output_bytes(point.dims))
    with watch.part("inputs"):
        # one set held here at a time: each is drawn again, the same, for its reference
        for s, set_id in ids.items():
            client.put(set_id, s.draw(task, point.dims, device))
        release(device)
    info: dict[str, object] = {"dims": point.dims}
    running = [(decoys or checked)[-1]]
    try:
        with watch.part("warm-up"):
            # builds the kernels; its launches are not judged
            warm = client.run([ids[running[0]]], keep=[])
        del warm
        running = order
        calls = [ids[s] for s in order]
        with watch.part("candidate"):
            batch = client.run(calls, keep=list(range(len(calls))))
    except CandidateRaised as exc:
        raised_on = running[exc.call] if exc.call is not None and exc.call < len(running) else None
        stressed = ", ".join(sorted(task.stress_inits()))
        where = (f" on the stress inputs alone ({stressed} at large magnitudes; the ordinary ones ran)"
                 if raised_on is not None and raised_on.stress and runs(client, ids[checked[0]]) else "")
        raise Reject(Outcome.RUNTIME_ERROR,
                     f"forward() raised at shape {point.name} {point.dims}{where}:\n{exc}") from None
    with watch.part("transfer"):
        outs = client.fetch(returned_bytes_limit(task, point, len(calls)))
        modified = client.drop(list(ids.values()))
    changed = sorted({k for v in modified.values() for k in v} | {k for o in outs for k in o.inputs_modified})
    if changed:
        raise Reject(Outcome.CHEAT_DETECTED,
                     f"at shape {point.name}, forward() modified its inputs {changed}; inputs are read-only")
    if len(outs) != len(calls):
        raise Reject(Outcome.CRASH, f"the runner returned {len(outs)} outputs for {len(calls)} calls")
    storages = [set(o.storages.values()) - {0} for o in outs]
    for i in range(len(outs)):
        for j in range(i):
            if storages[i] & storages[j]:
                raise Reject(Outcome.CHEAT_DETECTED, (
                    f"at shape {point.name}, forward() returned a buffer it had already returned from an "
                    "earlier call (an answer kept across calls); compute every output from the current inputs"
                ))
    # One set's references at a time (the first set's are drawn again for the repeat call at the end), and
    # each output let go once checked unless the repeat check needs it: the checker's memory does not grow
    # with the seeds.
    held: tuple[InputSet, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] | None = None
    for i, (out, inputs) in enumerate(zip(outs, order, strict=True)):
        if held is None or held[0] != inputs:
            held = None
            with watch.part("inputs"):
                release(device)
                drawn = inputs.draw(task, point.dims, device)
            held = inputs, references(task, drawn, watch)
            del drawn
        with watch.part("checks"):
            found = returned_checks(ctx, out, *held[1], point, inputs.seed)
        if inputs.stress:
            found = [c.model_copy(update={"stress": True, "reason": c.reason
                                          and unstable(task, point, c.reason)}) for c in found]
        if inputs in checked and out is not outs[-1]:
            checks.extend(found)
        failed = [c for c in found if not c.ok]
        if failed:
            raise Reject(Outcome.WRONG_OUTPUT, failed[0].reason)
        if 0 < i < len(outs) - 1:
            out.tensors.clear()
    held = None
    release(device)
    with watch.part("checks"):
        launches = call_problems(ctx, batch, point)
        info["launches"] = launches[0] if launches else {}
        agreement(task, outs[0], outs[-1], checks, point, checked[0].seed, info)
    return info, (batch.ops or [[]])[0]


def runs(client: RunnerClient, set_id: str) -> bool:
    """Whether forward() returns on one input set (after it raised on another: was it those inputs?)."""
    try:
        client.run([set_id], keep=[])
    except RunnerError:  # it raised there too, or the runner is gone: say nothing of the inputs
        return False
    return True


def unstable(task: Task, point: ShapePoint, reason: str) -> str:
    """A failed check's reason on the stress set: what that set is, and what usually fixes such a kernel."""
    stressed = ", ".join(sorted(task.stress_inits()))
    return (f"on the stress inputs at shape {point.name} ({stressed} at large magnitudes or at the edges of "
            f"their range, where the FP32 reference is finite), {reason}. The kernel passes the ordinary "
            "inputs but is numerically unstable at large magnitudes: keep every intermediate in range: over "
            "a row, subtract its maximum before exp (as a stable logsumexp or softmax does); element-wise, "
            "use the value functions that saturate (sigmoid, silu, tanh) rather than exp(x)/(1+exp(x)); and "
            "never take exp, a quotient, rsqrt or log of a value that can overflow or reach 0")


def agreement(task: Task, first: CallOutput, again: CallOutput, found: list[OutputCheck], point: ShapePoint,
              seed: int, info: dict[str, object]) -> None:
    """The repeat call must match the first: bitwise, or at least within the tolerance of the check.

    Bitwise is not required (a reduction may legitimately vary its order), but a difference beyond the
    tolerance means the result depends on memory contents or timing.
    """
    allowed = {c.output: c.allowed for c in found if c.allowed is not None and c.seed == seed}
    for spec in task.outputs:
        a, b = first.tensors[spec.name], again.tensors[spec.name]
        if torch.equal(a, b):
            continue
        worst = max_abs_difference(a, b)  # chunk by chunk: no FP64 copy of a whole output
        limit = allowed.get(spec.name, 0.0)
        if worst > limit:
            raise Reject(Outcome.CHEAT_DETECTED, (
                f"at shape {point.name} seed {seed}, two calls on identical inputs disagree on {spec.name!r} "
                f"by {worst:.3g} (allowed {limit:.3g}): the result depends on memory contents or timing"
            ))
        drifted = info.setdefault("not_bitwise_reproducible", [])
        assert isinstance(drifted, list)
        drifted.append(spec.name)


def runner_failure(exc: RunnerError, plan: Plan, raised: Outcome, prefix: str) -> tuple[Outcome, str]:
    """How a runner's fault ends a stage: the candidate raised (``raised``), ran out of time, was cancelled or
    died."""
    if isinstance(exc, CandidateRaised):
        return raised, f"{prefix}{exc}"
    if isinstance(exc, RunnerCancelled):
        return Outcome.INFRA_ERROR, str(exc)
    if isinstance(exc, RunnerTimedOut):
        return Outcome.TIMEOUT, f"the candidate did not finish within {plan.timeout:.0f} s"
    return Outcome.CRASH, str(exc)


def run_correctness(ctx: Context, name: str, backend_name: str, device: str,
                    bench_on_meta: bool = False) -> StageResult:
    """Every selected shape through :func:`check_shape` (the first fault ends the stage); with
    ``bench_on_meta``, then forward() at each bench shape on meta tensors (:func:`bench_configs`): the
    shapes a GPU would run must take the same work from shapes alone, whether or not a compile stage
    follows."""
    t0 = time.perf_counter()
    shapes: dict[str, dict[str, object]] = {}
    checks: list[OutputCheck] = []
    details: dict[str, object] = {"shapes": shapes, "seeds": list(ctx.plan.seeds), "device": device,
                                  "stressed_inputs": sorted(ctx.task.stress_inits())}

    def result(outcome: Outcome, reason: str) -> StageResult:
        return StageResult(stage=name, outcome=outcome, reason=reason, seconds=time.perf_counter() - t0,
                           checks=checks, details=details)

    try:
        with ctx.runner(backend_name, device, shared=device == "cuda") as client:
            first: tuple[ShapePoint, list[dict[str, Any]]] | None = None
            for point in ctx.plan.points(ctx.task):
                try:
                    info, ops = check_shape(ctx, client, point, device, checks)
                except Reject as rej:
                    shapes[point.name] = {"outcome": rej.outcome.value, "reason": rej.reason,
                                          "dims": point.dims}
                    return result(rej.outcome, rej.reason)
                shapes[point.name] = {"outcome": Outcome.PASSED.value, "reason": "", **info}
                first = first or (point, ops)
            bench = ctx.task.shapes.get("bench", []) if bench_on_meta and first else []
            if bench and first:
                seen: dict[str, list[dict[str, Any]]] = {}
                try:
                    with ctx.watch.part("discover"):
                        bench_configs(ctx.task, client, first[1], first[0], seen=seen)
                except Reject as rej:
                    return result(rej.outcome, rej.reason)
                details["bench_launches"] = {name: LaunchEstimate.from_ops(ops).launches
                                             for name, ops in seen.items()}
    except RunnerError as exc:
        return result(*runner_failure(exc, ctx.plan, Outcome.RUNTIME_ERROR, ""))
    n = len(ctx.plan.points(ctx.task))
    stress = " and the stress set" if ctx.task.stress_inits() else ""
    meta = (f"; the same work at the {_count(len(bench), 'bench shape')} on meta tensors" if bench else "")
    return result(Outcome.PASSED, f"all outputs within tolerance on {n} {ctx.plan.shape_set} shapes x "
                                  f"{len(ctx.plan.seeds)} seeds{stress}, launch budget kept{meta}")


@stage("correctness")
def cpu_correctness(ctx: Context) -> StageResult:
    """The emulator (torch backend) against the FP32 reference, with the launch estimate and GEMM rules, and
    forward() at the bench shapes on meta tensors (the shapes a GPU checks, which the emulator cannot run)."""
    return run_correctness(ctx, "correctness", "torch", "cpu", bench_on_meta=ctx.plan.shape_set != "bench")


@stage("compile")
def compile_sm90(ctx: Context) -> StageResult:
    """Build every kernel forward() launches for sm_90a, without a GPU (QuACK compile-only): at the first
    small shape, then each other config forward() would use at the bench shapes (:func:`bench_configs`)."""
    t0 = time.perf_counter()
    point = ctx.plan.points(ctx.task)[0]

    def result(outcome: Outcome, reason: str, details: dict[str, object] | None = None) -> StageResult:
        return StageResult(stage="compile", outcome=outcome, reason=reason, seconds=time.perf_counter() - t0,
                           details=details or {})

    try:
        with ctx.runner("quack-compile", "cpu") as client:
            with ctx.watch.part("build"):
                client.put("compile", ctx.task.make_inputs(point.dims, 0))
                batch = client.run(["compile"], keep=[])
            ops = batch.ops[0] if batch.ops else []  # the compile batch is always traced
            est = LaunchEstimate.from_ops(ops)
            if not est.gemms:
                return result(Outcome.CHEAT_DETECTED, f"at shape {point.name}, forward() built no GEMM "
                                                      "kernel: every GEMM must be a primitives.gemm call")
            missing = gemm_shortfall(ctx.task.gemm_shapes(point.dims), est.gemms)
            if missing:
                return result(Outcome.CHEAT_DETECTED, gemm_shortfall_reason(point.name, missing, est.gemms))
            details: dict[str, object] = est.describe()
            try:
                seen: dict[str, list[dict[str, Any]]] = {}
                with ctx.watch.part("discover"):
                    wanted = bench_configs(ctx.task, client, ops, point, seen=seen)
            except CandidateRaised as exc:
                return result(Outcome.COMPILE_ERROR, str(exc))
            except Reject as rej:
                return result(rej.outcome, rej.reason)
            for (epilogue, config), shape in wanted.items():
                at = (f"the config {config_label(config)} that forward() gives {epilogue} at bench shape "
                      f"{shape}")
                try:
                    with ctx.watch.part("build bench configs"):
                        client.set_schedule({(o["epilogue"], *o["gemm"]): config for o in ops
                                             if o.get("epilogue") == epilogue})
                        client.run(["compile"], keep=[])
                except CandidateRaised as exc:
                    return result(Outcome.COMPILE_ERROR, f"{at} does not build for sm_90a:\n{exc}")
            details["bench_configs"] = [f"{e}: {config_label(c)}" for e, c in wanted]
            details.update(cost_details(ctx.task, seen))
    except RunnerError as exc:
        return result(*runner_failure(exc, ctx.plan, Outcome.COMPILE_ERROR,
                                      f"building the sm_90a kernels failed at shape {point.name}:\n"))
    more = f", and {_count(len(wanted), 'more config')} it uses at the bench shapes" if wanted else ""
    return result(Outcome.PASSED,
                  f"built {_count(len(est.gemms), 'GEMM kernel')} for sm_90a at shape {point.name}{more}",
                  details)


def _count(n: int, noun: str) -> str:
    """``1 GEMM kernel``, ``2 GEMM kernels``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cost_details(task: Task, seen: Mapping[str, list[dict[str, Any]]]) -> dict[str, object]:
    """The cost estimate (:mod:`.cost`) at each bench shape from its op log on meta tensors, under the
    nominal H200 peaks the task prompt's speed of light uses: ``cost`` (per shape) and ``cost_summary`` (the
    feedback's text). The op logs come from the runner, which the candidate shares: a record the estimate
    cannot read leaves it out, it never fails the stage."""
    estimates = []
    for p in task.shapes.get("bench", []):
        if p.name in seen:
            sol = speed_of_light_us(task.flops(p.dims), task.min_bytes(p.dims), NOMINAL_H200)
            try:
                estimates.append(cost.estimate(
                    seen[p.name], NOMINAL_H200, shape=p.name, sol_us=sol, min_bytes=task.min_bytes(p.dims),
                    task_flops=sum(2.0 * m * n * k for m, n, k in task.gemm_shapes(p.dims)) or None))
            except (TypeError, ValueError, AttributeError, OverflowError):
                continue
    if not estimates:
        return {}
    return {"cost": [e.to_json() for e in estimates], "cost_summary": cost.summary(estimates)}


def bench_configs(task: Task, client: RunnerClient, built: list[dict[str, Any]], built_at: ShapePoint,
                  seen: dict[str, list[dict[str, Any]]] | None = None) -> dict[tuple[str, Config], str]:
    """The (epilogue, config) pairs forward() would run at the bench shapes that the compile at the small
    shape ``built_at`` did not build, each with the first bench shape that asks for it, learnt from forward()
    on meta tensors (the op log reports each call's effective config: a pinned schedule, the call's own, or
    the default). The same log is held to the launch rules of each bench shape, and must show the same kinds
    of work as forward() at ``built_at`` on meta tensors too (:meth:`LaunchEstimate.kinds`; :class:`Reject`):
    torch spells some ops differently on the CPU (``t[:, i:] = 1.0`` is one ``fill_`` there, a
    ``scalar_tensor`` and a ``copy_`` on meta tensors and on a GPU). A forward() that cannot run there from
    shapes alone (it reads tensor values on the host) is refused: the CPU would otherwise judge no bench
    shape at all."""

    def pair(op: dict[str, Any]) -> tuple[str, Config]:
        return str(op["epilogue"]), config_from_fields(op["config"]) if op.get("config") else Config()

    def on_meta(point: ShapePoint, where: str) -> list[dict[str, Any]]:
        shapes = {spec.name: (spec.concrete_shape(point.dims),
                              torch_dtype(spec.dtype)) for spec in task.inputs}
        try:
            return client.discover(shapes)
        except CandidateRaised as exc:
            why = "" if exc.contract else ("; host code must work from shapes alone: no .item(), float(t), "
                                           "bool(t) or `if` on a tensor's values (each one also stalls the "
                                           "GPU)")
            raise CandidateRaised(f"forward() raised at {where} {point.name}, run on meta tensors before "
                                  f"any kernel was built there{why}:\n{exc}", contract=True) from None

    have = {pair(o) for o in built if "gemm" in o}
    bench = task.shapes.get("bench", [])
    small = LaunchEstimate.kinds(on_meta(built_at, "shape")) if bench else Counter()
    wanted: dict[tuple[str, Config], str] = {}
    for point in bench:
        ops = on_meta(point, "bench shape")
        if seen is not None:
            seen[point.name] = ops
        problem = LaunchEstimate.from_ops(ops).problem(task, point.dims,
                                                       f"{point.name} (bench, on meta tensors)")
        if problem:
            raise Reject(*problem)
        if (kinds := LaunchEstimate.kinds(ops)) != small:
            raise Reject(Outcome.CHEAT_DETECTED, (
                f"at bench shape {point.name} (on meta tensors), forward() does other work than at shape "
                f"{built_at.name} ({_diff(small, kinds)}): every shape must run the same gemm epilogues and "
                "host ops, only the configs may differ (the CPU checks values at the small shapes only); "
                "what differs by shape goes into the one epilogue as an operand (a number, a vector), or a "
                "HeadRstd given to gemm() per call"
            ))
        for op in ops:
            if "gemm" in op and pair(op) not in have:
                wanted.setdefault(pair(op), point.name)
    return wanted

