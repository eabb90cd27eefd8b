"""``coda-agent index rebuild``, ``leaderboard``, ``show``, ``diff`` and ``view``: browsing runs and bench
results."""

from __future__ import annotations

import difflib
import errno
import json
from pathlib import Path

import typer
from rich import box
from rich.syntax import Syntax
from rich.table import Table

from ..providers.remote import is_loopback_host
from ..settings import BENCH_DIR_ENV, DEFAULT_BENCH_DIR, DEFAULT_RUNS_DIR, RUNS_DIR_ENV
from ..store import leaderboard as lb
from ..store import leaderboard_text as lbt
from ..store.compare import diff_runs
from ..store.index import Index, replayed_model
from ..store.records import run_status
from ..store.rundir import Problem, RunFiles, RunRecordError, read_run, resolve_run
from ..store.stage_time import STAGE_TOTAL, stage_time_rows
from ..store.timings import timing_points
from ..untrusted import shown
from .core import (
    TONE_STYLE,
    CliApp,
    UserError,
    app,
    console,
    err_console,
    outcome_style,
    print_table,
    untrusted,
    wide_console,
)

index_app = CliApp(help="The SQLite index over run records and bench results (a rebuildable cache).")
app.add_typer(index_app, name="index")


@index_app.callback(invoke_without_command=True)
def index_help(ctx: typer.Context) -> None:
    """The SQLite index over run records and bench results (a rebuildable cache)."""
    if ctx.invoked_subcommand is None:
        console.print(ctx.get_help())

RUNS_DIR = typer.Option(DEFAULT_RUNS_DIR, "--runs-dir", envvar=RUNS_DIR_ENV, help="folder of run records")
BENCH_DIR = typer.Option(DEFAULT_BENCH_DIR, "--bench-dir", envvar=BENCH_DIR_ENV,
                         help="folder of bench result JSON files")


