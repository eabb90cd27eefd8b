"""The verifier: the static check and the checker here, candidate code only in a sandboxed runner.

``verify(task, source, plan)`` is the one entry point used by ``verify``, ``bench``, ``run`` and ``replay``,
and the :class:`~.plan.Plan` the one request they build: a human kernel and an LLM's candidate take exactly
the same path; ``tune_schedule(task, source, verdict)`` runs the ``tune`` stage on a correct candidate and
pins the winning configs in its source (the agent's tuner). The checker (trusted code, in the calling process)
owns the task, inputs, references, tolerances, launch rules, timing statistics and the verdict; the candidate
runs in a runner process inside the OS sandbox (:mod:`.sandbox`), which gets inputs and gives back outputs and
never learns whether a call is checked or timed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..tasks.model import Task
from ..untrusted import storable, storable_tree
from .plan import COMPILE_STAGES, DEFAULT_TUNE_BUDGET_S, PROFILE_COMPILE_MODES, Plan
from .sandbox import detect as detect_sandbox
from .verdict import MIN_GAIN, Outcome, OutputCheck, ShapeTuning, StageResult, TunedGemm, Verdict

if TYPE_CHECKING:
    from .stages import Context

# The checker's stages, the runner client and the tuner import torch: they load on first use (verify,
# cancel_all), so that reading verdicts (the store, the leaderboard, the CLI's listings) stays fast.

__all__ = [
    "COMPILE_STAGES",
    "DEFAULT_TUNE_BUDGET_S",
    "NO_CANDIDATE",
    "Outcome",
    "OutputCheck",
    "Plan",
    "StageResult",
    "Tuned",
    "TuningFailed",
    "Verdict",
    "baselines_plan",
    "cancel_all",
    "detect_sandbox",
    "pinned_source",
    "tune_plan",
    "tune_schedule",
    "verify",
]


#: Longest reason kept in a verdict (reasons reach the model's prompt).
MAX_REASON = 2500
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)


def verify(task: Task, source: str, plan: Plan | None = None) -> Verdict:
    """Check ``source`` against ``task``: the static check, then every stage of ``plan`` (by default the CPU
    emulator's correctness check), in order."""
    from . import gpu as _gpu  # noqa: F401 - registers the GPU stages
    from . import tuning as _tuning  # noqa: F401 - registers the tune stages (tune, tune_cpu)
    from .caches import prune_once
    from .scratch import remove_stale_once
    from .stages import STAGES, Context
    from .static import check_source
    from .static.copies import copied_constants

    plan = Plan() if plan is None else plan
    remove_stale_once()  # scratch folders a killed process left behind (kill -9): once per process
    prune_once()  # the compile caches of sources unused for longest, over their budget: once per process
    t0 = time.perf_counter()
    box = detect_sandbox()
    verdict = Verdict(task=task.name, task_version=task.version, backend=plan.backend, outcome=Outcome.PASSED,
                      sandbox=box.kind, runner_user=box.runner_user)
    if box.refused:
        verdict.stages.append(StageResult(stage="static", outcome=Outcome.INFRA_ERROR, reason=box.refused))
        return _finish(verdict, t0)
    violations = check_source(source) or copied_constants(source, task.constants)
    if violations:
        reason = "the static check rejected the candidate:\n" + "\n".join(str(v) for v in violations[:12])
        verdict.stages.append(StageResult(stage="static", outcome=Outcome.STATIC_REJECTED, reason=reason,
                                          details={"allowlist": any(v.allowlist for v in violations)}))
        return _finish(verdict, t0)
    verdict.stages.append(StageResult(stage="static", outcome=Outcome.PASSED, reason=""))
    ctx = Context(task=task, source=source, plan=plan, deadline=time.monotonic() + plan.timeout)
    try:
        for name in plan.stages:
            fn = STAGES.get(name)
            s0 = time.perf_counter()
            if fn is None:
                result = StageResult(stage=name, outcome=Outcome.INFRA_ERROR,
                                     reason=f"unknown stage {name!r} (known: {', '.join(STAGES)})")
            else:
                try:
                    result = fn(ctx)
                except Exception as exc:  # the harness failed, not the candidate
                    result = StageResult(stage=name, outcome=Outcome.INFRA_ERROR,
                                         reason=f"the checker failed: {type(exc).__name__}: {exc}")
            result.seconds = time.perf_counter() - s0  # all of it: a GPU stage's release of memory too
            verdict.stages.append(result)
            if result.outcome is not Outcome.PASSED:
                break
    finally:
        _close_runners(ctx, verdict)
    return _finish(verdict, t0, plan)


def _close_runners(ctx: Context, verdict: Verdict) -> None:
    """End the runners the stages kept; the time it takes (a runner's exit frees its device memory) counts
    in the last stage, so that the stages' seconds add up to the verification's wall time."""
    s0 = time.perf_counter()
    kept = bool(ctx.kept)
    ctx.close_runners()
    last = verdict.stages[-1]
    if kept and last.stage != "static":
        spent = time.perf_counter() - s0
        last.seconds += spent
        last.seconds_by_part["runner stop"] = round(last.seconds_by_part.get("runner stop", 0.0) + spent, 3)


#: The module of a job that runs the harness's stages alone (:func:`baselines_plan`): it passes the static
#: check, and no stage of such a plan loads it.
NO_CANDIDATE = "def forward(**inputs):\n    return {}\n"


def baselines_plan(plan: Plan) -> Plan:
    """The plan of a job that builds and runs every baseline ``plan``'s profile stage meets, once at each of
    its shapes (``bench_prepare`` in the profile stage's torch.compile modes), and nothing of a candidate: a
    later profile in the same process finds them made."""
    return plan.model_copy(update={"stages": ["bench_prepare"], "compile_modes": list(PROFILE_COMPILE_MODES)})


def tune_plan(stage: str = "tune", shape_set: str = "bench", budget_s: float = DEFAULT_TUNE_BUDGET_S,
              cache: bool = True) -> Plan:
    """The plan of one schedule search: ``tune`` (GPU) or ``tune_cpu`` (emulator), within ``budget_s``."""
    return Plan(stages=[stage], backend="quack" if stage == "tune" else "torch", shape_set=shape_set,
                seeds=[0], timeout=1.5 * budget_s + 300.0, tune_budget_s=budget_s, tune_cache=cache)


@dataclass(frozen=True)
class Tuned:
    """What a schedule search gave a candidate: its source with the winners pinned (None: nothing beat the
    configs as written) and, per shape, what was tried."""

    source: str | None
    search: dict[str, ShapeTuning] = field(default_factory=dict)
    #: shape -> why it was not tuned (the runner died there outside a proposal; the search went on without it)
    lost: dict[str, str] = field(default_factory=dict)
    #: shape -> the calls searched there when the runner died for good (no final comparison; the search ended)
    cut_short: dict[str, list[TunedGemm]] = field(default_factory=dict)
    #: the builds on the CPU beside the search: how many configs were queued, built, failed and skipped
    builds: dict[str, int] = field(default_factory=dict)
    #: the tune stage itself (its time by part, its details; its search is :attr:`search`); None when it never
    #: ran
    stage: StageResult | None = None


class TuningFailed(Exception):
    """The tune stage could not finish (the candidate stands with the configs it was written with);
    ``searched`` is what it measured before it ended."""

    def __init__(self, reason: str, searched: Tuned | None = None) -> None:
        super().__init__(reason)
        self.searched = searched or Tuned(None)


def cancel_all() -> int:
    """End every runner of this process (Ctrl-C, SIGTERM); none when no runner was ever started here."""
    client = sys.modules.get(f"{__name__}.client")
    return int(client.cancel_all()) if client is not None else 0


def tune_schedule(
    task: Task, source: str, verdict: Verdict, plan: Plan | None = None, min_gain: float | None = None,
) -> Tuned | None:
    """A correct candidate's schedule search, here, as ``plan`` asks (by default :func:`tune_plan`'s; an
    executor runs the plan as a job and hands the verdict to :func:`pinned_source`); None for a candidate that
    is not correct."""
    if not verdict.passed:
        return None
    plan = tune_plan() if plan is None else plan
    return pinned_source(source, verify(task, source, plan), plan.stages[0], min_gain)


def pinned_source(source: str, tuned: Verdict, stage: str = "tune", min_gain: float | None = None) -> Tuned:
    """``source`` with the winners of a tune verdict pinned (``@schedule({...})`` on forward) where they
    gained ``min_gain`` at some shape, under notes of this search's times and the earlier notes of the shapes
    it did not time, and the search. Raises :class:`TuningFailed` when the search failed."""
    from . import tuning
    from .static.schedule_source import pin_schedule, pinned_notes

    min_gain = MIN_GAIN if min_gain is None else min_gain
    result = tuned.stage(stage)
    if not tuned.passed or result is None:
        raise TuningFailed(tuned.reason or tuned.outcome.value, _searched(result))
    table = tuning.tuned_table(result, min_gain)
    if not table:
        return _searched(result)
    device = str(result.details.get("device", ""))
    # ASCII only: the runner reads the module in whatever locale its sandbox has.
    notes = [f"configs pinned by the harness's tune stage on {device}; forward() as written -> tuned (GPU "
             "time):"]
    notes += [
        f"  {name}: {t.before.gpu_us:.1f} -> {t.after.gpu_us:.1f} us" if t.gain >= min_gain
        else f"  {name}: {t.before.gpu_us:.1f} us, kept as written (nothing was {100 * (min_gain - 1):.0f}% "
             "faster)"
        for name, t in result.tuning.items()
    ]
    notes += pinned_notes(source, measured=result.tuning)
    return replace(_searched(result), source=pin_schedule(source, table, notes))


def _searched(result: StageResult | None) -> Tuned:
    """What a tune stage measured, nothing pinned (an empty search when the stage never ran)."""
    if result is None:
        return Tuned(None)
    lost, cut, builds = (result.details.get(k) for k in ("shapes_lost", "cut_short", "builds"))
    return Tuned(
        None, dict(result.tuning),
        {str(k): str(v) for k, v in lost.items()} if isinstance(lost, dict) else {},
        {str(k): [TunedGemm.model_validate(c) for c in calls] for k, calls in cut.items()}
        if isinstance(cut, dict) else {},
        {str(k): int(v) for k, v in builds.items()} if isinstance(builds, dict) else {},
        result.model_copy(update={"tuning": {}}),  # its search is ``search`` above
    )


def _finish(verdict: Verdict, t0: float, plan: Plan | None = None) -> Verdict:
    """Outcome from the stages; every planned stage present when passed; reasons bounded and scrubbed."""
    failed = next((s for s in verdict.stages if s.outcome is not Outcome.PASSED), None)
    ran = [s.stage for s in verdict.stages]
    if failed is None and plan is not None and ran[1:] != plan.stages:
        failed = StageResult(stage="checker", outcome=Outcome.INFRA_ERROR,
                             reason=f"stages {plan.stages} were planned, {ran[1:]} ran")
        verdict.stages.append(failed)
    for st in verdict.stages:
        st.reason = sanitize(st.reason)
        # per-shape reasons and the like carry the candidate's words too
        st.details = storable_tree(st.details)
        for c in st.checks:
            c.reason = sanitize(c.reason)
    if failed is not None:
        verdict.outcome, verdict.reason = failed.outcome, failed.reason
    else:
        verdict.reason = "; ".join(s.reason for s in verdict.stages if s.reason)
    verdict.timings["wall_s"] = round(time.perf_counter() - t0, 3)
    return verdict


def sanitize(text: str, limit: int = MAX_REASON) -> str:
    """A reason fit for a prompt and a record: no value of a secret-looking environment variable, bounded in
    length, storable (a candidate's message may carry lone surrogates; controls are neutralised where it is
    shown)."""
    text = storable(text)
    for name, value in os.environ.items():
        if len(value) >= 8 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "[redacted]")
    if len(text) > limit:
        text = text[: limit - 200] + "\n[...]\n" + text[-180:]
    return text
