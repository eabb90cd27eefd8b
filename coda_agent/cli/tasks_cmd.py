"""``coda-agent tasks`` and ``coda-agent validate``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from ..atomic import write_text_atomic
from ..tasks.loader import TASKS_ENV, TaskError, discover_task_files, find_task, load_task, task_files
from ..tasks.model import Task
from .core import UserError, app, console, err_console, print_table, untrusted, wide_console
from .inputs import note_skipped

SEARCH_HELP = f"task names, files or folders (default: the built-in suite, then ${TASKS_ENV}, then ./tasks)"


def _located(paths: list[Path] | None) -> list[tuple[str, Path]]:
    """(where it comes from, file) for the files, folders or task names asked for, or for every task file on
    the search path (a copy of a task's file name in a later folder too); a folder's YAML files that are no
    tasks are skipped with one line each."""
    skipped: list[str] = []
    if not paths:
        listed = [(source.label, path) for source, path in discover_task_files(skipped, every=True)]
        note_skipped(skipped)
        return listed
    found: list[tuple[str, Path]] = []
    for p in paths:
        by_name = not p.exists() and p.suffix not in (".yaml", ".yml") and p.name == str(p)
        found += [("argument",
                   f) for f in ([find_task(str(p)).path] if by_name else task_files([p], skipped))]
    note_skipped(skipped)
    return found


@app.command("tasks")
def list_tasks(
    paths: list[Path] = typer.Argument(None, help=SEARCH_HELP, metavar="PATH"),
    shapes: str = typer.Option("bench", help="which shape set to show"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """List tasks: name, family, version, launch budget, shapes and where each comes from.

    A task file that does not load is an error, as for ``run``: one line each, the others listed, exit 2."""
    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format {fmt!r}: use table or json")
    located, unreadable = [], []
    for source, path in _located(paths):
        try:
            located.append((source, load_task(path)))
        except TaskError as exc:  # one bad file in a folder hides none of the others
            first, *more = str(exc).splitlines()  # the file, and its first mistake
            unreadable.append(first
                              + (f": {more[0].strip()}{'; ...' if len(more) > 1 else ''}" if more else ""))
    for why in unreadable:
        err_console.print(f"[bold red]error:[/] {untrusted(why)} (`coda-agent validate` says more)",
                          highlight=False)
    if not located:
        if unreadable:
            raise typer.Exit(2)
        raise UserError(f"no task files (*.yaml) in {', '.join(map(str, paths or []))}")
    if not any(shapes in t.shapes for _, t in located):
        sets = sorted({name for _, t in located for name in t.shapes})
        raise UserError(f"no task has a shape set {shapes!r} (shape sets: {', '.join(sets)})")
    shadows = _shadows(located)
    located.sort(key=lambda st: (st[1].family, st[1].name))
    if fmt == "json":
        rows = [
            {
                "name": t.name, "family": t.family, "version": t.version, "launch_budget": t.launch_budget,
                "source": source, "path": str(t.path), "human": str(t.human_file) if t.human_file else None,
                "task_hash": t.content_hash, "shadows": shadows.get(t.path),
                "shapes": {k: [p.model_dump() for p in v] for k, v in t.shapes.items()},
            }
            for source, t in located
        ]
        print(json.dumps(rows, indent=2))
    else:
        _print_table(located, shapes, shadows)
    if unreadable:
        raise typer.Exit(2)


def _shadows(located: list[tuple[str, Task]]) -> dict[Path, str]:
    """For each task that shares its name with another, what running it by name does (``find_task``): the
    first found where they are the same task; where they differ, the name is refused and each is run by its
    path."""
    first: dict[str, Task] = {}
    notes = {}
    for _, t in located:
        earlier = first.setdefault(t.name, t)
        if earlier is t:
            continue
        if earlier.content_hash == t.content_hash:
            notes[t.path] = f"the same task as {earlier.path}"
        else:
            notes[t.path] = f"differs from {earlier.path} of the same name: run each by its path"
            notes.setdefault(earlier.path, f"differs from {t.path} of the same name: run each by its path")
    return notes


def _print_table(located: list[tuple[str, Task]], shapes: str, shadows: dict[Path, str]) -> None:
    table = Table(title=f"{len(located)} task{'s' if len(located) != 1 else ''}", show_lines=True)
    for col in ("task", "family", "v", "budget"):
        table.add_column(col, no_wrap=True)
    table.add_column(f"{shapes} shapes", ratio=2)
    table.add_column("from", ratio=1)
    for source, t in located:
        points = t.shapes.get(shapes, [])
        table.add_row(
            t.name, t.family, str(t.version), str(t.launch_budget),
            untrusted("\n".join(f"{p.name}: "
                                + " ".join(f"{k}={v}" for k, v in p.dims.items()) for p in points) or "-"),
            untrusted((source if source == "built-in" else f"{source}: {t.path.parent}")
                      + (f"\n{shadows[t.path]}" if t.path in shadows else "")),
        )
    print_table(table, ("family",))  # where a task comes from stays: a long folder makes the table wider


@app.command("validate")
def validate(paths: list[Path] = typer.Argument(None, help=SEARCH_HELP, metavar="PATH")) -> None:
    """Check task files: schema, reference runs on the small shapes (CPU), output shapes/dtypes,
    non-degeneracy."""
    from ..tasks.validate import validate_path

    files = [path for _, path in _located(paths)]
    if not files:  # a setup error, as in `tasks`: one line, exit 2
        raise UserError(f"no task files (*.yaml) in {', '.join(map(str, paths or []))}")
    failed = 0
    out = wide_console()
    for f in files:
        report = validate_path(f)
        if report.ok:
            out.print(f"[green]ok[/]    {untrusted(str(f))}")
            for note in report.notes:
                out.print(f"      note: {untrusted(note)}", highlight=False)
        else:
            failed += 1
            out.print(f"[red]FAIL[/]  {untrusted(str(f))}")
            for p in report.problems:
                for line in p.splitlines():
                    out.print(f"      {untrusted(line)}", highlight=False)
    out.print(f"{len(files) - failed}/{len(files)} task files valid")
    if failed:
        raise typer.Exit(1)


@app.command("api-doc")
def api_doc(out: Path = typer.Option(None, "--out", "-o", help="write to a file instead of stdout")) -> None:
    """Print the primitive API reference given to LLMs (generated from the docstrings)."""
    from ..prompts.api_reference import api_reference

    text = api_reference()
    if out:
        write_text_atomic(out, text)
        console.print(f"wrote {out}")
    else:
        print(text)


@app.command("prompt")
def prompt_cmd(
    task: str = typer.Argument(..., help="task name or YAML path"),
    no_compile: bool = typer.Option(False, "--no-compile",
                                    help="as `run --no-compile` (CPU: no sm_90a stage)"),
    examples: str = typer.Option(None, help="as `run --examples`: tasks whose human kernels are shown"),
    examples_from: list[Path] = typer.Option(None, "--examples-from", metavar="PATH",
                                             help="as `run --examples-from` (repeatable)"),
    out: Path = typer.Option(None, "--out", "-o", help="write to a file instead of stdout"),
) -> None:
    """Print the first prompt `run` sends a model on TASK on this machine (system message, then the task);
    no model is called and nothing is recorded. A timed run adds the human kernel's GPU times it measures."""
    from ..agent.loop import first_messages
    from .inputs import check_task_runs, example_places
    from .run_cmd import RunOptions

    t = find_task(task)
    check_task_runs(t)
    options = RunOptions(no_compile=no_compile, examples=examples,
                         examples_from=example_places(examples_from or []))
    text = "\n\n".join(f"===== {m.role} =====\n\n{m.content.rstrip()}"
                       for m in first_messages(t, options.config(t, "prompt"))) + "\n"
    if out:
        write_text_atomic(out, text)
        console.print(f"wrote {out}")
    else:
        print(text, end="")
