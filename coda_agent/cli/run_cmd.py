"""``coda-agent run``'s machinery (the command itself: :mod:`.run_command`): the agent loop on one task, with
a live progress display and a run record; :mod:`.sweep` runs several with it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import typer
from pydantic import BaseModel
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..agent import Agent, AgentConfig, FatalProviderError, RunEvents
from ..execute import Executor, ExecutorError, open_executor
from ..prompts.feedback import attempt_headline
from ..providers import Provider, ProviderError, get_provider, lookup
from ..stdout import ReaderGone
from ..store.records import Attempt, Budgets, RunHeader, RunSummary, run_status
from ..store.rundir import RunReader, RunRecordError, RunWriter, resolve_run, resume_command
from ..tasks.model import Task
from ..untrusted import shown
from ..verifier import DEFAULT_TUNE_BUDGET_S
from ..verifier.sandbox import UNSANDBOXED_OPT_IN, SandboxUnavailable, require_isolation
from ..verifier.verdict import Outcome
from .core import UserError, console, err_console, outcome_style, refuse_without_runners, untrusted
from .inputs import check_fits_device, check_task_runs, default_timeout, seed_list, timeout_value


def tokens_text(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def money_text(cost: float, known: bool) -> str:
    """A run's cost so far; "unpriced" for a model missing from the price table (its $0 means unknown)."""
    return f"${cost:.4f}" if known else "unpriced"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def speed_text(summary: RunSummary) -> str:
    parts = []
    if summary.speedup_vs_human is not None:
        parts.append(f"{summary.speedup_vs_human:.2f}x human")
    if summary.speedup_vs_cublas is not None:
        parts.append(f"{summary.speedup_vs_cublas:.2f}x cuBLAS")
    if summary.sol_fraction is not None:
        parts.append(f"{100 * summary.sol_fraction:.0f}% SoL")
    if summary.best_time_us is not None and not parts:
        parts.append(f"{summary.best_time_us:.1f} µs")
    if summary.estimate_sol_fraction is not None and not parts:
        parts.append(f"{100 * summary.estimate_sol_fraction:.0f}% SoL by the CPU's cost estimate")
    return ", ".join(parts)


def _best_text(summary: RunSummary) -> str:
    if summary.best_attempt is None:
        return "none correct yet"
    speed = speed_text(summary)
    return f"#{summary.best_attempt} correct" + (f", {speed}" if speed else "")


#: The outcome's column: the longest outcome and two spaces, so a reason never runs into it.
_OUTCOME_WIDTH = max(len(o.value) for o in Outcome) + 2


def attempt_line(attempt: Attempt, worker: str | None = None) -> Text:
    """``#3  r3.0  passed  correct  · llm 1.2 s · verify 9.8 s on gpu1 · 8.7k tok`` (``worker``: where it was
    verified)."""
    outcome = attempt.outcome
    line = Text(f"#{attempt.index:<3} r{attempt.round}.{attempt.slot}  ")
    line.append(f"{outcome:<{_OUTCOME_WIDTH}}", style=outcome_style(outcome))
    # cut at a word, marked (an over-budget reason ended "operand copies: 6; ho")
    line.append(textwrap.shorten((shown(attempt_headline(attempt)).splitlines() or [""])[0], 160,
                                 placeholder=" …"))
    bits = [f"{k} {v:.1f} s"
            + (f" on {worker}" if k == "verify" and worker else "") for k, v in attempt.durations.items()]
    tokens = attempt.usage.input_tokens + attempt.usage.output_tokens
    if tokens:
        bits.append(f"{tokens_text(tokens)} tok")
    if attempt.usage.cost_usd or not attempt.usage.price_known:
        bits.append(money_text(attempt.usage.cost_usd, attempt.usage.price_known))
    line.append("  · " + " · ".join(bits), style="dim")
    return line