def open_index(runs_dir: Path, bench_dir: Path) -> Index:
    """The index, brought up to date with the files."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise UserError(f"{runs_dir}: not a folder (--runs-dir)")
    ix = Index.open(runs_dir, bench_dir)
    ix.refresh()
    return ix


def print_problems(problems: list[Problem]) -> None:
    if not problems:
        return
    err_console.print(f"[yellow]{len(problems)} file(s) could not be read (shown without them):[/]")
    for p in problems:
        err_console.print(f"  {untrusted(p.file)}: {untrusted(p.message)}", highlight=False)


@index_app.command("rebuild")
def index_rebuild(runs_dir: Path = RUNS_DIR, bench_dir: Path = BENCH_DIR) -> None:
    """Forget the index and read every run record and bench result again."""
    if not runs_dir.is_dir():
        raise UserError(f"{runs_dir}: no such runs folder (set --runs-dir or CODA_AGENT_RUNS_DIR)")
    with Index.open(runs_dir, bench_dir) as ix:
        stats = ix.rebuild()
        runs, bench = len(ix.runs()), len({b.bench_path for b in ix.bench_rows()})
        console.print(f"indexed {runs} runs and {bench} bench results into {ix.path} ({stats.indexed} "
                      "sources)")
        print_problems(ix.problems())


# ---------------------------------------------------------------------------------------------- leaderboard


#: The leaderboard's columns a narrow terminal loses first (least useful first): the task, author, correctness
#: and the ratio against cuBLAS stay.
SUMMARY_DROPPABLE = ("$", "shapes", "runs ok", "×eager", "%SoL", "×compile", "×human", "device")
GROUP_DROPPABLE = ("1st correct", "$", "tokens", "attempts", "rounds", "runs ok", "×eager", "%SoL",
                   "×compile")


def _rich_group(g: lb.Group) -> Table:
    table = Table(title=untrusted(g.title), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD)
    for header, key in lbt.columns_for(g):
        if key == "author":
            table.add_column(header, no_wrap=True)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    for e in g.entries:
        style = "dim" if e.kind == "baseline" else "bold" if e.kind == "human" else ""
        cells = [untrusted(lbt.cell(e, k)) for _, k in lbt.columns_for(g)]
        if e.correct is False:
            cells[1] = "[red]no[/]"
        table.add_row(*cells, style=style)
    return table


def _summary_table(rows: list[lb.SummaryRow]) -> Table:
    table = Table(title="leaderboard: geometric means over the timed shapes (per-shape tables: --task T)",
                  title_justify="left", title_style="bold", box=box.SIMPLE_HEAD)
    for header, key in lbt.SUMMARY_COLUMNS:
        if key in ("task", "device", "author"):
            table.add_column(header, no_wrap=True)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    previous: tuple[str, int, str | None, str] | None = None
    for r in rows:
        cells = [untrusted(lbt.summary_cell(r, k)) for _, k in lbt.SUMMARY_COLUMNS]
        if (r.task, r.task_version, r.task_hash, r.device) == previous:
            cells[0] = cells[1] = ""
        if r.correct is False:
            cells[3] = "[red]no[/]"
        table.add_row(*cells, style="bold" if r.kind == "human" else "dim" if r.section == "apart" else "")
        previous = (r.task, r.task_version, r.task_hash, r.device)
    return table


@app.command("leaderboard")
def leaderboard(
    task: str = typer.Option(None, "--task", "-t", help="only this task, with a table per shape"),
    device: str = typer.Option(None, "--device", "-d",
                               help="only this device (as recorded, e.g. 'NVIDIA H200' or cpu)"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json, csv or md"),
    runs_dir: Path = RUNS_DIR,
    bench_dir: Path = BENCH_DIR,
) -> None:
    """Per task, each author (human, each model) against eager, torch.compile, cuBLAS and SoL; --task: per
    shape."""
    if fmt not in ("table", "json", "csv", "md"):
        raise UserError(f"unknown --format {fmt!r}: use table, json, csv or md")
    with open_index(runs_dir, bench_dir) as ix:
        if task is not None and task not in ix.tasks():
            known = ", ".join(ix.tasks()) or "none yet"
            close = difflib.get_close_matches(task, ix.tasks(), n=1, cutoff=0.7)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UserError(f"no runs or bench results for task {task!r}{hint} (known: {known})")
        board = lb.build(ix, task=task, device=device)
        devices = sorted({r.device for r in ix.runs(task)} | {b.device for b in ix.bench_rows(task)})
    if device is not None and board.empty:
        raise UserError(f"no runs or bench results on device {device!r} (known: "
                        f"{', '.join(devices) or 'none yet'})")
    details = task is not None
    if fmt == "json":
        print(lbt.to_json(board) if details else lbt.summary_json(board))
        return
    if fmt == "csv":
        print(lbt.to_csv(board) if details else lbt.summary_csv(board), end="")
    elif fmt == "md":
        print(lbt.to_markdown(board) if details else lbt.summary_markdown(board))
    elif board.empty:
        wide_console().print(f"no run records in {runs_dir} and no bench results in {bench_dir} yet",
                             highlight=False)
    elif not details:
        print_table(_summary_table(lb.summarize(board)), SUMMARY_DROPPABLE)
    else:
        out = wide_console()
        for g in board.groups:
            print_table(_rich_group(g), GROUP_DROPPABLE, out)
        if board.apart:
            out.rule("other versions / devices (not compared with the tables above)")
            for g in board.apart:
                print_table(_rich_group(g), GROUP_DROPPABLE, out)
    for note in (lbt.untimed_note(board), lbt.no_attempts_note(board), lbt.missing_bench_note(bench_dir)):
        if note:
            err_console.print(untrusted(note), highlight=False)
    print_problems(board.problems)


# ---------------------------------------------------------------------------------------------- show / diff


def find_run(runs_dir: Path, ref: str) -> RunFiles:
    """The run ``ref`` names (``rundir.resolve_run``), read tolerantly: a folder is shown even without a
    header."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise UserError(f"{runs_dir}: not a folder (--runs-dir)")
    try:
        return read_run(resolve_run(ref, runs_dir))
    except RunRecordError as exc:
        raise UserError(str(exc)) from None


