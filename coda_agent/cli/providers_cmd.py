"""``coda-agent providers``: what the provider registry holds, so ``--model`` never has to be guessed."""

from __future__ import annotations

import json

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from ..providers import ProviderEntry, registered
from ..verifier.sandbox import UNSANDBOXED_OPT_IN
from .core import UserError, app, print_table


def needs(entry: ProviderEntry) -> str:
    """What the provider needs, with the OS sandbox that ``run`` asks of every real model."""
    if not entry.real_model:
        return entry.needs
    return f"{entry.needs}; bubblewrap, the OS sandbox (or {UNSANDBOXED_OPT_IN}=1)"


@app.command("providers")
def list_providers(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """List the model providers: how to write each --model, what it is, what it needs."""
    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format {fmt!r}: use table or json")
    entries = registered()
    if fmt == "json":
        rows = [
            {"name": e.name, "spec": e.usage, "help": e.help, "needs": needs(e), "options": sorted(e.options),
             "sandbox_required": e.real_model, "replays_a_run": e.replays_a_run}
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("--model", no_wrap=True)
    for col in ("what", "needs"):
        table.add_column(col)
    for e in entries:
        table.add_row(escape(e.usage), escape(e.help), escape(needs(e)))
    print_table(table)
