"""Sweeps: several tasks (or folders of them) and several models in one ``coda-agent run``.

Every task runs with every model under the same options and per-run budgets, ``--jobs`` runs at a time, their
verifications on one executor (this host, or a Ray cluster: ``--executor ray``), which keeps timings apart.
The runs are ordinary run directories; ``<runs-dir>/<sweep-id>.sweep.json`` lists them, so ``--resume``
on it starts the runs not started yet, resumes the interrupted ones and leaves the finished ones be. One
process runs a sweep at a time: it holds ``<sweep-id>.sweep.lock`` (as each of its runs holds the run's own
lock), so a second ``--resume`` of a live sweep is refused instead of starting its runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError
from rich import box
from rich.table import Table
from rich.text import Text

from ..agent import Agent, AgentConfig, FatalProviderError, RunEvents, SharedBudget
from ..execute import Executor
from ..providers import Provider, ProviderConfigError, lookup
from ..store.records import Attempt, RunSummary, SweepMember, SweepRecord, run_status, write_json_atomic
from ..store.rundir import RunReader, RunRecordError, resume_command
from ..store.writer_lock import WriterBusy, WriterLock
from ..tasks.loader import TaskError, find_task, load_task, task_files
from ..tasks.model import Task
from ..untrusted import shown
from .core import TONE_STYLE, UserError, console, err_console, print_table, untrusted
from .inputs import NO_MODEL, check_task_runs, note_skipped
from .run_cmd import (
    STOP_SIGNALS,
    RunOptions,
    _closed_on_error,
    attempt_line,
    ended_summary,
    make_provider,
    money_text,
    new_run,
    one_line_failure,
    open_workers,
    outliving_a_closed_stdout,
    resume_run,
    speed_text,
    tokens_text,
)

SWEEP_SUFFIX = ".sweep.json"
LOCK_SUFFIX = ".sweep.lock"
#: A run in one of these states is not started again when its sweep is resumed.
FINISHED = ("target_reached", "budget_exhausted", "completed", "failed")
#: ``--executor`` and ``--address``, as given.
WorkersSpec = tuple[str, "str | None"]


def cpu_workers(jobs: int, runs: int, cpus: int | None = None) -> int:
    """CPU verifications at once for a sweep: as many as its runs in flight would have on their own
    (``--jobs`` of them, never more than there are runs to make), and never more than this machine has
    cores."""
    cores = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(min(jobs, max(runs, 1)) * AgentConfig.verify_workers, cores))


def _open(spec: WorkersSpec, jobs: int, runs: int) -> Executor:
    """One executor for the whole sweep of ``runs`` runs (see :func:`cpu_workers`)."""
    kind, address = spec
    return open_workers(kind, address, cpu_workers=cpu_workers(jobs, runs))


def sweep_file(ref: str, base: Path) -> Path | None:
    """The sweep file named by a path, a sweep id or a unique prefix of one; None when ``ref`` names none."""
    for candidate in (Path(ref), base / ref, base / f"{ref}{SWEEP_SUFFIX}"):
        if candidate.name.endswith(SWEEP_SUFFIX) and candidate.is_file():
            return candidate
    if Path(ref).name != ref or not base.is_dir():  # a path (a run's, say) is no prefix of a sweep id
        return None
    matches = sorted(base.glob(f"{ref}*{SWEEP_SUFFIX}"))
    return matches[0] if len(matches) == 1 else None


def is_sweep(ref: str, base: Path) -> bool:
    return sweep_file(ref, base) is not None


def hold_sweep(path: Path) -> WriterLock:
    """The sweep's writer lock, beside its file; one line (UserError) naming the process that runs it now."""
    sweep_id = path.name.removesuffix(SWEEP_SUFFIX)
    try:
        return WriterLock.acquire(path.with_name(sweep_id + LOCK_SUFFIX), f"sweep {sweep_id}")
    except WriterBusy as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot lock the sweep record {path}: {exc}") from None


def _tasks(refs: list[str]) -> list[Task]:
    """Task names, files and folders, each task once (in the order given), each checked to run."""
    found: dict[Path, Task] = {}
    for ref in refs:
        if Path(ref).is_dir():
            skipped: list[str] = []
            files = task_files([ref], skipped)
            note_skipped(skipped)
            if not files:
                raise UserError(f"{ref}: no task files (*.yaml) in this folder")
            loaded = [load_task(f) for f in files]
        else:
            loaded = [find_task(ref)]
        for t in loaded:
            found.setdefault(t.path, t)
    for t in found.values():
        check_task_runs(t)
    return list(found.values())


