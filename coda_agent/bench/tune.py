"""Offline kernel-config tuning for the human kernels (``coda-agent bench --tune``; GPU only).

Each ``primitives.gemm`` call a human kernel makes at a bench shape is autotuned by QuACK's own
autotuner (L2-cold CUDA-graph timing, compiles overlapped in a process pool) over
:data:`~coda_agent.primitives.configs.TILES` x both 2-CTA clusters, small enough that a whole suite tunes
in minutes (``full=True`` sweeps QuACK's whole space; swap_ab is always left out, as
:class:`~coda_agent.primitives.Config` cannot express it). The winners are then checked
end to end: the whole forward() with the kernel's current configs and with the winners, timed
interleaved by :mod:`coda_agent.measure.timing`. The result is a table to paste into the human kernel
(``CONFIGS = {(M, N, K): Config(...)}``): configs live with the kernel, so bench never autotunes.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..measure.timing import Clock, RepPlan, time_interleaved
from ..primitives import Config, backend
from ..primitives._epilogue import GemmCall
from ..primitives.configs import TILES, config_label, config_literal
from ..primitives.quack_patches import narrowed_autotuner
from ..tasks.model import Task
from ..verifier.candidate import CandidateModule


@dataclass
class TunedCall:
    """One gemm call of forward(): its epilogue, GEMM shape and QuACK's winning config."""

    epilogue: str
    mnk: tuple[int, int, int]
    config: Config
    current: Config | None
    timings_us: dict[str, float] = field(default_factory=dict)


@dataclass
class TunedShape:
    task: str
    shape: str
    calls: list[TunedCall]
    current_us: float
    tuned_us: float

    @property
    def gain(self) -> float:
        return self.current_us / self.tuned_us


def config_from_quack(c: Any) -> Config:
    return Config(
        tile_m=c.tile_m, tile_n=c.tile_n, cluster_m=c.cluster_m, cluster_n=c.cluster_n, pingpong=c.pingpong,
        max_swizzle_size=c.max_swizzle_size,
    )




class _Recorder:
    """Autotunes every gemm call through QuACK and remembers each call's winner, in call order."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.calls: list[TunedCall] = []
        self._tuners: list[Any] = []

    def keep(self, config: Any) -> bool:
        """Our part of QuACK's space (see the module docstring)."""
        return not config.swap_ab and (self.full or (config.tile_m, config.tile_n, config.pingpong) in TILES)

    def run(self, call: GemmCall) -> dict[str, torch.Tensor]:
        from ..primitives import _quack

        mod = _quack._epimod(call)
        kw, selects = _quack._operands(call)
        seen = len(self._tuners)
        res = mod(
            call.A, call.B, call.C, out_dtype=None if call.epi.mode == "packed" else call.out_dtype,
            config=None, tuned=True, **kw,
        )
        tuner = self._tuners[-1] if len(self._tuners) > seen else None
        timings = {}
        if tuner is not None and getattr(tuner, "configs_timings", None):
            timings = {
                config_label(config_from_quack(c.kwargs["config"])): float(t[0]) * 1e3
                for c, t in tuner.configs_timings.items()
            }
        best = tuner.best_config.kwargs["config"] if tuner is not None else None
        self.calls.append(
            TunedCall(
                epilogue=call.epi.name, mnk=(call.m, call.n, call.A.shape[1]),
                config=config_from_quack(best) if best is not None else Config(), current=call.config, timings_us=timings,
            )
        )
        out = dict(res)
        out.update(selects)
        return out

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Every gemm call of the block autotuned over our space, its winner recorded."""
        with narrowed_autotuner(self.keep) as tuners, backend.using("quack-tune", self.run):
            self._tuners = tuners
            yield


def _override(configs: list[Config]) -> Callable[[GemmCall], dict[str, torch.Tensor]]:
    """A backend run that gives the i-th gemm call of each forward() the i-th config."""
    from ..primitives import _quack

    count = [0]

    def run(call: GemmCall) -> dict[str, torch.Tensor]:
        cfg = configs[count[0] % len(configs)]
        count[0] += 1
        return _quack.run(dataclasses.replace(call, config=cfg))

    return run


def tune_task(task: Task, points: list[Any], clock: Clock | None = None, full: bool = False) -> list[TunedShape]:
    """Autotune every gemm call of the task's human kernel at each shape point; see the module docstring."""
    if task.human_file is None:
        raise ValueError(f"task {task.name} has no human kernel")
    backend.set_backend("quack")
    module = CandidateModule(task.human_file.read_text(), Path(tempfile.mkdtemp(prefix="coda_tune_")) / "candidate.py")
    clock = clock or Clock("cuda")
    results = []
    for point in points:
        inputs = task.make_inputs(point.dims, 0, device="cuda")
        rec = _Recorder(full)
        with torch.no_grad(), rec.recording():
            module.forward(**inputs, **task.constants)
        variants = _current_vs_tuned(module.forward, {**inputs, **task.constants}, [c.config for c in rec.calls])
        with torch.no_grad():
            t = time_interleaved(variants, clock, RepPlan(target_s=0.3, min_reps=20))
        results.append(TunedShape(task.name, point.name, rec.calls, t["current"].median_us, t["tuned"].median_us))
        del inputs, variants
    return results


def _current_vs_tuned(forward: Callable[..., Any], kwargs: dict[str, Any], winners: list[Config]) -> dict[str, Callable[[], object]]:
    tuned_run = _override(winners)

    def tuned() -> object:
        with backend.using("quack-tuned", tuned_run):
            return forward(**kwargs)

    return {"current": lambda: forward(**kwargs), "tuned": tuned}


def config_table(shapes: list[TunedShape], min_gain: float = 1.01) -> str:
    """The ``CONFIGS`` source to paste into the human kernel: winners that beat the current configs."""
    entries: dict[str, dict[tuple[int, int, int], Config]] = {}
    for s in shapes:
        if s.gain < min_gain:
            continue
        for call in s.calls:
            entries.setdefault(call.epilogue, {})[call.mnk] = call.config
    lines = []
    for epi, table in entries.items():
        lines.append(f"# {epi}: tuned offline on the H200 by `coda-agent bench --tune` (QuACK autotuner, no swap_ab)")
        lines.append("CONFIGS = {")
        lines += [f"    {mnk!r}: {config_literal(cfg)}," for mnk, cfg in sorted(table.items())]
        lines.append("}")
    return "\n".join(lines)