class _Display(RunEvents):
    """Shared bookkeeping of the two displays: what is in flight, and the latest summary."""

    def __init__(self, out: Console, header: RunHeader, rounds: int) -> None:
        self.out, self.header, self.rounds = out, header, rounds
        self.summary = RunSummary()
        self.round_no = 0
        self.in_flight: dict[int, str] = {}
        self.placed: dict[int, str] = {}
        self.t0 = time.monotonic()
        self.prior_wall = 0.0

    def round_started(self, round_no: int, slots: int) -> None:
        self.round_no = round_no
        self.line(Text(f"round {round_no}/{self.rounds}: asking for {slots} "
                       f"candidate{'s' if slots != 1 else ''}", style="bold"))

    def attempt_started(self, index: int, round_no: int, slot: int) -> None:
        self.in_flight[index] = "waiting for the model"

    def attempt_phase(self, index: int, phase: str) -> None:
        self.in_flight[index] = phase

    def attempt_placed(self, index: int, worker: str) -> None:
        self.in_flight[index] = f"verifying on {worker}"
        self.placed[index] = worker

    def attempt_finished(self, attempt: Attempt, summary: RunSummary) -> None:
        self.in_flight.pop(attempt.index, None)
        self.summary = summary
        self.line(attempt_line(attempt, self.placed.pop(attempt.index, None)))

    def note(self, message: str) -> None:
        self.line(Text(shown(message), style="dim italic"))

    def line(self, text: Text) -> None:
        self.out.print(text, highlight=False)

    def status(self) -> Text:
        s = self.summary
        wall = self.prior_wall + time.monotonic() - self.t0
        text = Text()
        text.append(f"round {self.round_no}/{self.rounds}", style="bold")
        text.append(f" · attempts {s.attempts}")
        if self.in_flight:
            text.append(f" (+{len(self.in_flight)} running)", style="cyan")
        text.append(" · passes ")
        text.append(str(s.passes), style="green" if s.passes else "")
        text.append(" · best ")
        text.append(_best_text(s), style="green" if s.best_attempt else "dim")
        text.append(f" · tokens {tokens_text(s.input_tokens + s.output_tokens)} · "
                    f"{money_text(s.cost_usd, s.cost_known)} · {_clock(wall)}")
        return text


class PlainDisplay(_Display):
    """One line per event, no cursor tricks: for CI logs and pipes."""

    def attempt_finished(self, attempt: Attempt, summary: RunSummary) -> None:
        super().attempt_finished(attempt, summary)
        self.line(Text("  " + self.status().plain, style="dim"))


class LiveDisplay(_Display):
    """A rich live status block under the scrolling attempt log."""

    def __init__(self, out: Console, header: RunHeader, rounds: int, workers: Executor | None = None) -> None:
        super().__init__(out, header, rounds)
        self.workers = workers
        self.live = Live(console=out, refresh_per_second=4, get_renderable=self.render, transient=True)

    def render(self) -> Group:
        grid = Table.grid(padding=(0, 2))
        for index, phase in sorted(self.in_flight.items()):
            grid.add_row(Text(f"#{index}", style="cyan"), Text(phase + "…", style="dim"))
        rows: list[RenderableType] = [Text("─" * min(self.out.width, 100), style="dim"), self.status(), grid]
        if self.workers is not None:
            rows.append(Text(f"workers: {self.workers.activity()}", style="dim"))
        return Group(*rows)

    def line(self, text: Text) -> None:
        (self.live.console if self.live.is_started else self.out).print(text, highlight=False)


def make_provider(model: str, base_url: str | None, runs_dir: Path) -> Provider:
    """The provider for ``model``; one that runs a real model's candidates first needs the OS sandbox (and any
    model a runner it may start)."""
    refuse_without_runners()
    try:
        if lookup(model).real_model:
            box = require_isolation(f"an agent run with {model}")
            if not box.isolated:
                err_console.print(f"[bold red]warning:[/] {box.describe()} ({UNSANDBOXED_OPT_IN} is set)")
        return get_provider(model, base_url=base_url, runs_dir=runs_dir)
    except (ProviderError, SandboxUnavailable) as exc:  # a bad spec, option or missing key; no sandbox
        raise UserError(str(exc)) from None