def start_sweep(
    tasks: list[str], models: list[str], options: RunOptions, base: Path, jobs: int,
    total_dollars: float | None, workers: WorkersSpec = ("local", None),
) -> int:
    """Check everything (tasks, model specs and keys, options), record the sweep, run it; the exit status."""
    if not models:
        raise UserError(NO_MODEL)
    if not tasks:
        raise UserError("which tasks? pass task names, YAML paths or folders (see `coda-agent tasks`)")
    for m in dict.fromkeys(models):
        try:
            replays = lookup(m).replays_a_run
        except ProviderConfigError as exc:
            raise UserError(str(exc)) from None
        if replays:
            raise UserError(f"{m} replays one run's replies on its own task: it cannot be part of a sweep")
    selected = _tasks(tasks)
    # a missing key or no sandbox, for every model that has one, before any run starts
    problems: dict[str, None] = {}
    for m in dict.fromkeys(models):
        try:
            make_provider(m, options.base_url, base)
        except UserError as exc:
            problems.setdefault(str(exc))
    if len(problems) > 1:
        raise UserError(f"{len(problems)} problems before the sweep can start:\n"
                        + "\n".join(f"  - {p}" for p in problems))
    if problems:
        raise UserError(next(iter(problems)))
    options.config(selected[0], models[0])  # bad seeds or time limit: one line likewise
    # no Ray, or its cluster unreachable
    executor = _open(workers, jobs, len(selected) * len(dict.fromkeys(models)))
    now = datetime.now(timezone.utc)
    record = SweepRecord(
        sweep_id=f"sweep_{now.astimezone():%Y%m%d-%H%M%S}_{secrets.token_hex(3)}", created=now,
        options=options.model_dump(), total_dollars=total_dollars,
        members=[SweepMember(task=str(t.path), model=m) for t in selected for m in dict.fromkeys(models)],
    )
    path = base / f"{record.sweep_id}{SWEEP_SUFFIX}"
    with _closed_on_error(executor):
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot write the sweep record under {base}: {exc}") from None
        lock = hold_sweep(path)  # before its file exists: nobody resumes it while this process runs it
        try:
            write_json_atomic(path, record)
        except OSError as exc:
            lock.release()
            raise UserError(f"cannot write the sweep record under {base}: {exc}") from None
    console.print(
        f"sweep [bold]{record.sweep_id}[/]: {len(selected)} task(s) × {len(set(models))} model(s) = "
        f"{len(record.members)} run{'s' if len(record.members) != 1 else ''}, {jobs} at a time",
        highlight=False,
    )
    console.print(f"  record: {path}", highlight=False, markup=False)
    with outliving_a_closed_stdout(path), lock:
        return _Session(record, path, base, jobs, executor).run()


#: The options a resumed sweep may change, as ``run --resume RUN --rounds N`` extends one run.
EXTENSIBLE = ("rounds", "max_tokens_total", "max_dollars", "max_wall")


def resume_sweep(
    ref: str, base: Path, given: RunOptions, jobs: int, redo_corrupt: bool, total_dollars: float | None,
    workers: WorkersSpec = ("local", None),
) -> int:
    """Continue a sweep with the options it was started with; budgets given now extend every run."""
    path = sweep_file(ref, base)
    assert path is not None
    base = path.parent  # the sweep's runs sit beside its file, wherever --runs-dir points now
    record = _read_record(path)
    changed = given.model_dump(exclude_defaults=True)
    fixed = sorted(set(changed) - set(EXTENSIBLE))
    if fixed:
        raise UserError(f"a resumed sweep keeps its settings; only budgets ({', '.join(EXTENSIBLE)}) may "
                        f"change, not {', '.join(fixed)}")
    if not changed and total_dollars is None:
        ended = _ended(record, base)
        if ended is not None:
            console.print(f"sweep [bold]{record.sweep_id}[/] already finished: nothing to resume",
                          highlight=False)
            return report(record, path, base, ended)
    with hold_sweep(path):
        record = _read_record(path)  # again, as the process that ran it last left it
        executor = _open(workers, jobs, len(record.members))
        if total_dollars is not None:
            record.total_dollars = total_dollars
        if changed or total_dollars is not None:
            record.options.update(changed)
            write_json_atomic(path, record)
        done = sum(1 for m in record.members if m.run is not None)
        console.print(f"resuming sweep [bold]{record.sweep_id}[/]: {done} of {len(record.members)} runs "
                      "started before", highlight=False)
        with outliving_a_closed_stdout(path):
            return _Session(record, path, base, jobs, executor, redo_corrupt,
                            extended=bool(changed) or total_dollars is not None).run()


def _read_record(path: Path) -> SweepRecord:
    try:
        return SweepRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError) as exc:
        raise UserError(f"{path}: unreadable sweep record ({str(exc).splitlines()[0]})") from None


