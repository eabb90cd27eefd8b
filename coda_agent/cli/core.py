"""What every command of the ``coda-agent`` command line shares: the app the command modules register on, the
consoles they print with, outcome colours, table printing and the one-line error; the package imports them."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.markup import escape
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup

from ..store.outcomes import AttemptOutcome
from ..tasks.loader import TaskError
from ..untrusted import shown

if TYPE_CHECKING:
    from ..verifier.sandbox import Sandbox


class _PlainHelp:
    """Help without typer's annotation types where they read as code: ``<bool>`` on flags (``--no-compile``,
    ``--help``), ``<list[Path]>`` on repeated arguments (their metavar, e.g. ``PATH``, says it)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
            elif isinstance(p, TyperArgument) and p.nargs != 1 and p.metavar is not None:
                setattr(p, "display_type_rich", lambda ctx: None)  # noqa: B010 - one instance, not the class
        return params


class _Command(_PlainHelp, TyperCommand):
    pass


class _Group(_PlainHelp, TyperGroup):
    pass


class CliApp(typer.Typer):
    """A Typer whose commands and groups use the help tweaks above."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


app = CliApp(
    name="coda-agent",
    help="LLM-driven authoring of fused GEMM-epilogue kernels (CODA / QuACK), checked against FP32 "
         "references.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _Inert(RenderHook):
    """The last word of a console on all it prints: each control, escape and bidi character of the text
    written out (:func:`shown`), whichever command or table put it there (a run folder's name, a path, a
    model's); rich's own colour and cursor codes are kept apart from the text and pass. Text from a model or a
    candidate is made inert where it is put in (:func:`untrusted`) as well, so that tables measure it as it is
    shown."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_InertRenderable(r) for r in renderables]


class _InertRenderable:
    def __init__(self, inner: ConsoleRenderable) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            yield segment if segment.control else Segment(shown(segment.text), segment.style)


def terminal(**options: Any) -> Console:
    """A console for the commands to print with, the only kind they make. Every line is printed whole
    (``soft_wrap``): a path, a run id or a reason is never broken in a file or pipe, and a terminal wraps it
    as it wraps any long line; tables still fit the width and wrap their cells themselves. Nothing it prints
    holds a raw control character."""
    out = Console(soft_wrap=True, **options)
    out.push_render_hook(_Inert())
    return out


console = terminal()
err_console = terminal(stderr=True)


#: The colour of each attempt outcome in every command: green passed, red the candidate's own failures,
#: magenta when the provider or the harness failed (not the candidate), yellow when there was no code to
#: check.
OUTCOME_STYLE: dict[AttemptOutcome, str] = {
    AttemptOutcome.PASSED: "green",
    AttemptOutcome.STATIC_REJECTED: "red",
    AttemptOutcome.COMPILE_ERROR: "red",
    AttemptOutcome.RUNTIME_ERROR: "red",
    AttemptOutcome.WRONG_OUTPUT: "red",
    AttemptOutcome.CHEAT_DETECTED: "red",
    AttemptOutcome.OVER_LAUNCH_BUDGET: "red",
    AttemptOutcome.TIMEOUT: "red",
    AttemptOutcome.CRASH: "red",
    AttemptOutcome.INFRA_ERROR: "magenta",
    AttemptOutcome.PROVIDER_ERROR: "magenta",
    AttemptOutcome.NO_CODE: "yellow",
    AttemptOutcome.UNVERIFIED: "yellow",
}


#: The colour of a run's status tone (:func:`coda_agent.store.records.run_status`), as the viewer shows it.
TONE_STYLE = {"ok": "green", "bad": "red", "warn": "yellow", "running": "cyan"}


def outcome_style(outcome: str) -> str:
    """The style of an attempt's or a stage's outcome (by value: a verifier ``Outcome`` reads the same)."""
    return OUTCOME_STYLE[AttemptOutcome(outcome)]


def untrusted(text: str) -> str:
    """Text from a model or a candidate (a reason, a reply, an error), ready to put in a rich markup string:
    controls and escape sequences written out (:func:`coda_agent.untrusted.shown`), and rich's ``[markup]``
    escaped."""
    return escape(shown(text))


#: The width of every command's tables and lines in a file or pipe, unless ``COLUMNS`` says otherwise: wide
#: enough that the rows of ``tasks``, ``leaderboard`` and ``providers`` stay whole, narrow enough to read.
PIPE_WIDTH = 160


def pipe_width() -> int:
    """``$COLUMNS`` when it is a number, else :data:`PIPE_WIDTH`."""
    raw = os.environ.get("COLUMNS", "")
    return int(raw) if raw.isdigit() and int(raw) >= 40 else PIPE_WIDTH


def wide_console() -> Console:
    """Where every command prints its tables: the terminal as it is; a file or pipe at :func:`pipe_width`
    columns. Tables wrap their cells at spaces; identifier columns (names, specs, ids) are ``no_wrap`` so no
    token is cut."""
    return console if console.is_terminal else terminal(width=pipe_width())


def print_table(table: Table, droppable: Sequence[str] = (), out: Console | None = None) -> None:
    """Print ``table`` whole at the width it has: where even its cells wrapped at spaces would not fit, the
    ``droppable`` columns go, least useful first, and a line says which; a table still too wide is printed
    wider than the terminal rather than cut mid-token (rich would fold a name into slivers or end it in an
    ellipsis)."""
    out = out or wide_console()
    dropped: list[str] = []
    for header in droppable:
        if _least_width(table) <= out.width:
            break
        column = next((c for c in table.columns if c.header == header), None)
        if column is not None:
            table.columns.remove(column)
            dropped.append(header)
    # rich shares a narrow table's width out by ratio, ending long words in an ellipsis
    for column in table.columns:
        column.min_width = max(column.min_width or 0, _column_need(column))
    need = _least_width(table)
    if need > out.width:
        out = terminal(file=out.file, width=need, force_terminal=out.is_terminal, no_color=out.no_color)
    out.print(table)
    if dropped:
        out.print(f"[dim]({out.width} columns leave out {', '.join(dropped)}; a wider terminal shows "
                  "them)[/]",
                  highlight=False)


def _least_width(table: Table) -> int:
    """The fewest columns ``table`` takes with no token cut: its no_wrap cells whole, the others wrapped at
    spaces (rich's own measure lets a no_wrap cell end in an ellipsis)."""
    _, right, _, left = table.padding
    widths = [_column_need(col) + left + right for col in table.columns]
    frame = (len(widths) - 1 + 2 * table.show_edge) if table.box else 0
    return sum(widths) + frame


def _column_need(column: Column) -> int:
    """The columns a table column's text needs: its longest line where it may not wrap, else its longest
    word."""
    def need(cell: object) -> int:
        text = cell if isinstance(cell, Text) else Text.from_markup(cell) if isinstance(cell, str) else None
        if text is None:
            return 1
        parts = text.plain.splitlines() if column.no_wrap else text.plain.split()
        return max((cell_len(p) for p in parts), default=0)

    return max(need(c) for c in (column.header, *column.cells))


def _print_version(value: bool) -> None:
    if value:
        from .. import version_line

        console.print(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """LLM-driven authoring of fused GEMM-epilogue kernels (CODA / QuACK), checked against FP32 references."""


class UserError(Exception):
    """A problem the user can fix (bad argument, missing file); printed as one line, exit code 2."""


def refuse_without_runners() -> Sandbox:
    """The runners' sandbox, or :class:`UserError` with the one line that says why no runner can start here
    (as root, where ``nobody`` cannot read Python) and what to do: before a command that verifies anything."""
    from ..verifier.sandbox import detect

    box = detect()
    if box.refused:
        raise UserError(box.refused)
    return box


def main() -> None:
    """Entry point: user errors become one clear line, Ctrl-C exits 130, never a traceback for bad input.

    Typer's standalone mode handles usage errors, ``--help`` and ``typer.Exit`` codes; our own
    exceptions for bad input (TaskError, UserError) propagate out of it and are printed here.
    """
    try:
        app(standalone_mode=True)
    except (TaskError, UserError) as exc:
        err_console.print(f"[bold red]error:[/] {untrusted(str(exc))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)

