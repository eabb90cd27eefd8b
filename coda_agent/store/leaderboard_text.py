"""The leaderboard as people read it: the table cells, the notes beside it, and its JSON, CSV and Markdown.

:mod:`.leaderboard` computes the board (groups, entries, the summary's geometric means); this module only
words and formats it, for the CLI (``coda-agent leaderboard``) and the viewer alike.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..untrusted import shown
from .leaderboard import Entry, Group, Leaderboard, SummaryRow, summarize


def missing_bench_note(bench_dir: Path | None) -> str:
    """One line when the bench folder holds no results ("" when it does): without them the leaderboard has no
    human-kernel or baseline rows. They are files of the git checkout (``bench/results/``), not of the
    wheel."""
    if bench_dir is not None and bench_dir.is_dir() and any(bench_dir.glob("*.json")):
        return ""
    gone = " (no such folder)" if bench_dir is not None and not bench_dir.exists() else ""
    return (f"no bench results found in {bench_dir}{gone} (so no human-kernel or baseline rows); they ship "
            "with the git checkout (bench/results/), not the wheel: pass --bench-dir or set "
            "CODA_AGENT_BENCH_DIR")



def untimed_note(board: Leaderboard) -> str:
    """One line saying why some correct rows have no speed to compare ("" when every one is timed): runs on a
    machine without a GPU are checked for correctness on the CPU emulator and never timed."""
    untimed = {g.device for g in (*board.groups, *board.apart)
               if g.shape is None and any(e.kind != "baseline" and e.correct for e in g.entries)}
    if not untimed:
        return ""
    cpu = sorted(d for d in untimed if d.casefold() == "cpu")
    gpu = sorted(untimed - set(cpu))
    parts = []
    if cpu:
        parts.append("runs on cpu have no GPU to time them (the emulator checks correctness only)")
    if gpu:
        parts.append(f"runs on {', '.join(gpu)} did not time their candidates (no profile stage)")
    return ("Speed not compared: " + "; ".join(parts) + ", so those rows show correctness and cost only; "
            "the human kernel's and the baselines' times come from a GPU (`coda-agent run` or `bench` on "
            "one).")



def no_attempts_note(board: Leaderboard) -> str:
    """One line naming the runs left out because they ended before their first attempt ("" when none did)."""
    if not board.no_attempts:
        return ""
    n = len(board.no_attempts)
    return (f"not counted: {n} run{'s' if n != 1 else ''} with no attempts (ended before the first, e.g. on "
            f"a provider's set-up error): {', '.join(board.no_attempts)}")



SUMMARY_COLUMNS: list[tuple[str, str]] = [
    ("task", "task"), ("device", "device"), ("author", "author"), ("correct", "correct"),
    ("shapes", "shapes"), ("×eager", "vs_eager"), ("×compile", "vs_compiled"), ("×cuBLAS", "vs_cublas"),
    ("×human", "vs_human"), ("%SoL", "pct_sol"), ("runs ok", "runs"), ("$", "cost_usd"),
]



def summary_cell(r: SummaryRow, key: str) -> str:
    """One summary row's value for a SUMMARY_COLUMNS key, as text."""
    match key:
        case "task":
            return (
                f"{r.task} v{r.task_version}"
                + (f" ({r.content})" if r.content else "")
                + (" (old version)" if r.apart_why == "old version" else "")
            )
        case "device":
            return r.device + (" (not compared)" if r.apart_why == "other device" else "")
        case "author":
            return r.author
        case "correct":
            return "-" if r.correct is None else "yes" if r.correct else "no"
        case "shapes":
            return f"{r.shapes}/{r.of_shapes}" if r.of_shapes else "untimed"
        case "vs_eager" | "vs_compiled" | "vs_cublas" | "vs_human":
            return fmt_ratio(getattr(r, key))
        case "pct_sol":
            return fmt_pct(r.pct_sol)
        case "runs":
            return f"{r.correct_runs}/{r.runs}" if r.runs else "-"
        case "cost_usd":
            return fmt_money(r.cost_usd, r.cost_known)
    raise KeyError(key)



def summary_json(board: Leaderboard) -> str:
    return json.dumps({
        "summary": [r.model_dump() for r in summarize(board)],
        "problems": [{"file": p.file, "message": p.message} for p in board.problems],
        "no_attempts": board.no_attempts,
    }, indent=2)



def summary_csv(board: Leaderboard) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(SummaryRow.model_fields), lineterminator="\n")
    w.writeheader()
    for r in summarize(board):
        w.writerow(_csv_row(r.model_dump()))
    return out.getvalue()



def summary_markdown(board: Leaderboard) -> str:
    lines = ["# Leaderboard (summary: geometric means over the timed shapes)", ""]
    rows = summarize(board)
    if not rows:
        lines += ["No run records or bench results yet.", ""]
    else:
        lines.append("| " + " | ".join(h for h, _ in SUMMARY_COLUMNS) + " |")
        lines.append("|" + "|".join("---" if k in ("task", "device",
                                                   "author") else "--:" for _, k in SUMMARY_COLUMNS) + "|")
        lines += ["| " + " | ".join(_md_escape(summary_cell(r, k)) for _, k in SUMMARY_COLUMNS)
                  + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)



def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:,.0f}"



def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"



def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"



def fmt_tokens(v: int | None) -> str:
    if not v:
        return "-"
    return f"{v / 1e6:.2f}M" if v >= 1_000_000 else f"{v / 1e3:.1f}k" if v >= 1000 else str(v)