def _ended(record: SweepRecord, base: Path) -> list[_Outcome] | None:
    """Every member's outcome when each run has ended as ``run --resume`` would leave it (:data:`ENDED`, no
    attempt lost since); None when any has something left to do."""
    outcomes = []
    for member in record.members:
        if member.run is None:
            return None
        try:
            summary = ended_summary(RunReader(base / member.run))
        except RunRecordError:
            return None
        if summary is None:
            return None
        outcomes.append(_Outcome(member, summary))
    return outcomes


@dataclass
class _Outcome:
    """How one member ended in this session (or before it)."""

    member: SweepMember
    summary: RunSummary | None = None
    error: str = ""
    # when an error ended it, the exit status `run` gives: 2 set-up or provider, 1 the harness
    failed: int = 0

    @property
    def exit_status(self) -> int:
        """What ``coda-agent run`` gives this run alone: 0 a correct kernel, 1 none (or the harness failed), 2
        a set-up or provider error."""
        return self.failed or (0 if self.summary is not None and self.summary.best_attempt is not None else 1)


class _Lines(RunEvents):
    """One plain line per finished attempt, prefixed with the run's task and model, saying where it was
    verified."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.placed: dict[int, str] = {}

    def attempt_placed(self, index: int, worker: str) -> None:
        self.placed[index] = worker

    def note(self, message: str) -> None:
        console.print(Text(f"[{self.label}] {shown(message)}", style="dim italic"), highlight=False)

    def attempt_finished(self, attempt: Attempt, summary: RunSummary) -> None:
        line = Text(f"[{self.label}] ", style="bold")
        line.append_text(attempt_line(attempt, self.placed.pop(attempt.index, None)))
        console.print(line, highlight=False)


def _label(member: SweepMember) -> str:
    return f"{task_name(member.task)} · {member.model}"


@functools.cache
def task_name(task_file: str) -> str:
    """A member's task by its ``name:``, as ``tasks``, the run and the leaderboard call it (its file may be
    named otherwise); the file's stem when the file no longer loads."""
    try:
        return load_task(Path(task_file)).name
    except (TaskError, OSError):
        return Path(task_file).stem


@dataclass
class _Session:
    """One process's go at a sweep: which members to (re)start, ``jobs`` at a time, and the agents in
    flight."""

    record: SweepRecord
    path: Path
    base: Path
    jobs: int
    workers: Executor
    redo_corrupt: bool = False
    extended: bool = False  # budgets were raised: runs that stopped on a budget or their rounds go on
    agents: list[Agent] = field(default_factory=list)
    shared: SharedBudget | None = None

    def __post_init__(self) -> None:
        if self.record.total_dollars is not None:
            self.shared = SharedBudget(self.record.total_dollars)

    def settled(self, summary: RunSummary | None) -> bool:
        """A run not to touch again: finished, unless it stopped on budgets that were raised since."""
        if summary is None or summary.status not in FINISHED:
            return False
        return not (self.extended and summary.status in ("completed", "budget_exhausted"))

    async def member(self, member: SweepMember, slots: asyncio.Semaphore) -> _Outcome:
        async with slots:
            options = RunOptions(**self.record.options)
            provider: Provider
            try:
                if member.run is None and self.shared is not None and self.shared.exhausted():
                    return _Outcome(member,
                                    error=f"not started: the sweep's ${self.shared.max_dollars:g} are spent")
                if member.run is None:
                    provider = make_provider(member.model, options.base_url, self.base)
                    agent = new_run(load_task(member.task), member.model, provider, self.base, options)
                    member.run = agent.run_dir.name
                    write_json_atomic(self.path, self.record)
                else:
                    summary = RunReader(self.base / member.run).summary()
                    if self.settled(summary):
                        return _Outcome(member, summary)
                    _, agent, provider = resume_run(
                        str(self.base / member.run), self.base, member.model, None, options.budget_flags(),
                        None, self.redo_corrupt,
                    )
            except (UserError, TaskError, RunRecordError) as exc:
                return _Outcome(member, error=str(exc), failed=2)
            except Exception as exc:  # starting this run failed in a way nobody foresaw: the others still run
                return _Outcome(member, error=one_line_failure(exc), failed=1)
            agent.events, agent.executor = _Lines(_label(member)), self.workers
            self.agents.append(agent)
            if self.shared is not None:
                agent.shared = self.shared
                self.shared.agents.append(agent)
            try:
                return _Outcome(member, await agent.run())
            except FatalProviderError as exc:
                return _Outcome(member, agent.summary, error=str(exc), failed=2)
            # whatever one run does, the sweep's other runs go on; this one is a failure
            except Exception as exc:
                return _Outcome(member, agent.summary, error=one_line_failure(exc), failed=1)
            finally:
                await provider.aclose()

    async def all_members(self, received: list[signal.Signals]) -> list[_Outcome]:
        """Every member, ``jobs`` at a time; SIGINT/SIGTERM interrupt them all (each summary says so)."""
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        assert main is not None

        def stop(sig: signal.Signals) -> None:
            received.append(sig)
            for a in self.agents:
                a.interrupted_by = "Ctrl-C" if sig == signal.SIGINT else sig.name
            main.cancel()
            self.workers.cancel()

        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop, sig)
        slots = asyncio.Semaphore(self.jobs)
        try:
            return list(await asyncio.gather(*(self.member(m, slots) for m in self.record.members)))
        finally:
            for sig in STOP_SIGNALS:
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)

    def run(self) -> int:
        """Run it to the end (or a signal) and print the table; the exit status."""
        with self.workers:
            return self._run()

    def _run(self) -> int:
        console.print(f"  verifying on {self.workers.describe()}", highlight=False, markup=False)
        if self.shared is not None:  # what the runs left alone spent counts, too
            for m in self.record.members:
                with contextlib.suppress(RunRecordError):
                    summary = RunReader(self.base / m.run).summary() if m.run else None
                    if summary is not None and self.settled(summary):
                        self.shared.already_spent += summary.cost_usd
        received: list[signal.Signals] = []
        try:
            outcomes = asyncio.run(self.all_members(received))
        except (asyncio.CancelledError, KeyboardInterrupt):
            err_console.print(
                f"interrupted; finished attempts are saved. Resume with: {resume_command(self.path)}",
                highlight=False, markup=False,
            )
            return STOP_SIGNALS[received[0]] if received else 130
        return report(self.record, self.path, self.base, outcomes)