def _outcome(outcome: str) -> str:
    return f"[{outcome_style(outcome)}]{untrusted(outcome)}[/]"


def _show_attempt(rf: RunFiles, index: int, fmt: str) -> None:
    """One attempt in full: outcome, the whole reason (every check), tokens and cost, and its code."""
    a = rf.attempt(index)
    if a is None:
        known = ", ".join(str(x.index) for x in rf.attempts) or "none finished yet"
        raise UserError(f"run {rf.name} has no attempt #{index} (attempts: {known})")
    if fmt == "json":
        # as the whole run's: ASCII, every control escaped
        print(json.dumps(a.model_dump(mode="json"), indent=2))
        return
    out = wide_console()
    out.print(f"[bold]{untrusted(rf.name)}[/] attempt #{a.index} (round {a.round}, slot {a.slot}): "
              f"{_outcome(a.outcome)}", highlight=False)
    out.print(
        f"tokens {lbt.fmt_tokens(a.usage.input_tokens)} in / {lbt.fmt_tokens(a.usage.output_tokens)} out · "
        f"{lbt.fmt_money(a.usage.cost_usd, a.usage.price_known)} · "
        + " · ".join(f"{k} {lbt.fmt_seconds(v)}" for k, v in a.durations.items()), highlight=False,
    )
    for st in a.stages:  # where the verify's and the tuning's time went, stage by stage
        out.print(f"  {untrusted(st.describe_time())}", highlight=False)
    reason = a.reason or "(no reason recorded)"
    out.rule("reason")
    out.print(shown(reason), markup=False, highlight=False)  # a candidate's words: controls written out
    out.rule("code")
    if a.code is None:
        out.print("(no code was extracted from the reply)")
    else:
        out.print(Syntax(shown(a.code), "python", theme="ansi_dark", background_color="default",
                         line_numbers=True))


