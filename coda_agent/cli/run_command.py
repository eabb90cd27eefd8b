"""``coda-agent run``: one run of the agent on a task, or a sweep of several. The command alone: what it does
lives below it, in :mod:`.run_cmd` (one run: options, provider, live display, record) and :mod:`.sweep`
(several), imported when it runs, so that the other commands and ``--help`` start without the agent, the
verifier's checker and torch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..execute import EXECUTORS
from ..settings import RUNS_DIR_ENV
from ..settings import runs_dir as default_runs_dir
from ..store.rundir import is_run_dir
from ..tasks.loader import find_recorded_task, find_task
from ..verifier.plan import DEFAULT_TUNE_BUDGET_S
from .core import UserError, app
from .inputs import MODEL_ENV, MODEL_HELP, NO_MODEL, check_task_runs, example_places


@app.command("run")
def run_cmd(
    task: list[str] = typer.Argument(
        None, metavar="TASK",
        help="task names, YAML paths or folders of tasks (taken from the run with --resume); "
        "several tasks or models make a sweep",
    ),
    model: list[str] = typer.Option(
        None, "--model", "-m", envvar=MODEL_ENV, metavar="<spec>",
        help=MODEL_HELP,
    ),
    base_url: str = typer.Option(None, "--base-url", help="server URL for openai-compatible/<model>"),
    rounds: int = typer.Option(None, min=1, help="max rounds (default 5)"),
    candidates: int = typer.Option(None, "--candidates", "-k", min=1,
                                   help="candidates per round, asked concurrently (default 1)"),
    max_tokens_total: int = typer.Option(None, min=1,
                                         help="stop before the run's tokens (in + out) exceed this"),
    max_dollars: float = typer.Option(None, min=0, help="stop before the run's cost exceeds this (USD; per "
                                                        "run in a sweep)"),
    max_wall: float = typer.Option(None, min=1, help="stop after this many seconds of wall time"),
    temperature: float = typer.Option(None, min=0, help="sampling temperature (default 0.7)"),
    max_reply_tokens: int = typer.Option(None, min=256, help="output-token limit per reply (default 8192)"),
    target_speedup: float = typer.Option(
        None, min=0, help="GPU: stop once correct and at least this fraction of the human kernel's speed, or "
                          "of cuBLAS-alone's "
        "for a task without one (default 0.97, parity within noise)"
    ),
    target_sol: float = typer.Option(None, min=0, max=1,
                                     help="GPU: ... or this fraction of the speed of light"),
    target_estimate: float = typer.Option(
        None, min=0, max=1,
        help="CPU with the sm_90a build: stop once correct and the cost estimate at least this fraction of "
             "the speed of light (default 0.9; 0: at the first correct candidate)"),
    no_compile: bool = typer.Option(False, "--no-compile",
                                    help="CPU: skip the sm_90a compile stage (~10 s per candidate)"),
    seeds: int = typer.Option(None, help="seeds per shape in the correctness check (default 3)"),
    timeout: float = typer.Option(
        None, help="seconds one candidate's verification may take (default from the stages and shapes: 300 s "
                   "on a CPU, 120 s with --no-compile)"
    ),
    examples: str = typer.Option(None, help="comma-separated tasks whose human kernels are shown as examples "
                                            "(default chosen by similarity)"),
    examples_from: list[Path] = typer.Option(
        None, "--examples-from", metavar="PATH",
        help="a task file or folder of tasks whose human kernels join the suite's as "
        "examples (repeatable); a task's own folder is not searched unless named",
    ),
    no_tune: bool = typer.Option(False, "--no-tune", help="GPU: keep each candidate's gemm configs as "
                                                          "written (no schedule tuning)"),
    tune_budget: float = typer.Option(
        None, min=1, help="GPU: seconds the harness may spend tuning each correct candidate's gemm configs, "
                          "its runner's start and "
        f"final comparisons included (default {DEFAULT_TUNE_BUDGET_S:.0f})"
    ),
    jobs: int = typer.Option(2, min=1,
                             help="sweep: runs in flight at once (their timings never overlap on a GPU)"),
    executor: str = typer.Option(
        "local", "--executor",
        help=f"where candidates are verified: {' or '.join(EXECUTORS)} (a Ray cluster's GPUs and CPUs)"
    ),
    address: str = typer.Option(
        None, "--address", help="with --executor ray: the cluster (HOST:PORT, ray://HOST:PORT or auto; "
                                "default: a private one on this host)"
    ),
    total_dollars: float = typer.Option(
        None, min=0, help="sweep: every run stops (and no new one starts) once the sweep's runs together "
                          "cost this much (USD)"
    ),
    runs_dir: Path = typer.Option(None, "--runs-dir", envvar=RUNS_DIR_ENV,
                                  help="where run records go (default ./runs)"),
    resume: str = typer.Option(None, "--resume",
                               help="continue an interrupted run (its directory or id) or sweep (its file)"),
    redo_corrupt: bool = typer.Option(
        False, "--redo-corrupt",
        help="with --resume: set unreadable attempt files aside and redo those attempts"
    ),
    plain: bool = typer.Option(False, "--plain", help="plain log lines even on a terminal"),
) -> None:
    """Run the agent on a task: prompt the model, verify each candidate, feed results back, record everything.

    Several tasks (or a folder) and/or several --model make a sweep: every task with every model, --jobs at a
    time, each with the budgets given, and a table at the end; --resume SWEEP continues it.
    """
    from .run_cmd import (
        RunOptions,
        _closed_on_error,
        _run_one,
        make_provider,
        new_run,
        open_workers,
        resume_run,
    )
    from .sweep import is_sweep, resume_sweep, start_sweep

    options = RunOptions(
        base_url=base_url, rounds=rounds, candidates=candidates, max_tokens_total=max_tokens_total,
        max_dollars=max_dollars, max_wall=max_wall, temperature=temperature,
        max_reply_tokens=max_reply_tokens, target_speedup=target_speedup, target_sol=target_sol,
        target_estimate=target_estimate,
        no_compile=no_compile, seeds=seeds, timeout=timeout, examples=examples,
        examples_from=example_places(examples_from or []), no_tune=no_tune, tune_budget=tune_budget,
    )
    if no_tune and tune_budget is not None:
        raise UserError("--no-tune and --tune-budget contradict each other: pass one of them")
    base = runs_dir or default_runs_dir()
    tasks, models = list(task or []), list(model or [])
    if redo_corrupt and not resume:
        raise UserError("--redo-corrupt goes with --resume RUN")
    refuse_records_as_tasks(tasks, base)
    if resume and is_sweep(resume, base):
        raise typer.Exit(resume_sweep(resume, base, options, jobs, redo_corrupt, total_dollars,
                                      (executor, address)))
    if not resume and (len(models) > 1 or len(tasks) > 1 or any(Path(t).is_dir() for t in tasks)):
        raise typer.Exit(start_sweep(tasks, models, options, base, jobs, total_dollars, (executor, address)))
    if total_dollars is not None:
        raise UserError(
            "--total-dollars is for sweeps (several tasks or models); one run takes --max-dollars"
        )
    if len(models) > 1 or len(tasks) > 1:
        raise UserError("--resume continues one run (or a sweep): pass at most one task and one --model")
    one_task: str | None = tasks[0] if tasks else None
    one_model: str | None = models[0] if models else None
    if resume:
        from ..verifier.scratch import remove_stale
        from .run_cmd import already_finished, recorded_run

        finished = already_finished(*recorded_run(resume, base, one_model, one_task, redo_corrupt),
                                    options.budget_flags())
        if finished is not None:
            raise typer.Exit(finished)
        remove_stale()  # what the interrupted run's runners left behind if it was killed outright (kill -9)
        workers = open_workers(executor, address)
        with _closed_on_error(workers):
            run_dir, agent, provider = resume_run(resume, base, one_model, base_url, options.budget_flags(),
                                                  one_task, redo_corrupt)
    else:
        if not one_model:
            raise UserError(NO_MODEL)
        provider = make_provider(one_model, options.base_url, base)
        replayed = provider.replays
        if replayed is not None:  # re-verify under the schedule the recorded run used, unless told otherwise
            one_model = replayed.spec
            one_task = one_task or str(find_recorded_task(replayed.task_path, replayed.task).path)
            options = options.model_copy(update={
                "rounds": rounds or replayed.rounds,
                "candidates": candidates or replayed.candidates_per_round,
            })
        if not one_task:
            raise UserError("which task? pass a task name or YAML path (see `coda-agent tasks`)")
        t = find_task(one_task)
        if replayed is not None and replayed.task_hash and replayed.task_hash != t.content_hash:
            typer.echo(f"note: the replies were written for task {replayed.task} v{replayed.task_version} "
                       f"({replayed.task_hash}); {t.name} v{t.version} here is another ({t.content_hash}), "
                       "so they may not fit it", err=True)
        check_task_runs(t)
        workers = open_workers(executor, address)
        with _closed_on_error(workers):
            agent = new_run(t, one_model, provider, base, options)
        run_dir = agent.run_dir
    with workers:
        _run_one(agent, provider, run_dir, workers, plain)


def refuse_records_as_tasks(tasks: list[str], base: Path) -> None:
    """A run's folder (or a folder of runs, or a sweep's file) given where a task goes: one line naming
    ``--resume``, which continues it, before the task loader says only that it holds no task."""
    from .sweep import SWEEP_SUFFIX

    for ref in tasks:
        p = Path(ref)
        if is_run_dir(p) or (p.name == ref and is_run_dir(base / ref)):
            raise UserError(f"{ref}: a run's record, not a task; to continue that run: coda-agent run "
                            f"--resume {ref}")
        if p.name.endswith(SWEEP_SUFFIX) and p.is_file():
            raise UserError(f"{ref}: a sweep's record, not a task; to continue that sweep: coda-agent run "
                            f"--resume {ref}")
        if p.is_dir() and not any(p.glob("*.y*ml")) and any(is_run_dir(d) for d in p.iterdir() if d.is_dir()):
            raise UserError(f"{ref}: a folder of run records, not of tasks; to continue one of those runs: "
                            f"coda-agent run --resume {p / '<run folder>'}")