def _budgets(base: Budgets, **given: Any) -> Budgets:
    return base.model_copy(update={k: v for k, v in given.items() if v is not None})


#: The signals that stop a run cleanly (summary marked interrupted), and the exit status each gives.
STOP_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}


async def _drive(agent: Agent, provider: Provider, received: list[signal.Signals],
                 workers: Executor) -> RunSummary:
    """Run the agent; SIGINT (Ctrl-C) or SIGTERM (``timeout``, ``kill``) cancels it cleanly: the summary is
    marked interrupted before we exit. The signal is appended to ``received``."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(sig: signal.Signals) -> None:
        received.append(sig)
        agent.interrupted_by = "Ctrl-C" if sig == signal.SIGINT else sig.name
        task.cancel()
        workers.cancel()  # verifications in flight return at once instead of running to their time limit

    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError):  # not on Windows: Ctrl-C then raises KeyboardInterrupt
            loop.add_signal_handler(sig, stop, sig)
    try:
        return await agent.run()
    finally:
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(sig)
        await provider.aclose()


def print_result(summary: RunSummary, header: RunHeader, run_dir: Path) -> None:
    """The final verdict: what the best candidate achieved, why the run stopped, where things are."""
    if summary.best_attempt is not None:
        console.print(
            f"[bold green]PASSED[/] {untrusted(header.task)} v{header.task_version}: attempt "
            f"#{summary.best_attempt} is correct"
            + (f" ({speed_text(summary)})" if speed_text(summary) else "")
            + f", after {summary.attempts} attempt{'s' if summary.attempts != 1 else ''}",
            highlight=False,
        )
        console.print(f"  best candidate: {run_dir / 'best.py'}", highlight=False, markup=False)
    else:
        console.print(
            f"[bold red]FAILED[/] {untrusted(header.task)} v{header.task_version}: no correct candidate in "
            f"{summary.attempts} attempt{'s' if summary.attempts != 1 else ''}",
            highlight=False,
        )
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items(), key=lambda kv: -kv[1]))
    console.print(f"  stopped: {untrusted(summary.stop_reason or summary.status)}", highlight=False)
    console.print(
        f"  {summary.rounds} round{'s' if summary.rounds != 1 else ''} · {outcomes or 'no attempts'} · "
        f"tokens {tokens_text(summary.input_tokens)} in / {tokens_text(summary.output_tokens)} out · "
        f"{money_text(summary.cost_usd, summary.cost_known)} · wall {summary.wall_seconds:.0f} s",
        highlight=False,
    )
    console.print(f"  record: {run_dir}", highlight=False, markup=False)


class RunOptions(BaseModel):
    """The command line's settings for new runs, as given; a sweep records them to start its later runs
    alike."""

    base_url: str | None = None
    rounds: int | None = None
    candidates: int | None = None
    max_tokens_total: int | None = None
    max_dollars: float | None = None
    max_wall: float | None = None
    temperature: float | None = None
    max_reply_tokens: int | None = None
    target_speedup: float | None = None
    target_sol: float | None = None
    target_estimate: float | None = None
    no_compile: bool = False
    seeds: int | None = None
    timeout: float | None = None
    examples: str | None = None
    examples_from: list[str] = []
    no_tune: bool = False
    tune_budget: float | None = None

    def budget_flags(self) -> dict[str, Any]:
        """The budgets given (the others keep their defaults, or a resumed run's values)."""
        flags = {
            "rounds": self.rounds, "candidates_per_round": self.candidates,
            "max_tokens": self.max_tokens_total, "max_dollars": self.max_dollars,
            "max_wall_seconds": self.max_wall,
        }
        return {k: v for k, v in flags.items() if v is not None}

    def config(self, task: Task, model: str) -> AgentConfig:
        """This machine's stages with these settings; the verify time limit follows from the stages and
        shapes."""
        settings = {
            "temperature": self.temperature, "max_reply_tokens": self.max_reply_tokens,
            "target_speedup": self.target_speedup, "target_sol": self.target_sol, "base_url": self.base_url,
            "examples": tuple(e.strip() for e in self.examples.split(",") if e.strip()) if self.examples
            else None,
            "example_places": tuple(self.examples_from),
        }
        config = AgentConfig.for_this_machine(
            model, compile=not self.no_compile, budgets=_budgets(Budgets(), **self.budget_flags()),
            tune_budget_s=None if self.no_tune else self.tune_budget or DEFAULT_TUNE_BUDGET_S,
            seeds=seed_list(self.seeds) if self.seeds is not None else None,
            **{k: v for k, v in settings.items() if v is not None},
        )
        if self.target_estimate is not None:  # 0: any correct candidate ends the run
            config = dataclasses.replace(config, target_estimate=self.target_estimate or None)
        limit = timeout_value(self.timeout, default_timeout(task, config.plan))
        return dataclasses.replace(config, plan=config.plan.model_copy(update={"timeout": limit}))


def open_workers(kind: str, address: str | None, cpu_workers: int = AgentConfig.verify_workers) -> Executor:
    """Where this command's verifications run (``--executor``, ``--address``); one line when it cannot
    start."""
    try:
        return open_executor(kind, address=address, cpu_workers=cpu_workers)
    except ExecutorError as exc:
        raise UserError(str(exc)) from None


@contextlib.contextmanager
def _closed_on_error(workers: Executor) -> Iterator[None]:
    """Starting the run failed (a bad model spec, an unreadable record): let the workers go before the error
    line."""
    try:
        yield
    except BaseException:
        workers.close()
        raise


def new_run(task: Task, model: str, provider: Provider, base: Path, options: RunOptions) -> Agent:
    """A fresh run directory for ``task`` (already checked) with ``provider``, recorded as ``model``."""
    config = options.config(task, model)
    check_fits_device(task, config.plan)
    try:
        return Agent.create(task, provider, config, base)
    except (RunRecordError, OSError) as exc:
        raise UserError(f"cannot create the run directory under {base}: {exc}") from None


class _StdoutOutlivingItsReader(io.TextIOBase):
    """stdout for a run or sweep: once its reader has gone (``run ... | head``), output stops instead of
    ending the run midway; stderr says so once, and the record keeps everything that would have been
    printed."""

    def __init__(self, stream: Any, record: Path) -> None:
        self.stream, self.record, self.gone = stream, record, False

    def _lost(self) -> None:
        self.gone = True
        # nothing is left to flush into the closed pipe at exit
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        err_console.print(f"stdout was closed; carrying on, everything is recorded in {self.record}",
                          highlight=False, markup=False)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except (BrokenPipeError, ReaderGone):
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except (BrokenPipeError, ReaderGone):
                self._lost()

    def isatty(self) -> bool:
        return self.stream.isatty()


@contextlib.contextmanager
def outliving_a_closed_stdout(record: Path) -> Iterator[None]:
    saved = console._file  # Rich's own setting (None: whatever sys.stdout is then), which .file resolves
    # a text stream, as Rich needs
    console.file = cast(IO[str], _StdoutOutlivingItsReader(sys.stdout, record))
    try:
        yield
    finally:
        console._file = saved


def _run_one(agent: Agent, provider: Provider, run_dir: Path, workers: Executor, plain: bool) -> None:
    with outliving_a_closed_stdout(run_dir):
        _run_to_its_end(agent, provider, run_dir, workers, plain)


def _run_to_its_end(agent: Agent, provider: Provider, run_dir: Path, workers: Executor, plain: bool) -> None:
    """One run with its live display, to its summary; the exit status says how it ended."""
    header = agent.header
    tuned = (
        f"; configs tuned, {agent.config.tune_budget_s:g} s per candidate"
        if agent.tune_fn is not None and agent.config.tune_budget_s
        else ""
    )
    console.print(
        f"run [bold]{untrusted(header.run_id)}[/]: {untrusted(header.task)} v{header.task_version} with "
        f"{untrusted(header.model)} ({', '.join(header.verifier_stages)} on "
        f"{untrusted(header.device)}{tuned})",
        highlight=False,
    )
    console.print(f"  record: {run_dir}", highlight=False, markup=False)
    console.print(f"  verifying on {workers.describe()}", highlight=False, markup=False)
    display: _Display = (
        LiveDisplay(console, header, agent.config.budgets.rounds,
                    workers) if console.is_terminal and not plain
        else PlainDisplay(console, header, agent.config.budgets.rounds)
    )
    if agent.previous is not None:
        display.summary, display.prior_wall = agent.previous, agent.previous.wall_seconds
        display.note(f"resuming after {len(agent.attempts)} finished attempt(s)")
    agent.events, agent.executor = display, workers
    received: list[signal.Signals] = []
    try:
        with display.live if isinstance(display, LiveDisplay) else contextlib.nullcontext():
            summary = asyncio.run(_drive(agent, provider, received, workers))
    except (asyncio.CancelledError, KeyboardInterrupt):
        err_console.print(f"interrupted; finished attempts are saved. Resume with: {resume_command(run_dir)}",
                          highlight=False, markup=False)
        raise typer.Exit(STOP_SIGNALS[received[0]] if received else 130) from None
    except FatalProviderError as exc:
        err_console.print(f"[bold red]error:[/] {untrusted(str(exc))}", highlight=False)
        err_console.print(f"  (the run is saved; after fixing this: {resume_command(run_dir)})",
                          highlight=False, markup=False)
        raise typer.Exit(2) from None
    # the harness failed on this run (the summary says so): one line, not a traceback
    except Exception as exc:
        err_console.print(f"[bold red]error:[/] {untrusted(one_line_failure(exc))}", highlight=False)
        err_console.print(f"  (finished attempts are recorded in {run_dir})", highlight=False, markup=False)
        raise typer.Exit(1) from None
    print_result(summary, agent.header, run_dir)
    if summary.best_attempt is None:
        raise typer.Exit(1)


def one_line_failure(exc: BaseException) -> str:
    """An unexpected exception that ended a run, as one line: ``the run failed: ValueError: its first
    line``."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"the run failed: {type(exc).__name__}" + (f": {first}" if first else "")


def recorded_run(name: str, base: Path, model: str | None, task: str | None,
                 redo_corrupt: bool) -> tuple[Path, RunReader]:
    """The run ``--resume`` names, readable (or ``--redo-corrupt``), on the task and with the model given if
    any."""
    try:
        run_dir = resolve_run(name, base)
        reader = RunReader(run_dir)
    except RunRecordError as exc:
        raise UserError(str(exc)) from None
    header = reader.header
    unreadable = reader.unreadable_attempts()
    if unreadable and not redo_corrupt:
        raise UserError(
            f"{', '.join(str(p) for p in unreadable)}: unreadable attempt file(s); to set them aside and "
            "redo those attempts (and any later round, whose prompts were built on them): "
            f"{resume_command(run_dir)} --redo-corrupt"
        )
    if task and Path(task).stem != header.task and task != header.task:
        raise UserError(f"run {header.run_id} is on task {header.task}, not {task}: drop the task (--resume "
                        f"takes the run's), or start a new run on {task}")
    if model and model != header.model:
        raise UserError(f"run {header.run_id} used {header.model}; a resumed run continues with the same "
                        "model: drop --model, or start a new run with it")
    return run_dir, reader


#: A run that ended so is not continued by ``--resume`` alone: its target reached, or its rounds or a budget
#: spent (``--rounds`` or a larger budget continues these two).
ENDED = ("target_reached", "completed", "budget_exhausted")


def ended_summary(reader: RunReader) -> RunSummary | None:
    """The summary of a run that ended (:data:`ENDED`) with every attempt still on disk and readable; None for
    one that ``--resume`` goes on with (killed while running, interrupted, failed, or attempts lost since)."""
    summary = reader.summary()
    if summary is None or summary.status not in ENDED:
        return None
    if len(reader.attempt_files()) != summary.attempts or reader.unreadable_attempts():
        return None
    return summary


def already_finished(run_dir: Path, reader: RunReader, given: dict[str, Any]) -> int | None:
    """``--resume`` of a run that has nothing left to do: says so with its result, asks no model, starts no
    worker; the exit status is the run's own (0 a correct kernel, 1 none). None when there is something to
    resume."""
    try:
        summary = ended_summary(reader)
    except RunRecordError as exc:
        raise UserError(str(exc)) from None
    if summary is None:
        return None
    if given and summary.status != "target_reached":
        return None  # budgets raised: it goes on
    label, _ = run_status(summary.status, summary.passes)
    console.print(f"run {untrusted(reader.header.run_id)} already finished ({untrusted(label)}): nothing to "
                  "resume", highlight=False)
    print_result(summary, reader.header, run_dir)
    if summary.status != "target_reached":
        console.print(f"  to go on: {resume_command(run_dir)} --rounds N (or a larger budget)",
                      highlight=False, markup=False)
    return 0 if summary.best_attempt is not None else 1


def resume_run(
    name: str, base: Path, model: str | None, base_url: str | None, given: dict[str, Any], task: str | None,
    redo_corrupt: bool,
) -> tuple[Path, Agent, Provider]:
    """The agent that continues the run ``name``, holding its writer lock: one line (UserError) when another
    process is writing it, before anything of it is touched."""
    run_dir, _ = recorded_run(name, base, model, task, redo_corrupt)
    try:
        writer = RunWriter.open(run_dir)
    except RunRecordError as exc:
        raise UserError(str(exc)) from None
    try:
        reader = RunReader(run_dir)  # again, now that no other process adds to it
        header = reader.header
        if redo_corrupt:
            moved = reader.set_aside_unreadable(header.budgets.candidates_per_round)
            if moved:
                err_console.print(f"set aside {len(moved)} attempt file(s) to redo: "
                                  f"{', '.join(p.name for p in moved)}", highlight=False)
        provider = make_provider(header.model, base_url or header.params.get("base_url"), base)
        budgets = _budgets(header.budgets, **given) if given else None
        try:
            agent = Agent.resume(run_dir, provider, budgets=budgets, writer=writer)
        except RunRecordError as exc:
            raise UserError(str(exc)) from None
        check_task_runs(agent.task)
        check_fits_device(agent.task, agent.config.plan)
    except BaseException:
        writer.close()
        raise
    # rebuilt from its spec, a scripted provider starts at its first reply
    provider.skip_replies(replies_used(agent))
    return run_dir, agent, provider


def replies_used(agent: Agent) -> int:
    """How many replies the run consumed before its first unfinished attempt (what a script must skip).

    Calls are made in (round, slot) order, so skipping this many replies hands a resumed run the reply
    the killed process was waiting for (exact with one candidate per round; with several, the redone
    slots take the following replies in order).
    """
    k = agent.config.budgets.candidates_per_round
    done = {(a.round, a.slot) for a in agent.attempts}
    last = max((r for r, _ in done), default=0)
    missing = [(last, s) for s in range(k) if (last, s) not in done]
    first_missing = missing[0] if missing else (last + 1, 0)
    return sum(1 for key in done if key < first_missing)
