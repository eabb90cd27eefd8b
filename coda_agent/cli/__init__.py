"""The ``coda-agent`` command line. Each command family lives in its own module and registers on ``app``."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from ..tasks.loader import TaskError

app = typer.Typer(
    name="coda-agent",
    help="LLM-driven authoring of fused GEMM-epilogue kernels (CODA / QuACK), checked against FP32 references.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        console.print(f"coda-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"),
) -> None:
    """LLM-driven authoring of fused GEMM-epilogue kernels (CODA / QuACK), checked against FP32 references."""


class UserError(Exception):
    """A problem the user can fix (bad argument, missing file); printed as one line, exit code 2."""


def main() -> None:
    """Entry point: user errors become one clear line, Ctrl-C exits 130, never a traceback for bad input.

    Typer's standalone mode handles usage errors, ``--help`` and ``typer.Exit`` codes; our own
    exceptions for bad input (TaskError, UserError) propagate out of it and are printed here.
    """
    try:
        app(standalone_mode=True)
    except (TaskError, UserError) as exc:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


# Command modules register themselves on `app` when imported; add new ones to this line.
from . import bench_cmd, run_cmd, store_cmd, tasks_cmd, verify_cmd  # noqa: E402, F401
