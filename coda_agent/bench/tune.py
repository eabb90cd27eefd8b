"""Offline schedule tuning of the human kernels (``coda-agent bench --tune``; GPU only).

The search is the verifier's ``tune`` stage, the one the agent runs on every correct candidate: per bench
shape, a coordinate descent over :func:`~coda_agent.primitives.configs.config_space` with forward() timed
whole by the checker's honest protocol, then forward() as written and tuned timed interleaved. What comes back
is the human kernel with its winners pinned as ``@schedule({...})`` (where one gained 1% or more), shown as a
diff to review and commit: configs live with the kernel, so the bench itself never tunes.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass

from ..primitives.configs import config_label
from ..tasks.model import Task
from ..verifier import DEFAULT_TUNE_BUDGET_S, Tuned, TuningFailed, pinned_source, tune_plan, verify
from ..verifier.verdict import TunedGemm


@dataclass(frozen=True)
class KernelTuning:
    """One human kernel's search: the kernel as it is, and what the tuner made of it (``failed``: why the
    search ended early; ``tuned`` then holds what it had measured)."""

    task: str
    source: str
    tuned: Tuned
    failed: str | None = None

    def diff(self) -> str:
        """The change that pins the winners (empty: nothing beat the configs as written)."""
        if self.tuned.source is None:
            return ""
        path = f"coda_agent/suite/human/{self.task}.py"
        lines = difflib.unified_diff(self.source.splitlines(keepends=True),
                                     self.tuned.source.splitlines(keepends=True), fromfile=f"a/{path}",
                                     tofile=f"b/{path}")
        return "".join(lines)


def tune_human_kernel(task: Task, shape_set: str = "bench", shape_names: list[str] | None = None,
                      budget_s: float = DEFAULT_TUNE_BUDGET_S, stage: str = "tune") -> KernelTuning:
    """The tune stage on ``task``'s human kernel, uncached (a fresh measurement); ``tune_cpu`` runs it on the
    emulator (tests). A search that failed comes back with what it measured and why it failed."""
    assert task.human_file is not None
    source = task.human_file.read_text()
    plan = tune_plan(stage, shape_set, budget_s, cache=False).model_copy(update={"shape_names": shape_names})
    try:
        return KernelTuning(task.name, source, pinned_source(source, verify(task, source, plan), stage))
    except TuningFailed as exc:
        return KernelTuning(task.name, source, exc.searched, failed=str(exc))


SEARCH_COLUMNS = ("shape", "gemm (M x N x K)", "as written", "searched", "tuned", "before GPU µs",
                  "after GPU µs", "gain")


def search_rows(tuned: Tuned) -> list[list[str]]:
    """One row per shape and gemm call (:data:`SEARCH_COLUMNS`; the times and the gain on the first call's
    row), then the shape a dead runner cut short (its best so far, never compared: no times). The "tuned"
    column names what the diff pins: a search winner that lost the final comparison is named as not kept."""
    rows = []
    for shape, result in tuned.search.items():
        times = [f"{result.before.gpu_us:,.1f}", f"{result.after.gpu_us:,.1f}", f"{result.gain:.3f}"]
        for i, call in enumerate(result.calls):
            won = _won(call, None if result.kept() else "not kept")
            rows.append(_call_row(shape if i == 0 else "", call, won, times if i == 0 else ["", "", ""]))
    for shape, calls in tuned.cut_short.items():
        rows += [_call_row(f"{shape} (cut short)" if i == 0 else "", call, _won(call, "not compared"),
                           ["", "", ""]) for i, call in enumerate(calls)]
    return rows


def _won(call: TunedGemm, unpinned: str | None) -> str:
    """The search's winner, or ``as written (<winner> <unpinned>)`` where it is not pinned (``unpinned``:
    why)."""
    if call.tuned is None:
        return "as written"
    won = config_label(call.tuned)
    return won if unpinned is None else f"as written ({won} {unpinned})"


def _call_row(shape: str, call: TunedGemm, won: str, times: list[str]) -> list[str]:
    return [shape, f"{call.epilogue} {'x'.join(map(str, call.mnk))}", config_label(call.written),
            searched(call), won, *times]


def failures(tuned: Tuned) -> list[str]:
    """Every config that could not be timed, one line each: where, which, and why (a runner's death names its
    abort)."""
    calls = [(shape, call) for shape, result in tuned.search.items() for call in result.calls]
    calls += [(shape, call) for shape, cut in tuned.cut_short.items() for call in cut]
    return [
        f"{shape} {call.epilogue}: {label}: {why}"
        for shape, call in calls
        for label, why in call.failed.items()
    ]


def searched(call: TunedGemm) -> str:
    """``cached``, or ``N configs, S s each`` (the median proposal, its kernels' build included): what the
    budget bought for this call."""
    if call.cached:
        return "cached"
    spent = [s["proposal"] for s in call.seconds.values() if "proposal" in s]
    each = f", {statistics.median(spent):.1f} s each" if spent else ""
    untried = f" ({call.untried} left untried)" if call.untried else ""
    return f"{len(call.seconds)} configs{each}{untried}"
