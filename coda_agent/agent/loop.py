"""The agent loop: rounds of K concurrent candidates, verified, fed back, recorded, until a target or a
budget.

State lives in the run directory, not in memory: the prompts of round r are a pure function of the task
and the attempts of rounds < r, so ``Agent.resume`` rebuilds the conversation from the attempt files
and redoes only the attempts that were in flight when the previous process died.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..execute import Executor, Job, LocalExecutor, VerifyFn
from ..measure.peaks import NOMINAL_H200, Peaks, measure_peaks, speed_of_light
from ..messages import ChatMessage
from ..prompts.chat import build_messages, describe_checks, system_prompt, task_prompt
from ..prompts.examples import select_examples
from ..provenance import git_state, host_name, package_versions
from ..providers.base import Completion, Provider, ProviderError
from ..store.ranking import ESTIMATE_GOAL, best_attempt, estimate_sol_fraction, population
from ..store.records import Attempt, Budgets, RunHeader, RunSummary, Tuning, Usage
from ..store.rundir import RunReader, RunRecordError, RunWriter, new_run_id, rolled_up
from ..tasks.loader import TaskError, find_recorded_task
from ..tasks.model import Task
from ..untrusted import storable
from ..verifier import (
    DEFAULT_TUNE_BUDGET_S,
    NO_CANDIDATE,
    Plan,
    Tuned,
    baselines_plan,
    pinned_source,
    tune_plan,
    verify,
)
from ..verifier.builds import build_line
from ..verifier.verdict import Verdict
from .extract import MAX_REPLY_CHARS, Extraction, extract_code
from .timing import human_times, timing_from_verdict

#: The stages a run verifies each candidate with, on a CPU (the emulator, then the sm_90a build) and on a GPU
#: (the verifier's own tables of stages by kind are ``verifier.plan``'s).
RUN_CPU_STAGES = ("correctness", "compile")
#: Parity with the human kernel (or, without one, cuBLAS alone) within timing noise.
DEFAULT_TARGET_SPEEDUP = 0.97
#: A run without GPU timing whose candidates build for sm_90a: correct, and the CPU's cost estimate at least
#: this fraction of the speed of light (geometric mean over the bench shapes). Every human kernel's estimate
#: is within 0.966 of it at every bench shape; a kernel running its GEMM twice is at 0.5, one leaving an
#: element-wise pass on the host at about 0.77 (manual seats).
DEFAULT_TARGET_ESTIMATE = 0.9
#: How many of the best distinct correct candidates the model sees (with their timings and code).
DEFAULT_POPULATION = 3
RUN_GPU_STAGES = ("gpu_correctness", "profile")  # see RUN_CPU_STAGES
#: The plan's settings a run header records in ``params`` (its stages in ``verifier_stages``): key -> field.
RECORDED_PLAN = {"shape_set": "shape_set", "seeds": "seeds", "backend_label": "backend",
                 "verify_timeout": "timeout"}
#: The harness's schedule tuner (tile, cluster, pingpong/cooperative per gemm; by default the tune stage as a
#: job on the run's executor): given the task and a correct, timed candidate's module and verdict, the module
#: with its configs pinned, or None (nothing beat the configs as written).
TuneFn = Callable[[Task, str, Verdict], "Tuned | None"]


class FatalProviderError(Exception):
    """The provider cannot serve this run at all (auth, unknown model, disabled, bad config): stop."""


def gpu_verifier_available() -> bool:
    """A CUDA device is present (the verifier's GPU stages are always registered)."""
    import torch

    return bool(torch.cuda.is_available())


def session_peaks(config: AgentConfig) -> Peaks:
    """The ceilings the prompts' speed of light uses: measured here when this run times on a GPU, else
    nominal."""
    if config.timed and gpu_verifier_available():
        return measure_peaks()
    return NOMINAL_H200


@dataclass(frozen=True)
class AgentConfig:
    """How a run is conducted; everything here is recorded in the run header."""

    model: str
    budgets: Budgets = field(default_factory=Budgets)
    temperature: float = 0.7
    max_reply_tokens: int = 8192
    #: What every candidate's verification checks (the human kernel's timing too).
    plan: Plan = field(default_factory=lambda: Plan(stages=list(RUN_CPU_STAGES)))
    target_speedup: float | None = DEFAULT_TARGET_SPEEDUP
    target_sol: float | None = None
    #: Without GPU timing: the CPU cost estimate's fraction of the speed of light a correct candidate must
    #: reach to end the run (None: any correct candidate ends it).
    target_estimate: float | None = DEFAULT_TARGET_ESTIMATE
    examples: tuple[str, ...] | None = None
    #: Task files and folders whose human kernels join the suite's as worked examples (``run
    #: --examples-from``).
    example_places: tuple[str, ...] = ()
    base_url: str | None = None
    #: CPU verifications at once, when the run has a local executor of its own.
    verify_workers: int = 2
    population_size: int = DEFAULT_POPULATION
    #: Seconds the harness may search each correct, timed candidate's gemm configs (None: no tuning).
    tune_budget_s: float | None = None

    @classmethod
    def for_this_machine(
        cls, model: str, *, compile: bool = True, tune_budget_s: float | None = DEFAULT_TUNE_BUDGET_S,
        seeds: Sequence[int] | None = None, **kwargs: Any,
    ) -> AgentConfig:
        """GPU stages on a machine that has them (and the schedule tuned, unless ``tune_budget_s`` is None),
        else the CPU emulator (+ the sm_90a compile unless ``compile=False``); ``seeds`` (None: the
        plan's)."""
        plan: dict[str, Any] = {} if seeds is None else {"seeds": seeds}
        if gpu_verifier_available():
            # Timings never overlap on a device: the executor gives a timed verification its GPU alone.
            plan |= {"stages": RUN_GPU_STAGES, "shape_set": "bench", "backend": "quack"}
            kwargs = {"tune_budget_s": tune_budget_s, **kwargs}
        else:
            plan["stages"] = RUN_CPU_STAGES if compile else ("correctness",)
        return cls(model=model, plan=Plan.model_validate(plan), **kwargs)

    @property
    def timed(self) -> bool:
        return "profile" in self.plan.stages

    def target_for(self, task: Task) -> dict[str, Any]:
        """Correct, and when timed: ``target_speedup`` of the human kernel's speed (cuBLAS alone's when the
        task has none: the epilogue-is-free floor) or ``target_sol`` of SoL, whichever is reached first;
        untimed with the sm_90a build, ``target_estimate`` of SoL by the CPU's cost estimate."""
        target: dict[str, Any] = {"correct": True}
        if not self.timed:
            if self.target_estimate is not None and "compile" in self.plan.stages:
                target[ESTIMATE_GOAL] = self.target_estimate
            return target
        if self.target_speedup is not None:
            target[f"speedup_vs_{speed_reference(task)}"] = self.target_speedup
        if self.target_sol is not None:
            target["sol_fraction"] = self.target_sol
        return target

    def params(self) -> dict[str, Any]:
        """The header's record of this configuration (its plan's stages are ``verifier_stages``)."""
        return {
            "temperature": self.temperature, "max_reply_tokens": self.max_reply_tokens,
            **{key: getattr(self.plan, name) for key, name in RECORDED_PLAN.items()},
            "examples": list(self.examples or []), "example_places": list(self.example_places),
            "base_url": self.base_url, "verify_workers": self.verify_workers,
            "target_speedup": self.target_speedup, "target_sol": self.target_sol,
            "target_estimate": self.target_estimate, "population_size": self.population_size,
            "tune_budget_s": self.tune_budget_s,
        }

    @classmethod
    def from_header(cls, header: RunHeader, **overrides: Any) -> AgentConfig:
        """The configuration a recorded run used (budgets may be overridden to extend it)."""
        p = header.params
        plan = Plan.model_validate({"stages": header.verifier_stages or RUN_CPU_STAGES,
                                    **{name: p[key] for key, name in RECORDED_PLAN.items() if key in p}})
        cfg = cls(
            model=header.model, budgets=header.budgets, temperature=p.get("temperature", 0.7),
            max_reply_tokens=p.get("max_reply_tokens", 8192), plan=plan,
            target_speedup=p.get("target_speedup", DEFAULT_TARGET_SPEEDUP),
            target_sol=p.get("target_sol"), target_estimate=p.get("target_estimate"),
            examples=tuple(p.get("examples") or ()),
            example_places=tuple(p["example_places"]) if "example_places" in p
            else _old_example_places(header),
            base_url=p.get("base_url"), verify_workers=p.get("verify_workers", 2),
            population_size=p.get("population_size", DEFAULT_POPULATION),
            tune_budget_s=p.get("tune_budget_s"),
        )
        return replace(cfg, **overrides)


def _old_example_places(header: RunHeader) -> tuple[str, ...]:
    """Where a run recorded before ``example_places`` found its examples: the suite and its task's own folder
    (what every run searched then), so that it resumes with the prompts it started with."""
    folder = Path(header.task_path).parent if header.task_path else None
    return (str(folder),) if folder is not None and folder.is_dir() else ()


class RunEvents:
    """What a display hears about a run; every method is optional (the default does nothing)."""

    def note(self, message: str) -> None: ...

    def round_started(self, round_no: int, slots: int) -> None: ...

    def attempt_started(self, index: int, round_no: int, slot: int) -> None: ...

    def attempt_phase(self, index: int, phase: str) -> None: ...

    def attempt_placed(self, index: int, worker: str) -> None:
        """The attempt's verification started on ``worker`` (``cpu``, ``gpu0``, ``gpu1@node-b``)."""

    def attempt_finished(self, attempt: Attempt, summary: RunSummary) -> None: ...

    def run_finished(self, summary: RunSummary) -> None: ...


class SharedBudget:
    """Dollars several runs draw on together (a sweep's ``--total-dollars``): each of them stops once the
    total reaches the limit. Runs in flight may overshoot it by what their last round costs."""

    def __init__(self, max_dollars: float, already_spent: float = 0.0) -> None:
        self.max_dollars = max_dollars
        self.already_spent = already_spent  # by runs that are not in this process (finished ones)
        self.agents: list[Agent] = []

    def spent(self) -> float:
        return self.already_spent + sum(a.spent_dollars() for a in self.agents)

    def exhausted(self) -> bool:
        return self.spent() >= self.max_dollars


#: Where replies are read, off the event loop, so that other runs of a sweep and Ctrl-C never wait on a long
#: one; its own thread, not asyncio's default pool, which tuning jobs hold for minutes (``Agent._tune``). One
#: is enough: the reading is pure Python and CPU-bound, so more threads would only take turns at the GIL.
_REPLY_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reply")


def read_reply(raw: str) -> tuple[str, Extraction]:
    """The reply as the run keeps it (:func:`kept_reply`) and the code in it: linear in its length, yet up to
    half a second for a hostile reply near the cap, so :meth:`Agent._attempt` runs it on
    :data:`_REPLY_READER`."""
    text = storable(raw)
    try:
        extraction = extract_code(text)
    except Exception as exc:  # extract_code takes any text; should it fail, the attempt is still recorded
        extraction = Extraction(None, f"the code could not be extracted ({type(exc).__name__})")
    return kept_reply(text), extraction


def kept_reply(text: str) -> str:
    """A reply as the run keeps it: storable (lone surrogates replaced), and at most a little over the longest
    reply searched for code (a 20 MB reply is a head and a note, not 20 MB in the record and the next
    prompt)."""
    text = storable(text)
    if len(text) > MAX_REPLY_CHARS:
        text = text[:MAX_REPLY_CHARS] + (f"\n[... {len(text) - MAX_REPLY_CHARS:,} more characters of the "
                                         "reply not kept ...]")
    return text


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _device(config: AgentConfig) -> str:
    if config.plan.backend == "torch":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def speed_reference(task: Task) -> str:
    """What a timed run's speed target is measured against: the human kernel when the task has one, else
    cuBLAS alone."""
    return "human" if task.human_file is not None and task.human_file.exists() else "cublas"


def target_text(config: AgentConfig, goals: Mapping[str, float]) -> str:
    """What a run asks of a candidate, in the task message's words (``goals``: the header target's speed
    ratios)."""
    if not config.timed:
        built = " and builds for sm_90a" if "compile" in config.plan.stages else ""
        estimate = (f", and the CPU's cost estimate at least {100 * goals[ESTIMATE_GOAL]:.0f}% of the speed "
                    "of light (geometric mean over the bench shapes: its bytes, FLOPs and launches)"
                    if ESTIMATE_GOAL in goals else "")
        return (
            f"a correct candidate: every output within tolerance on the emulator{built}{estimate}. There is "
            "no GPU in this run, so speed is not measured here; still write the kernel you would want timed "
            "(everything fused, within the launch budget)"
        )
    goal = " or ".join(_goal_text(k, v) for k, v in goals.items()) or "as fast as you can make it"
    return f"correct, and {goal} (geometric mean over the bench shapes)"


def task_message(task: Task, config: AgentConfig, peaks: Peaks, goals: Mapping[str, float],
                 human_us: Mapping[str, float] | None = None) -> str:
    """The task's first user message under ``config``: its checks, target and speed of light at ``peaks``
    (``human_us``: the human kernel's times where a timed run measured them)."""
    return task_prompt(task, checks=describe_checks(task, config.plan), target=target_text(config, goals),
                       sol=speed_of_light(task, "bench", peaks), sol_label=peaks.label(), human_us=human_us)


def first_messages(task: Task, config: AgentConfig) -> list[ChatMessage]:
    """The chat a model gets first on ``task`` under ``config``, as a run sends it (less the human kernel's
    GPU times, which a timed run measures as it starts), without a run: ``coda-agent prompt``."""
    examples = select_examples(task, places=config.example_places, names=config.examples)
    goals = {k: float(v) for k, v in config.target_for(task).items() if k != "correct"}
    return build_messages(system_prompt(examples), task_message(task, config, session_peaks(config), goals),
                          [], population=[], goal_is_speed=config.timed, goals=goals)


def _goal_text(key: str, goal: float) -> str:
    if key == "sol_fraction":
        return f"at least {100 * goal:.0f}% of the speed of light"
    of = {
        "speedup_vs_human": "the hand-written kernel",
        "speedup_vs_cublas": "the task's GEMMs alone in cuBLAS (as if the epilogue were free)",
    }.get(key, key.removeprefix("speedup_vs_"))
    return f"at least {goal:g}x the speed of {of}"


class Agent:
    """One run of the loop over one task with one provider, recording into one run directory."""

    def __init__(
        self,
        task: Task,
        provider: Provider,
        config: AgentConfig,
        writer: RunWriter,
        header: RunHeader,
        *,
        attempts: Sequence[Attempt] = (),
        previous: RunSummary | None = None,
        events: RunEvents | None = None,
        verify_fn: VerifyFn = verify,
        tune_fn: TuneFn | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.task, self.provider, self.config, self.writer, self.header = (
            task,
            provider,
            config,
            writer,
            header,
        )
        provider.bind_run_dir(writer.run_dir)
        self.events = events or RunEvents()
        # what a local executor of the run's own runs (a given executor has its own)
        self.verify_fn = verify_fn
        if tune_fn is None and config.timed and config.tune_budget_s:
            tune_fn = self._tune_on_executor
        self.tune_fn = tune_fn
        #: Where verifications run: shared (a command's, a sweep's), or None for a local one of this run's
        #: own.
        self.executor = executor
        self.attempts: list[Attempt] = sorted(attempts, key=lambda a: a.index)
        self.previous = previous
        self.examples = select_examples(task, places=config.example_places, names=config.examples)
        self.peaks = session_peaks(config)
        self.sol = speed_of_light(task, "bench", self.peaks)
        self.system = system_prompt(self.examples)
        self.summary = previous.model_copy() if previous else RunSummary()
        self._prior_wall = previous.wall_seconds if previous else 0.0
        self._session_start = time.monotonic()
        self._pending = self._unfinished_slots()
        self._executor: Executor | None = None
        self._best_written: int | None = previous.best_attempt if previous else None
        self._warned_price = False
        #: What stopped the run when it is cancelled (set by whoever cancels it; recorded in the summary).
        self.interrupted_by = "Ctrl-C"
        #: A budget shared with other runs (a sweep's), checked with this run's own.
        self.shared: SharedBudget | None = None

    # --- creating and resuming ------------------------------------------------------------------

    @classmethod
    def create(
        cls, task: Task, provider: Provider, config: AgentConfig, runs_dir: Path, **kwargs: Any
    ) -> Agent:
        """Start a new run directory (header written) for ``task``."""
        examples = select_examples(task, places=config.example_places, names=config.examples)
        config = replace(config, examples=tuple(e.name for e in examples))
        created = _now()
        commit, dirty = git_state()
        header = RunHeader(
            run_id=new_run_id(task.name, created.astimezone()), created=created, task=task.name,
            task_version=task.version, task_path=str(task.path), task_hash=task.content_hash,
            model=config.model, params=config.params(), budgets=config.budgets,
            target=config.target_for(task), verifier_stages=list(config.plan.stages), git_commit=commit,
            git_dirty=dirty, packages=package_versions(), device=_device(config), host=host_name(),
        )
        writer = RunWriter.create(runs_dir, header)
        try:
            return cls(task, provider, config, writer, header, **kwargs)
        except BaseException:
            writer.close()
            raise

    @classmethod
    def resume(
        cls, run_dir: Path, provider: Provider, *, budgets: Budgets | None = None,
        writer: RunWriter | None = None, **kwargs: Any,
    ) -> Agent:
        """Continue a recorded run: same task, model and settings; ``budgets`` may extend it. The run's writer
        is opened here (RunBusy while another process writes it) unless the caller opened it already
        (``writer``)."""
        writer = writer or RunWriter.open(run_dir)
        try:
            reader = RunReader(run_dir)  # read under the lock: no other process adds to it now
            header = reader.header
            task = find_recorded_task(header.task_path, header.task)
            if task.version != header.task_version:
                raise TaskError(
                    f"{header.task_path} is now version {task.version}, but the run was started on version "
                    f"{header.task_version}; start a new run"
                )
            overrides: dict[str, Any] = {}
            if budgets is not None:
                if budgets.candidates_per_round != header.budgets.candidates_per_round:
                    raise RunRecordError(
                        f"the run asks {header.budgets.candidates_per_round} candidates per round; a resumed "
                        "run keeps that"
                    )
                header = header.model_copy(update={"budgets": budgets})
                writer.write_header(header)
                overrides["budgets"] = budgets
            config = AgentConfig.from_header(header, **overrides)
            return cls(task, provider, config, writer, header, attempts=reader.attempts(),
                       previous=reader.summary(), **kwargs)
        except BaseException:
            writer.close()
            raise

    @property
    def run_dir(self) -> Path:
        return self.writer.run_dir

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> RunSummary:
        """Rounds until the target or a budget; cancellation (Ctrl-C, SIGTERM) leaves an ``interrupted``
        summary. The run's writer is closed at the end, however it ends: another process may then resume
        it."""
        self._session_start = time.monotonic()
        own = self.executor is None
        preparing: asyncio.Future[None] | None = None
        self._executor = self.executor or LocalExecutor(cpu_workers=self.config.verify_workers,
                                                        verify_fn=self.verify_fn)
        try:
            self._summarise("running")  # a resumed run says so at once, not after its first attempt
            await self._time_human_kernel()
            preparing = asyncio.ensure_future(self._prepare_baselines())
            while True:
                stop = self._stop_reason()
                if stop is not None:
                    self._finish(*stop)
                    break
                round_no, slots = self._next_slots()
                await self._round(round_no, slots)
        except asyncio.CancelledError:
            self._finish("interrupted",
                         f"interrupted ({self.interrupted_by}); finished attempts are recorded")
            if own:
                self._executor.cancel()
            raise
        except FatalProviderError as exc:
            self._finish("failed", str(exc))
            raise
        except Exception as exc:  # a harness bug, not the model's: the summary says the run failed, and why
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            self._finish("failed",
                         storable(f"the run failed: {type(exc).__name__}" + (f": {first}" if first else "")))
            raise
        finally:
            if preparing is not None:  # a run over before its first profile leaves them unbuilt
                preparing.cancel()
                await asyncio.gather(preparing, return_exceptions=True)
            if own:
                self._executor.close()
            self.writer.close()
        return self.summary

    def _unfinished_slots(self) -> tuple[int, list[int]] | None:
        """On resume: the last round's slots that never finished (in flight when the process died)."""
        if not self.attempts:
            return None
        last = max(a.round for a in self.attempts)
        done = {a.slot for a in self.attempts if a.round == last}
        missing = [s for s in range(self.config.budgets.candidates_per_round) if s not in done]
        return (last, missing) if missing else None

    def _next_slots(self) -> tuple[int, list[int]]:
        if self._pending is not None:
            round_no, slots = self._pending
            self._pending = None
        else:
            round_no = max((a.round for a in self.attempts), default=0) + 1
            slots = list(range(self.config.budgets.candidates_per_round))
        return round_no, slots[: self._affordable(len(slots))]

    def spent_dollars(self) -> float:
        return self._spent()[1]

    def _spent(self) -> tuple[int, float]:
        tokens = sum(a.usage.input_tokens + a.usage.output_tokens for a in self.attempts)
        return tokens, sum(a.usage.cost_usd for a in self.attempts)

    def _affordable(self, wanted: int, *, tokens: bool = True, dollars: bool = True) -> int:
        """How many attempts the token and dollar budgets can still pay for, at the average cost so far."""
        b = self.config.budgets
        paid = [a for a in self.attempts if a.usage.input_tokens + a.usage.output_tokens > 0]
        if not paid:
            return wanted
        spent_tokens, spent_dollars = self._spent()
        n = wanted
        if tokens and b.max_tokens is not None and spent_tokens > 0:
            n = min(n, math.floor((b.max_tokens - spent_tokens) / (spent_tokens / len(paid))))
        if dollars and b.max_dollars is not None and spent_dollars > 0:
            n = min(n, math.floor((b.max_dollars - spent_dollars) / (spent_dollars / len(paid))))
        return max(n, 0)

    def elapsed(self) -> float:
        return self._prior_wall + (time.monotonic() - self._session_start)

    def _stop_reason(self) -> tuple[str, str] | None:
        b = self.config.budgets
        best = self.best()
        if best is not None and self.target_met(best):
            return "target_reached", f"target reached by attempt #{best.index}"
        if b.max_wall_seconds is not None and self.elapsed() >= b.max_wall_seconds:
            return "budget_exhausted", (f"wall-time budget spent ({self.elapsed():.0f} s of "
                                        f"{b.max_wall_seconds:g} s)")
        tokens, dollars = self._spent()
        if b.max_tokens is not None and tokens >= b.max_tokens:
            return "budget_exhausted", f"token budget spent ({tokens} of {b.max_tokens})"
        if b.max_dollars is not None and dollars >= b.max_dollars:
            return "budget_exhausted", f"dollar budget spent (${dollars:.4f} of ${b.max_dollars:g})"
        if self.shared is not None and self.shared.exhausted():
            return "budget_exhausted", (f"the sweep's dollar budget is spent (${self.shared.spent():.4f} of "
                                        f"${self.shared.max_dollars:g})")
        if self._pending is None and max((a.round for a in self.attempts), default=0) >= b.rounds:
            return "completed", f"all {b.rounds} rounds done" if b.rounds != 1 else "1 round done"
        slots = self._pending[1] if self._pending else list(range(b.candidates_per_round))
        if slots and self._affordable(len(slots)) == 0:
            which = "token" if self._affordable(1, dollars=False) == 0 else "dollar"
            return "budget_exhausted", (f"{which} budget: the next attempt would exceed it (at the average "
                                        "cost so far)")
        return None

    def speed_goals(self) -> dict[str, float]:
        """The header target's speed ratios (``speedup_vs_human``, ``speedup_vs_cublas``,
        ``sol_fraction``)."""
        return {k: float(v) for k, v in self.header.target.items() if k != "correct"}

    def target_met(self, best: Attempt) -> bool:
        """Correct, and (when timed) any speed goal of the target reached; a goal whose ratio the timing lacks
        (no cuBLAS baseline, no human timing) is not reached, so the run goes on to its budget. Untimed, the
        estimate's goal where the target has one (a candidate the build could not price does not reach it)."""
        if not best.passed:
            return False
        goals = self.speed_goals()
        if not self.config.timed:
            goal = goals.get(ESTIMATE_GOAL)
            reached = estimate_sol_fraction(best)
            return goal is None or (reached is not None and reached >= goal)
        if not goals:
            return bool(best.timing)
        return any(key in best.timing and best.timing[key] >= goal for key, goal in goals.items())

    def best(self) -> Attempt | None:
        return best_attempt(self.attempts)

    # --- prompts --------------------------------------------------------------------------------

    def task_message(self) -> str:
        return task_message(self.task, self.config, self.peaks, self.speed_goals(),
                            self.header.human_timing or None)

    def messages_for(self, round_no: int, slot: int = 0) -> list[ChatMessage]:
        """The chat candidate ``slot`` of ``round_no`` receives: built only from earlier rounds' attempts."""
        earlier = [a for a in self.attempts if a.round < round_no]
        return build_messages(
            self.system, self.task_message(), earlier,
            population=population(earlier, self.config.population_size), goal_is_speed=self.config.timed,
            goals=self.speed_goals(), slot=slot, slots=self.config.budgets.candidates_per_round,
        )

    # --- one round, one attempt -----------------------------------------------------------------

    async def _time_human_kernel(self) -> None:
        """On the GPU, time the human kernel once with the same stages, so speedups compare like with like."""
        human = self.task.human_file
        if not self.config.timed or self.header.human_timing or human is None or not human.exists():
            return
        self.events.note("timing the human kernel (the speed reference for this run)")
        verdict = await self._verify(human.read_text())
        times = human_times(timing_from_verdict(verdict)) if verdict.passed else {}
        if not times:
            self.events.note(f"the human kernel could not be timed ({verdict.outcome.value}); speeds are "
                             "measured against cuBLAS alone")
            if "speedup_vs_human" in self.header.target:
                target = {("speedup_vs_cublas" if k == "speedup_vs_human"
                           else k): v for k, v in self.header.target.items()}
                self.header = self.header.model_copy(update={"target": target})
                self.writer.write_header(self.header)
            return
        self.header = self.header.model_copy(update={"human_timing": times})
        self.writer.write_header(self.header)

    async def _prepare_baselines(self) -> None:
        """On the GPU, for a task with no human kernel, build and run its baselines at every bench shape once
        (torch.compile's graphs, cuBLAS's layouts), beside the first model call, as timing a human kernel
        does where there is one. Each is a cost of the task, not of the first correct candidate's profile:
        6.2-6.4 s of it at two acceptance tasks (H100, bench/results/h100-2026-12-05-e-notes.md). Where it
        fails, the profile stage builds them itself."""
        human = self.task.human_file
        if not self.config.timed or (human is not None and human.exists()):
            return
        self.events.note("building the baselines at every bench shape beside the first model call (this task "
                         "has no human kernel to time)")
        t0 = time.monotonic()
        verdict = await self._verify(NO_CANDIDATE, plan=baselines_plan(self.config.plan), label="baselines")
        if verdict.passed:
            self.events.note(f"the baselines are built ({time.monotonic() - t0:.1f} s)")
        else:
            self.events.note(f"the baselines could not be built ahead ({verdict.outcome.value}); each "
                             "candidate's profile builds them")

    async def _round(self, round_no: int, slots: list[int]) -> None:
        self.events.round_started(round_no, len(slots))
        # Tasks start in slot order, so each provider call is made in (round, slot) order (replay relies on
        # it).
        tasks = [asyncio.create_task(self._attempt(round_no, slot,
                                                   self.messages_for(round_no, slot))) for slot in slots]
        wall = self.config.budgets.max_wall_seconds
        timeout = None if wall is None else max(0.0, wall - self.elapsed())
        try:
            done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            exc = t.exception()
            if exc is not None:
                raise exc
        if pending:
            self.events.note(f"wall-time budget reached: {len(pending)} attempt(s) in flight were abandoned")

    async def _verify(self, code: str, index: int | None = None, plan: Plan | None = None,
                      label: str = "human") -> Verdict:
        """One verification on the executor (under ``plan``, the run's by default); ``index`` is the
        attempt's, told where it runs, else ``label`` names the job. A plan of the harness's own has its GPU
        to itself."""
        assert self._executor is not None
        job = Job(self.task, code, plan or self.config.plan, alone=plan is not None,
                  label=f"#{index}" if index is not None else label)
        loop = asyncio.get_running_loop()

        def placed(worker: str) -> None:
            if index is not None:
                loop.call_soon_threadsafe(self.events.attempt_placed, index, worker)

        return await asyncio.wrap_future(self._executor.submit(job, on_start=placed))

    async def _attempt(self, round_no: int, slot: int, messages: list[ChatMessage]) -> None:
        index = (round_no - 1) * self.config.budgets.candidates_per_round + slot + 1
        started = _now()
        self.events.attempt_started(index, round_no, slot)
        t0 = time.monotonic()
        try:
            completion: Completion = await self.provider.complete(
                messages, max_tokens=self.config.max_reply_tokens, temperature=self.config.temperature
            )
        except ProviderError as exc:
            if exc.kind.fatal:
                message = (
                    str(exc) if str(exc).startswith(self.config.model) else f"{self.config.model}: {exc}"
                )
                raise FatalProviderError(message) from None
            self._record(Attempt(
                index=index, round=round_no, slot=slot, started=started, finished=_now(), messages=messages,
                provider_error=storable(f"{exc.kind.value}: {exc}"),
                durations={"llm": round(time.monotonic() - t0, 3)},
            ))
            return
        llm_s = time.monotonic() - t0
        usage = Usage(
            input_tokens=completion.input_tokens, output_tokens=completion.output_tokens,
            cost_usd=completion.cost_usd, price_known=completion.price_known,
        )
        reply, extraction = await asyncio.get_running_loop().run_in_executor(_REPLY_READER, read_reply,
                                                                             completion.text)
        verdict, timing, durations = None, {}, {"llm": round(llm_s, 3)}
        if extraction.code is not None:
            self.events.attempt_phase(index, "verifying")
            t1 = time.monotonic()
            verdict = await self._verify(extraction.code, index)
            durations["verify"] = round(time.monotonic() - t1, 3)
            if verdict.passed:
                timing = self._timing(verdict)
        tuning = None
        if verdict is not None and timing and self.tune_fn is not None and extraction.code is not None:
            self.events.attempt_phase(index, "tuning")
            t2 = time.monotonic()
            tuning = await self._tune(extraction.code, verdict, timing)
            durations["tune"] = round(time.monotonic() - t2, 3)
            if tuning is not None and tuning.adopted and tuning.verdict is not None:
                timing = self._timing(tuning.verdict)
        self._record(Attempt(
            index=index, round=round_no, slot=slot, started=started, finished=_now(), messages=messages,
            raw_response=reply, finish_reason=storable(completion.finish_reason), code=extraction.code,
            extraction_error=extraction.error, verdict=verdict, usage=usage, durations=durations,
            timing=timing, tuning=tuning,
        ))

    def _timing(self, verdict: Verdict) -> dict[str, Any]:
        return timing_from_verdict(verdict, self.header.human_timing, {p.shape: p for p in self.sol})

    def _tune_on_executor(self, task: Task, code: str, verdict: Verdict) -> Tuned | None:
        """The default tuner: the schedule search as a timed job on the run's executor (its GPU to itself)."""
        assert self._executor is not None
        budget_s = self.config.tune_budget_s or DEFAULT_TUNE_BUDGET_S
        plan = tune_plan(shape_set=self.config.plan.shape_set, budget_s=budget_s)
        job = Job(task, code, plan, label="tune")
        return pinned_source(code, self._executor.submit(job).result()) if verdict.passed else None

    async def _tune(self, code: str, verdict: Verdict, timing: dict[str, Any]) -> Tuning | None:
        """Let the harness pin the candidate's configs, then verify and time the result like any candidate;
        adopted when correct and faster (geomean over the shapes)."""
        assert self.tune_fn is not None
        try:
            tuned = await asyncio.to_thread(self.tune_fn, self.task, code, verdict)
        except Exception as exc:  # the tuner failed: the candidate stands as the model wrote it
            self.events.note(f"tuning failed: {type(exc).__name__}: {exc}")
            return None
        if tuned is None:
            return None
        if tuned.builds:
            self.events.note(f"tuning: {build_line(tuned.builds)}")
        if tuned.source is None or tuned.source == code:
            if tuned.search:
                tried = sum(len(c.tried_us) for s in tuned.search.values() for c in s.calls)
                untried = sum(c.untried for s in tuned.search.values() for c in s.calls)
                left = f" ({untried} left untried: the budget ended first)" if untried else ""
                self.events.note(f"tuning: {tried} configs tried{left}, none beat the configs as written")
            return Tuning(before=timing, search=tuned.search, stage=tuned.stage)
        tuned_verdict = await self._verify(tuned.source, label="tuned")
        after = self._timing(tuned_verdict) if tuned_verdict.passed else {}
        faster = bool(after) and (after.get("geomean_us") or math.inf) < (timing.get("geomean_us")
                                                                          or math.inf)
        return Tuning(code=tuned.source, verdict=tuned_verdict, adopted=faster, before=timing,
                      search=tuned.search, stage=tuned.stage)

    # --- records --------------------------------------------------------------------------------

    def _record(self, attempt: Attempt) -> None:
        """Write the attempt, then the best candidate and the summary (each file atomically)."""
        self.writer.write_attempt(attempt)
        if (
            not attempt.usage.price_known
            and self.config.budgets.max_dollars is not None
            and not self._warned_price
        ):
            self._warned_price = True
            self.events.note(
                f"{self.config.model} has no known price, so its cost counts as $0 and the dollar budget "
                "cannot bite (add it to a CODA_AGENT_PRICES file)"
            )
        self.attempts = sorted([*(a for a in self.attempts if a.index != attempt.index), attempt],
                               key=lambda a: a.index)
        best = self.best()
        if best is not None and best.index != self._best_written and best.shipped_code is not None:
            self.writer.write_best(best.shipped_code)
            self._best_written = best.index
        if attempt.passed and self.summary.seconds_to_first_correct is None:
            self.summary.seconds_to_first_correct = round(self.elapsed(), 3)
        self._summarise("running")
        self.events.attempt_finished(attempt, self.summary)

    def _summarise(self, status: str, stop_reason: str = "") -> None:
        progress = {"status": status, "stop_reason": stop_reason, "wall_seconds": round(self.elapsed(), 3),
                    "updated": _now()}
        self.summary = rolled_up(self.summary.model_copy(update=progress), self.attempts)
        self.writer.write_summary(self.summary)

    def _finish(self, status: str, stop_reason: str) -> None:
        self._summarise(status, stop_reason)
        self.events.run_finished(self.summary)