def _show_breakdown(rf: RunFiles, fmt: str) -> None:
    """Stage x part over the run's attempts: how many recorded it, total, median and max seconds, share of the
    stage."""
    rows = stage_time_rows(a.stages for a in rf.attempts)
    if fmt == "json":
        print(json.dumps([vars(r) for r in rows], indent=2))
        return
    out = wide_console()
    verified = sum(a.verdict is not None for a in rf.attempts)
    table = Table(title=f"{untrusted(rf.name)}: verification time over {verified} verified attempts "
                        "(seconds)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("stage", "part", "attempts", "total", "median", "max", "share"):
        table.add_column(col, justify="left" if col in ("stage", "part") else "right", no_wrap=True)
    for r in rows:
        first = r.part == STAGE_TOTAL
        table.add_row(untrusted(r.stage) if first else "", untrusted(r.part), str(r.attempts),
                      f"{r.total_s:.1f}", f"{r.median_s:.2f}", f"{r.max_s:.2f}",
                      "" if first else f"{r.share:.0%}")
    if rows:
        out.print(table)
    else:
        out.print("no verified attempts yet")


@app.command("show")
def show(
    run: str = typer.Argument(..., help="run folder, run id, a unique prefix or suffix, or latest"),
    attempt: int = typer.Option(None, "--attempt", "-a",
                                help="one attempt in full: its whole reason and its code"),
    breakdown: bool = typer.Option(False, "--breakdown", "-b", help=(
        "where the verifications' time went over every attempt: stage by stage, part by part")),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    runs_dir: Path = RUNS_DIR,
) -> None:
    """A run's header and attempt timeline: verdicts, tokens, cost, durations (--attempt N: one in full)."""
    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format {fmt!r}: use table or json")
    rf = find_run(runs_dir, run)
    if breakdown:
        _show_breakdown(rf, fmt)
        return
    if attempt is not None:
        _show_attempt(rf, attempt, fmt)
        return
    if fmt == "json":
        print(json.dumps(rf.as_json(), indent=2))
        return
    h, s = rf.header, rf.effective_summary()
    out = wide_console()
    out.print(f"[bold]{untrusted(rf.name)}[/]" + (f"  (run id {untrusted(h.run_id)})" if h else ""),
              highlight=False)
    if h:
        author, replay_of = replayed_model(h.model, runs_dir)
        model = untrusted(author) + (f"[/] (a replay of run {untrusted(replay_of)})[bold]" if replay_of
                                     else "")
        out.print(
            f"task [bold]{untrusted(h.task)}[/] v{h.task_version} · model [bold]{model}[/] · "
            f"device {untrusted(h.device)}" + (f" · host {untrusted(h.host)}" if h.host else ""),
            highlight=False,
        )
        git = f" · git {h.git_commit[:10]}{' (dirty)' if h.git_dirty else ''}" if h.git_commit else ""
        out.print(f"created {h.created:%Y-%m-%d %H:%M:%S}{git}", highlight=False)
        b = h.budgets
        out.print(
            f"budgets: {b.rounds} rounds × {b.candidates_per_round} · tokens {b.max_tokens or '-'} · "
            f"$ {b.max_dollars or '-'} · wall {lbt.fmt_seconds(b.max_wall_seconds)} · "
            f"stages {', '.join(h.verifier_stages) or '-'}", highlight=False,
        )
    label, tone = run_status(s.status, s.passes)
    status = f"[{TONE_STYLE[tone]}]{untrusted(label)}[/]" + (f" ({untrusted(s.stop_reason)})" if s.stop_reason
                                                             else "")
    out.print(f"status {status}", highlight=False)
    if rf.how_to_resume and rf.how_to_resume not in s.stop_reason:
        out.print(f"resume with: {rf.how_to_resume}", highlight=False, markup=False)

    table = Table(title="attempts", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("#", "round.slot", "at", "outcome", "reason", "tokens in/out", "$", "llm", "verify",
                "time µs"):
        if col == "reason":
            table.add_column(col, overflow="fold", min_width=20, ratio=1)
        else:
            table.add_column(col, justify="left" if col == "outcome" else "right", no_wrap=True)
    start = h.created if h else None
    for a in rf.attempts:
        reason = a.reason
        at = (a.started - start).total_seconds() if start and a.started.tzinfo == start.tzinfo else None
        points = timing_points(a.timing)
        times = ", ".join(lbt.fmt_us(v.median_us) + (f" @{k}" if k else "") for k, v in points.items()) or "-"
        table.add_row(
            str(a.index), f"{a.round}.{a.slot}", "-" if at is None else f"+{lbt.fmt_seconds(at)}",
            _outcome(a.outcome), untrusted(lbt.headline(reason, 90)),
            f"{lbt.fmt_tokens(a.usage.input_tokens)}/{lbt.fmt_tokens(a.usage.output_tokens)}",
            lbt.fmt_money(a.usage.cost_usd, a.usage.price_known), lbt.fmt_seconds(a.durations.get("llm")),
            lbt.fmt_seconds(a.durations.get("verify")), untrusted(times),
        )
    if rf.attempts:
        print_table(table, ("at", "$", "llm", "verify", "tokens in/out", "round.slot"), out)
    else:
        out.print("no finished attempts yet")
    best = f"best #{s.best_attempt}" + (
        f" ({lbt.fmt_us(s.best_time_us)} µs)" if s.best_time_us
        else f" ({100 * s.estimate_sol_fraction:.0f}% SoL by the CPU's cost estimate)"
        if s.estimate_sol_fraction is not None else "")
    out.print(
        f"{s.attempts} attempts in {s.rounds} rounds, {s.passes} passed"
        + (f", {best}" if s.best_attempt else "")
        + f" · tokens {lbt.fmt_tokens(s.input_tokens + s.output_tokens)} · "
          f"{lbt.fmt_money(s.cost_usd, s.cost_known)}"
        + f" · wall {lbt.fmt_seconds(s.wall_seconds)} · first correct after "
          f"{lbt.fmt_seconds(s.seconds_to_first_correct)}",
        highlight=False,
    )
    print_problems(rf.problems)


@app.command("diff")
def diff(
    run_a: str = typer.Argument(..., help="first run (folder, run id, a unique prefix or suffix, or latest)"),
    run_b: str = typer.Argument(..., help="second run"),
    runs_dir: Path = RUNS_DIR,
) -> None:
    """What changed between two runs: header (model, params, task version, stages), outcomes per attempt,
    best code."""
    a, b = find_run(runs_dir, run_a), find_run(runs_dir, run_b)
    d = diff_runs(a, b)
    out = wide_console()
    out.print(f"[bold]A[/] {untrusted(a.name)}\n[bold]B[/] {untrusted(b.name)}", highlight=False)
    for title, changes in (("header", d.header), ("summary", d.summary)):
        if not changes:
            out.print(f"{title}: identical")
            continue
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("field", "A", "B"):
            table.add_column(col, overflow="fold")
        for c in changes:
            table.add_row(untrusted(c.key), untrusted(c.a), untrusted(c.b))
        out.print(table)
    table = Table(title="outcome per attempt", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("#", "A", "B", ""):
        table.add_column(col)
    for p in d.attempts:
        table.add_row(str(p.index), _outcome(p.a) if p.a else "-", _outcome(p.b) if p.b else "-",
                      "[yellow]changed[/]" if p.changed else "")
    out.print(table)
    if d.code:
        out.print("best code:")
        out.print(Syntax(shown(d.code), "diff", theme="ansi_dark", background_color="default"))
    if d.code_note:
        out.print(f"best code: {d.code_note}")
    print_problems(a.problems + b.problems)


# ---------------------------------------------------------------------------------------------- view


@app.command("view")
def view(
    port: int = typer.Option(7575, "--port", "-p", help="port on 127.0.0.1 (0: any free port)"),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="address to bind (loopback only, unless --unsafe-host)"),
    unsafe_host: bool = typer.Option(False, "--unsafe-host", help="allow a non-loopback --host: anyone who "
                                                                  "can reach it sees every run"),
    export: Path = typer.Option(None, "--export",
                                help="write a static site to this folder instead of serving"),
    runs_dir: Path = RUNS_DIR,
    bench_dir: Path = BENCH_DIR,
) -> None:
    """A local web viewer: leaderboard, per-task charts, run timelines with transcripts and code."""
    from ..viewer import Site, export_site, serve

    site = Site(runs_dir, bench_dir)
    if export is not None:
        if export.exists() and not export.is_dir():
            raise UserError(f"{export}: exists and is not a folder")
        written = export_site(site, export)
        console.print(f"wrote {written} files to {export} (open {export / 'index.html'})", highlight=False,
                      markup=False)
        return
    if not is_loopback_host(host) and not unsafe_host:
        raise UserError(f"refusing to serve on {host}: runs hold prompts and code; pass --unsafe-host to "
                        "allow it")
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: must be 0-65535")
    try:
        server = serve(site, host=host, port=port)
    except OSError as exc:
        why = (
            "the port is in use (another viewer?)"
            if exc.errno == errno.EADDRINUSE
            else exc.strerror or str(exc)
        )
        raise UserError(
            f"cannot listen on {host}:{port}: {why}; pass another --port (--port 0: any free one)"
        ) from None
    console.print(f"coda-agent viewer on http://{host}:{server.server_address[1]}/ (Ctrl-C to stop)",
                  highlight=False)
    try:
        server.serve_forever()
    finally:
        server.server_close()
