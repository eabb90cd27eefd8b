"""``coda-agent tasks`` and ``coda-agent validate``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..tasks.loader import DEFAULT_TASK_DIR, load_tasks, task_files
from ..tasks.validate import validate_path
from . import app, console


@app.command("tasks")
def list_tasks(
    paths: list[Path] = typer.Argument(None, help="task files or folders (default: the built-in suite)"),
    shapes: str = typer.Option("bench", help="which shape set to show"),
) -> None:
    """List tasks: name, family, version, launch budget and shapes."""
    tasks = load_tasks(paths or [DEFAULT_TASK_DIR])
    table = Table(title=f"{len(tasks)} tasks", show_lines=True)
    for col in ("task", "family", "v", "launches", f"{shapes} shapes"):
        table.add_column(col, overflow="fold")
    for t in sorted(tasks, key=lambda t: (t.family, t.name)):
        points = t.shapes.get(shapes, [])
        table.add_row(
            t.name, t.family, str(t.version), str(t.launch_budget),
            "\n".join(f"{p.name}: " + " ".join(f"{k}={v}" for k, v in p.dims.items()) for p in points),
        )
    console.print(table)


@app.command("validate")
def validate(paths: list[Path] = typer.Argument(None, help="task files or folders (default: the built-in suite)")) -> None:
    """Check task files: schema, reference runs on the small shapes (CPU), output shapes/dtypes, non-degeneracy."""
    files = task_files(paths or [DEFAULT_TASK_DIR])
    if not files:
        console.print("no task files found")
        raise typer.Exit(1)
    failed = 0
    for f in files:
        report = validate_path(f)
        if report.ok:
            console.print(f"[green]ok[/]    {f}")
        else:
            failed += 1
            console.print(f"[red]FAIL[/]  {f}")
            for p in report.problems:
                console.print(f"      {p}", highlight=False)
    console.print(f"{len(files) - failed}/{len(files)} task files valid")
    if failed:
        raise typer.Exit(1)


@app.command("api-doc")
def api_doc(out: Path = typer.Option(None, "--out", "-o", help="write to a file instead of stdout")) -> None:
    """Print the primitive API reference given to LLMs (generated from the docstrings)."""
    from ..prompts.api_reference import api_reference

    text = api_reference()
    if out:
        out.write_text(text)
        console.print(f"wrote {out}")
    else:
        print(text)