def fmt_money(v: float | None, known: bool = True) -> str:
    """Dollars; a cost that is not known (a model missing from the price table) is "unpriced", never $0."""
    if not known:
        return "unpriced"
    if v is None:
        return "-"
    return "$0" if v == 0 else f"${v:.2f}" if v >= 0.01 else f"${v:.4f}"



def fmt_seconds(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 60:
        return f"{v:.1f}s"
    m, s = divmod(round(v), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"



def headline(text: str, width: int = 110) -> str:
    """The first line of a reason (with the next one when the first only introduces it), clipped; where the
    reason ends in the error a call raised (a traceback's last line), that error first (a manual seat's
    `show` read "forward() raised at shape tiny {...}: line 13: lg = gemm(…" and never the error)."""
    # a candidate's words: controls made inert
    lines = [x.strip() for x in shown(text).splitlines() if x.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 2 and _RAISED.match(lines[-1]):
        line = f"{lines[-1]} ({lines[0].rstrip(':')})"
    else:
        line = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return line if len(line) <= width else line[: width - 1] + "…"


#: A traceback's last line: the error's type, then its message.
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")



def fmt_correct(e: Entry) -> str:
    return "" if e.correct is None else "yes" if e.correct else "no"



def fmt_runs(e: Entry) -> str:
    return f"{e.correct_runs}/{e.runs}" if e.runs else "-"


# (header, Entry key, needs timing) for the text formats
COLUMNS: list[tuple[str, str, bool]] = [
    ("author", "author", False),
    ("correct", "correct", False),
    ("time µs", "time_us", True),
    ("×eager", "vs_eager", True),
    ("×compile", "vs_compiled", True),
    ("×human", "vs_human", True),
    ("%SoL", "pct_sol", True),
    ("runs ok", "runs", False),
    ("rounds", "rounds", False),
    ("attempts", "attempts", False),
    ("tokens", "tokens", False),
    ("$", "cost_usd", False),
    ("1st correct", "seconds_to_first_correct", False),
]



def cell(e: Entry, key: str) -> str:
    """One entry's value for a COLUMNS key, as text."""
    match key:
        case "author":
            return e.author
        case "correct":
            return fmt_correct(e)
        case "time_us":
            return fmt_us(e.time_us)
        case "vs_eager" | "vs_compiled" | "vs_human":
            return fmt_ratio(getattr(e, key))
        case "pct_sol":
            return fmt_pct(e.pct_sol)
        case "runs":
            return fmt_runs(e)
        case "rounds" | "attempts":
            v = getattr(e, key)
            return "-" if v is None else str(v)
        case "tokens":
            return fmt_tokens(e.tokens)
        case "cost_usd":
            return fmt_money(e.cost_usd, e.cost_known)
        case "seconds_to_first_correct":
            s = fmt_seconds(e.seconds_to_first_correct)
            return f"{s} (#{e.first_correct_attempt})" if e.first_correct_attempt and s != "-" else s
    raise KeyError(key)



def columns_for(group: Group) -> list[tuple[str, str]]:
    return [(h, k) for h, k, timed in COLUMNS if group.timed or not timed]



def to_json(board: Leaderboard) -> str:
    data = {
        "groups": [_group_json(g) for g in board.groups],
        "apart": [_group_json(g) for g in board.apart],
        "problems": [{"file": p.file, "message": p.message} for p in board.problems],
        "no_attempts": board.no_attempts,
    }
    return json.dumps(data, indent=2)



def _group_json(g: Group) -> dict[str, object]:
    return {**g.model_dump(), "timed": g.timed}



CSV_FIELDS = ["section", "task", "task_version", "task_hash", "device", "shape", *Entry.model_fields]



def to_csv(board: Leaderboard) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for section, groups in (("main", board.groups), ("apart", board.apart)):
        for g in groups:
            for e in g.entries:
                w.writerow(_csv_row({"section": section, "task": g.task, "task_version": g.task_version,
                                     "task_hash": g.task_hash or "", "device": g.device,
                                     "shape": g.shape or "", **e.model_dump()}))
    return out.getvalue()



def _md_escape(text: str) -> str:
    return shown(text).replace("|", "\\|").replace("\n", " ")



def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the CSV output, whose text (a reason, a model name) may come from a model or a candidate."""
    return {k: shown(v) if isinstance(v, str) else v for k, v in row.items()}



def _md_groups(groups: Iterable[Group], level: str) -> list[str]:
    lines: list[str] = []
    for g in groups:
        cols = columns_for(g)
        lines += [f"{level} {_md_escape(g.title)}", ""]
        lines.append("| " + " | ".join(h for h, _ in cols) + " |")
        lines.append("|" + "|".join("---" if k == "author" else "--:" for _, k in cols) + "|")
        for e in g.entries:
            lines.append("| " + " | ".join(_md_escape(cell(e, k)) for _, k in cols) + " |")
        lines.append("")
    return lines



def to_markdown(board: Leaderboard) -> str:
    lines = ["# Leaderboard", ""]
    if board.empty:
        lines += ["No run records or bench results yet.", ""]
    lines += _md_groups(board.groups, "##")
    if board.apart:
        lines += ["## Other versions / devices (not compared with the tables above)", ""]
        lines += _md_groups(board.apart, "###")
    if board.problems:
        lines += ["## Files that could not be read", ""]
        lines += [f"- `{p.file}`: {_md_escape(p.message)}" for p in board.problems]
        lines.append("")
    return "\n".join(lines)
