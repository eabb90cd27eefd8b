"""Offline schedule tuning of the human kernels (``coda-agent bench --tune``; GPU only).

The search is the verifier's ``tune`` stage, the one the agent runs on every correct candidate: per bench shape, a
coordinate descent over :func:`~coda_agent.primitives.configs.config_space` with forward() timed whole by the
checker's honest protocol, then forward() as written and tuned timed interleaved. What comes back is the human
kernel with its winners pinned as ``@schedule({...})`` (where one gained 1% or more), shown as a diff to review
and commit: configs live with the kernel, so the bench itself never tunes.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass

from ..primitives.configs import config_label
from ..tasks.model import Task
from ..verifier import DEFAULT_TUNE_BUDGET_S, Tuned, pinned_source, run_plan, tune_plan
from ..verifier.verdict import ShapeTuning, TunedGemm


@dataclass(frozen=True)
class KernelTuning:
    """One human kernel's search: the kernel as it is, and what the tuner made of it."""

    task: str
    source: str
    tuned: Tuned

    def diff(self) -> str:
        """The change that pins the winners (empty: nothing beat the configs as written)."""
        if self.tuned.source is None:
            return ""
        path = f"coda_agent/suite/human/{self.task}.py"
        lines = difflib.unified_diff(self.source.splitlines(keepends=True), self.tuned.source.splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}")
        return "".join(lines)


def tune_human_kernel(task: Task, shape_set: str = "bench", shape_names: list[str] | None = None,
                      budget_s: float = DEFAULT_TUNE_BUDGET_S, stage: str = "tune") -> KernelTuning:
    """The tune stage on ``task``'s human kernel, uncached (a fresh measurement); ``tune_cpu`` runs it on the
    emulator (tests). Raises :class:`~coda_agent.verifier.TuningFailed` when the search could not run."""
    assert task.human_file is not None
    source = task.human_file.read_text()
    plan = tune_plan(stage, shape_set, budget_s, cache=False).model_copy(update={"shape_names": shape_names})
    return KernelTuning(task.name, source, pinned_source(source, run_plan(task, source, plan), stage))


SEARCH_COLUMNS = ("shape", "gemm (M x N x K)", "as written", "searched", "tuned", "before GPU µs", "after GPU µs", "gain")


def search_rows(search: dict[str, ShapeTuning]) -> list[list[str]]:
    """One row per shape and gemm call (:data:`SEARCH_COLUMNS`; the times and the gain on the first call's row)."""
    rows = []
    for shape, result in search.items():
        for i, call in enumerate(result.calls):
            first = i == 0
            rows.append([
                shape if first else "", f"{call.epilogue} {'x'.join(map(str, call.mnk))}", config_label(call.written),
                searched(call), config_label(call.tuned) if call.tuned else "as written",
                f"{result.before.gpu_us:,.1f}" if first else "", f"{result.after.gpu_us:,.1f}" if first else "",
                f"{result.gain:.3f}" if first else "",
            ])
    return rows


def searched(call: TunedGemm) -> str:
    """``cached``, or ``N configs, S s each`` (the median proposal, its kernels' build included): what the budget
    bought for this call."""
    if call.cached:
        return "cached"
    spent = [s["proposal"] for s in call.seconds.values() if "proposal" in s]
    each = f", {statistics.median(spent):.1f} s each" if spent else ""
    return f"{len(call.seconds)} configs{each}"