def report(record: SweepRecord, path: Path, base: Path, outcomes: list[_Outcome]) -> int:
    """A sweep's end: its table, each run's record, the errors, the closing line; the worst run's exit
    status."""
    print_table(summary_table(record, outcomes))
    for line in run_lines(base, outcomes):
        console.print(line, highlight=False)
    for o in outcomes:
        if o.error:
            kind = "[bold red]error:[/]" if o.failed else "note:"
            err_console.print(f"{kind} {untrusted(f'[{_label(o.member)}]')} {untrusted(o.error)}",
                              highlight=False)
    console.print(f"  record: {path}", highlight=False, markup=False)
    console.print(closing_line(outcomes), highlight=False)
    return max(o.exit_status for o in outcomes)


def closing_line(outcomes: list[_Outcome]) -> str:
    """The sweep's verdict, as ``run`` ends with its own: how many runs found a correct kernel, and what
    became of the others (none found, failed, not started)."""
    n = len(outcomes)
    correct = sum(o.exit_status == 0 for o in outcomes)
    others = {
        "found none": sum(not o.error and o.exit_status == 1 for o in outcomes),
        "failed": sum(bool(o.failed) for o in outcomes),
        "not started": sum(bool(o.error) and not o.failed for o in outcomes),
    }
    if correct == n:
        return f"[bold green]PASSED[/] {'the run' if n == 1 else f'all {n} runs'} found a correct kernel"
    rest = ", ".join(f"{v} {k}" for k, v in others.items() if v)
    return f"[bold red]FAILED[/] {correct} of {n} run{'s' if n != 1 else ''} found a correct kernel; {rest}"


def summary_table(record: SweepRecord, outcomes: list[_Outcome]) -> Table:
    """One row per run: status, best, attempts, tokens, cost (where its record is: :func:`run_lines`)."""
    table = Table(title=f"sweep {record.sweep_id}", title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD)
    # names and figures whole; the status and the speeds at spaces
    for col in ("task", "model", "status", "best"):
        table.add_column(col, no_wrap=col in ("task", "model"), min_width=17 if col == "status" else None)
    for col in ("attempts", "tokens", "$"):
        table.add_column(col, justify="right", no_wrap=True)
    for o in outcomes:
        s = o.summary
        if s is None:
            status = "[red]error[/]" if o.failed else "not started"
            table.add_row(untrusted(task_name(o.member.task)), untrusted(o.member.model), status, "-", "-",
                          "-", "-")
            continue
        best = f"#{s.best_attempt}" + (f" ({speed_text(s)})" if speed_text(s)
                                       else "") if s.best_attempt else "-"
        label, tone = run_status(s.status, s.passes)
        table.add_row(
            untrusted(task_name(o.member.task)), untrusted(o.member.model),
            f"[{TONE_STYLE[tone]}]{untrusted(label)}[/]", best, str(s.attempts),
            tokens_text(s.input_tokens + s.output_tokens), money_text(s.cost_usd, s.cost_known),
        )
    return table


def run_lines(base: Path, outcomes: list[_Outcome]) -> list[Text]:
    """Where each run's record is, a line each (paths are never cut, as they would be in a table's cell)."""
    return [Text(f"  run [{_label(o.member)}]: {shown(str(base / o.member.run))}") for o in outcomes
            if o.member.run]
