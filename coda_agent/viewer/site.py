"""The viewer's pages: every URL maps to HTML (or SVG/CSS) and has a JSON twin; the server and the static
export both go through :meth:`Site.get`, so what is exported is exactly what is served. A :class:`Page` writes
out the control characters of all its text: a run folder, task or model named with ``\x1b[31m`` shows that, on
any page.

Links are relative (``task/X.html`` from the leaderboard, ``../run/Y.html`` from a task page), so an
exported folder works from ``file://`` and from any static host. The viewer only reads: the index is
refreshed from the JSON on each request, the JSON is never written.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from ..store import leaderboard as lb
from ..store import leaderboard_text as lbt
from ..store.index import Index, RunRow, replayed_model
from ..store.records import Attempt, run_status
from ..store.rundir import RunFiles, iter_run_dirs, read_run
from ..store.timings import TimingPoint, timing_points
from ..tasks.loader import TaskError, find_task, load_task
from ..tasks.model import Task
from ..untrusted import shown
from . import plots

HERE = Path(__file__).parent
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")
_FORMATTER = HtmlFormatter(cssclass="hl")


def slug(name: str) -> str:
    """A URL- and file-safe key: the name itself when it is plain, else a stable hash."""
    return name if _SAFE.match(name) and not name.endswith((".html", ".json", ".svg")) else (
        "x-" + hashlib.sha1(name.encode()).hexdigest()[:16]
    )


def breakable(name: str) -> Markup:
    """A run name that may wrap only after its underscores, never inside its date or its id."""
    return Markup("_<wbr>").join(escape(part) for part in name.split("_"))


def highlight_python(code: str) -> Markup:
    """The code, highlighted and HTML-escaped by pygments, its controls written out first so that it lexes as
    shown."""
    return Markup(highlight(shown(code), PythonLexer(), _FORMATTER))


@dataclass(frozen=True)
class Page:
    """One response of the site, what the server sends and the export writes. Its text is made inert once,
    here, for every page: :func:`shown` writes out each control, escape and bidi character (``\\x1b``,
    ``\\u202e``), which commutes with the HTML, XML and JSON escaping the text already had, so a name, reason
    or reply from a record reads as text and does nothing, however it reached the page."""

    status: int
    content_type: str
    text: str

    @cached_property
    def body(self) -> bytes:
        return shown(self.text).encode()


def _json_page(data: Any, status: int = 200) -> Page:
    return Page(status, "application/json; charset=utf-8", json.dumps(data, indent=2, default=str))


#: Runs listed on the front page (newest first); each task's page lists all of its own.
RECENT_RUNS = 25


def _task_spec(name: str, recorded: Iterable[str | None] = ()) -> Task | None:
    """The task's definition: its file on this machine's task search path, else where one of its runs
    recorded it (a task a user keeps in a folder of their own read as missing: a manual seat)."""
    try:
        return find_task(name)
    except TaskError:
        pass
    for path in dict.fromkeys(p for p in recorded if p):
        try:
            task = load_task(path) if Path(path).is_file() else None
        except TaskError:
            continue
        if task is not None and task.name == name:
            return task
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _run_json(r: RunRow) -> dict[str, Any]:
    return {k: getattr(r, k) for k in RunRow.__dataclass_fields__} | {"slug": slug(r.dir)}


class Site:
    """Renders the pages of one runs folder and bench folder."""

    def __init__(self, runs_dir: Path, bench_dir: Path | None) -> None:
        self.runs_dir = runs_dir
        self.bench_dir = bench_dir
        self._lock = threading.Lock()
        self._pinned: Index | None = None
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=True, undefined=StrictUndefined,
            trim_blocks=True, lstrip_blocks=True,
        )
        self.env.globals.update(slug=slug, columns_for=lbt.columns_for, cell=lbt.cell,
                                summary_cell=lbt.summary_cell, summary_columns=lbt.SUMMARY_COLUMNS,
                                run_status=run_status)
        self.env.filters.update(breakable=breakable, us=lbt.fmt_us, ratio=lbt.fmt_ratio, money=lbt.fmt_money,
                                seconds=lbt.fmt_seconds, tokens=lbt.fmt_tokens, python=highlight_python,
                                headline=lbt.headline)

    @contextmanager
    def index(self) -> Iterator[Index]:
        """An up-to-date index (one shared snapshot while exporting)."""
        if self._pinned is not None:
            yield self._pinned
            return
        with self._lock:
            ix = Index.open(self.runs_dir, self.bench_dir)
            try:
                ix.refresh()
                yield ix
            finally:
                ix.close()

    @contextmanager
    def snapshot(self) -> Iterator[Index]:
        """Pin one refreshed index for a batch of pages (the static export)."""
        with self.index() as ix:
            self._pinned = ix
            try:
                yield ix
            finally:
                self._pinned = None

    # ---- routing

    def get(self, raw_path: str) -> Page:
        path = unquote(raw_path.split("?", 1)[0].split("#", 1)[0])
        if path in ("/", "/index.html"):
            return self.leaderboard_page()
        if path in ("/index.json", "/leaderboard.json"):
            return _json_page(self.leaderboard_data())
        if path == "/static/style.css":
            css = (HERE / "static" / "style.css").read_text() + _FORMATTER.get_style_defs(".hl")
            return Page(200, "text/css; charset=utf-8", css)
        if path == "/plots/speedup.svg":
            with self.index() as ix:
                board = lb.build(ix)
            svg = plots.summary_chart(board, "Speedup by task (latest version, one device per task)")
            return Page(200, "image/svg+xml", svg)
        m = re.fullmatch(r"/(task|run|plots/task)/([^/]+?)(\.html|\.json|\.svg)?", path)
        if m:
            kind, key, ext = m.group(1), m.group(2), m.group(3) or ".html"
            if kind == "task" and ext in (".html", ".json"):
                return self.task_page(key, ext == ".json")
            if kind == "run" and ext in (".html", ".json"):
                return self.run_page(key, ext == ".json")
            if kind == "plots/task" and ext == ".svg":
                return self.task_chart(key)
        return self.not_found(f"no page at {path}", path.endswith(".json"))

    def paths(self) -> list[str]:
        """Every page of the site, for the static export."""
        with self.index() as ix:
            tasks = ix.tasks()
        # header-less ones too: their page names the problem
        runs = [d.name for d in iter_run_dirs(self.runs_dir)]
        out = ["/index.html", "/index.json", "/static/style.css", "/plots/speedup.svg"]
        for t in tasks:
            out += [f"/task/{slug(t)}.html", f"/task/{slug(t)}.json", f"/plots/task/{slug(t)}.svg"]
        for r in runs:
            out += [f"/run/{slug(r)}.html", f"/run/{slug(r)}.json"]
        return out

    def _render(self, template: str, status: int = 200, **ctx: Any) -> Page:
        html = self.env.get_template(template).render(**ctx)
        return Page(status, "text/html; charset=utf-8", html)

    def not_found(self, message: str, as_json: bool = False) -> Page:
        if as_json:
            return _json_page({"error": message}, 404)
        return self._render("not_found.html", 404, root="/", title="Not found", message=message,
                            json_url=None)

    # ---- leaderboard

    def leaderboard_data(self) -> dict[str, Any]:
        with self.index() as ix:
            board = lb.build(ix)
            runs = ix.runs()
        data = json.loads(lbt.to_json(board))
        data["summary"] = [r.model_dump() for r in lb.summarize(board)]
        data["runs"] = [_run_json(r) for r in reversed(runs)]
        return data

    def leaderboard_page(self) -> Page:
        with self.index() as ix:
            board = lb.build(ix)
            runs = list(reversed(ix.runs()))
        return self._render(
            "leaderboard.html", root="", title="Leaderboard", board=board, summary=lb.summarize(board),
            runs=runs, recent_runs=RECENT_RUNS, runs_dir=str(self.runs_dir),
            bench_dir=str(self.bench_dir), json_url="index.json",
            has_timing=any(g.timed for g in board.groups), untimed_note=lbt.untimed_note(board),
            bench_note=lbt.missing_bench_note(self.bench_dir), no_attempts_note=lbt.no_attempts_note(board),
        )

    # ---- task

    def _task_name(self, ix: Index, key: str) -> str | None:
        return next((t for t in ix.tasks() if slug(t) == key), None)

    def task_page(self, key: str, as_json: bool) -> Page:
        with self.index() as ix:
            name = self._task_name(ix, key)
            if name is None:
                return self.not_found(f"no runs or bench results for task {key!r}", as_json)
            board = lb.build(ix, task=name)
            runs = list(reversed(ix.runs(name)))
        spec = _task_spec(name, (r.task_path for r in reversed(runs)))
        if as_json:
            data = json.loads(lbt.to_json(board))
            definition = {"definition": spec.describe() if spec else None}
            return _json_page({"task": name, **definition, **data, "runs": [_run_json(r) for r in runs]})
        return self._render(
            "task.html", root="../", title=name, task=name, board=board, runs=runs,
            json_url=f"{slug(name)}.json", has_timing=any(g.timed for g in (*board.groups, *board.apart)),
            spec=spec, untimed_note=lbt.untimed_note(board),
            reference_source=_read(spec.reference_file) if spec else None,
            human_source=_read(spec.human_file) if spec and spec.human_file else None,
        )

    def task_chart(self, key: str) -> Page:
        with self.index() as ix:
            name = self._task_name(ix, key)
            if name is None:
                return Page(404, "image/svg+xml", plots.speedup_chart([], f"no task {key}"))
            board = lb.build(ix, task=name)
        svg = plots.speedup_chart([*board.groups, *board.apart], f"{name}: human vs models vs baselines")
        return Page(200, "image/svg+xml", svg)

    # ---- run

    def run_page(self, key: str, as_json: bool) -> Page:
        run_dir = next((d for d in iter_run_dirs(self.runs_dir) if slug(d.name) == key), None)
        if run_dir is None:
            return self.not_found(f"no run {key!r} in {self.runs_dir}", as_json)
        rf = read_run(run_dir)
        if as_json:
            return _json_page(rf.as_json())
        author, replay_of = replayed_model(rf.header.model, self.runs_dir) if rf.header else ("", None)
        return self._render("run.html", root="../", title=rf.name, **run_context(rf), json_url=f"{key}.json",
                            author=author, replay_of=replay_of)


POINT_COLUMNS = [("candidate", "median_us"), ("human", "human_us"), ("eager", "eager_us"),
                 ("torch.compile", "compiled_us"), ("cuBLAS", "cublas_us"), ("SoL", "sol_us")]


@dataclass
class AttemptView:
    """What the run page shows for one attempt."""

    attempt: Attempt
    offset: float | None  # seconds since the run started
    seconds: float
    reason: str
    points: list[tuple[str, TimingPoint]]  # per shape: the candidate and what its session measured next to it
    point_columns: list[tuple[str, str]]  # (header, TimingPoint field) of the columns that hold any number
    facts: list[tuple[str, str]]  # other timing figures: geomean, ratios, durations, verifier timings
    is_best: bool


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += _flat(v, key + ".")
        elif isinstance(v, float):
            out.append((key, f"{v:.4g}"))
        else:
            out.append((key, json.dumps(v) if isinstance(v, list | dict) else str(v)))
    return out


def run_context(rf: RunFiles) -> dict[str, Any]:
    summary = rf.effective_summary()
    start = rf.header.created if rf.header else (rf.attempts[0].started if rf.attempts else None)
    views: list[AttemptView] = []
    for a in rf.attempts:
        try:
            offset = (a.started - start).total_seconds() if start else None
        except TypeError:  # one aware, one naive timestamp
            offset = None
        reason = a.reason
        points = [(k or "unnamed shape", p) for k, p in timing_points(a.timing).items()]
        rest = {k: v for k, v in a.timing.items() if k not in ("shapes", "rows") or not points}
        facts = _flat(rest) + _flat(a.durations, "seconds ")
        if a.verdict:
            facts += _flat(dict(a.verdict.timings), "verifier ")
        columns = [(h, f) for h, f in POINT_COLUMNS if any(getattr(p, f) is not None for _, p in points)]
        views.append(AttemptView(a, offset, max(0.0, (a.finished - a.started).total_seconds()), reason,
                                 points, columns, facts, a.index == summary.best_attempt))
    span = max([(v.offset or 0) + v.seconds for v in views] + [summary.wall_seconds or 0, 1e-9])
    return {"run": rf, "summary": summary, "attempts": views, "span": span}
