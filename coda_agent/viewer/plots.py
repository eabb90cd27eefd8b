"""Hand-rolled SVG bar charts (no plotting dependency): speedup vs eager per task, human vs models vs
baselines.

Each section of a chart is one leaderboard group (same task version, device and shape) with its own
scale; sections are never drawn on a shared axis, since their numbers are not comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from ..store.leaderboard import BASELINES, Entry, Group, Leaderboard
from ..store.leaderboard_text import fmt_ratio, fmt_us
from ..store.ranking import geomean

COLOURS = {"human": "#2563eb", "model": "#ea7a1a", "baseline": "#9ca3af", "sol": "#4b5563"}
WIDTH = 760
LABEL_W = 230
VALUE_W = 150
BAR_H = 18
GAP = 6
HEAD_H = 30


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str
    colour: str


def _colour(e: Entry) -> str:
    if e.kind == "baseline":
        return COLOURS["sol"] if e.author == "SoL" else COLOURS["baseline"]
    return COLOURS[e.kind]


def group_bars(g: Group) -> tuple[str, list[Bar], float | None]:
    """(axis caption, bars, reference value) for one group: speedup vs eager if eager was timed, else µs."""
    timed = [e for e in g.entries if e.time_us is not None]
    if any(e.vs_eager is not None for e in timed):
        bars = [
            Bar(e.author, e.vs_eager, f"{fmt_ratio(e.vs_eager)}  ({fmt_us(e.time_us)} µs)", _colour(e))
            for e in timed if e.vs_eager is not None
        ]
        return "speedup vs eager (higher is better)", bars, 1.0
    bars = [Bar(e.author, e.time_us, f"{fmt_us(e.time_us)} µs",
                _colour(e)) for e in timed if e.time_us is not None]
    return "time in µs (lower is better)", bars, None


Section = tuple[str, list[Bar], float | None]  # heading, bars, reference value (a dashed line)
NOTHING_TIMED = "no timed results yet (CPU-only runs have correctness and cost only)"


def speedup_chart(groups: list[Group], title: str) -> str:
    """One SVG with a section per timed group; an explanatory SVG when nothing was timed."""
    sections: list[Section] = []
    for g in groups:
        if g.timed:
            caption, bars, ref = group_bars(g)
            sections.append((f"{g.title} — {caption}", bars, ref))
    return _chart(title, sections)


def summary_chart(board: Leaderboard, title: str) -> str:
    """A section per task of the main tables: each author's and baseline's geometric-mean speedup vs eager
    over the timed shapes (the summary table, drawn), so the front page stays short."""
    combos: dict[tuple[str, int, str], list[Group]] = {}
    for g in board.groups:
        if g.timed and g.shape is not None:
            combos.setdefault((g.task, g.task_version, g.device), []).append(g)
    sections: list[Section] = []
    for (task, version, device), groups in combos.items():
        seen: dict[str, list[Entry]] = {}
        for g in groups:
            for e in g.entries:
                if e.vs_eager is not None:
                    seen.setdefault(e.author, []).append(e)
        ranked = sorted(seen.items(), key=lambda kv: (
            kv[1][0].kind == "baseline",
            list(BASELINES.values()).index(kv[0]) if kv[1][0].kind == "baseline" else 0,
            -(geomean(e.vs_eager for e in kv[1]) or 0.0)))
        bars = []
        for author, entries in ranked:
            gm = geomean(e.vs_eager for e in entries) or 0.0
            n = len(entries)
            bars.append(Bar(author, gm, f"{fmt_ratio(gm)}  ({n} shape{'s' if n != 1 else ''})",
                            _colour(entries[0])))
        heading = (f"{task} v{version} · {device} — geomean speedup vs eager over {len(groups)} "
                   f"shape{'s' if len(groups) != 1 else ''}")
        sections.append((heading, bars, 1.0))
    return _chart(title, sections)


def _chart(title: str, sections: list[Section]) -> str:
    if not sections:
        return _message_svg(title, NOTHING_TIMED)
    y = HEAD_H + 34
    parts: list[str] = []
    for heading, bars, ref in sections:
        parts.append(_text(8, y, heading, weight="bold"))
        y += 10
        top = max([b.value for b in bars] + ([ref] if ref else []))
        scale = (WIDTH - LABEL_W - VALUE_W - 16) / top if top > 0 else 0.0
        section_top = y
        for b in bars:
            y += GAP
            w = max(1.0, b.value * scale)
            parts.append(_text(LABEL_W - 8, y + BAR_H - 5, _clip(b.label, 34), anchor="end"))
            parts.append(
                f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill={quoteattr(b.colour)} '
                'rx="2">'
                f"<title>{escape(b.label)}: {escape(b.text)}</title></rect>"
            )
            parts.append(_text(LABEL_W + w + 6, y + BAR_H - 5, b.text, size=11, colour="#374151"))
            y += BAR_H
        if ref is not None:
            x = LABEL_W + ref * scale
            parts.append(
                f'<line x1="{x:.1f}" y1="{section_top}" x2="{x:.1f}" y2="{y + 3}" stroke="#111827" '
                'stroke-dasharray="3,3" stroke-width="1"/>'
            )
        y += 28
    return _svg(title, y, "\n".join(parts))


def _legend() -> str:
    items = [("human", COLOURS["human"]), ("model", COLOURS["model"]), ("baseline", COLOURS["baseline"]),
             ("speed of light", COLOURS["sol"])]
    out, x = [], 8.0
    for label, colour in items:
        out.append(f'<rect x="{x:.0f}" y="32" width="12" height="12" fill="{colour}" rx="2"/>')
        out.append(_text(x + 16, 42, label, size=11))
        x += len(label) * 6.5 + 30
    return "".join(out)


def _svg(title: str, height: float, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="system-ui, sans-serif" role="img" '
        f"aria-label={quoteattr(title)}>\n<title>{escape(title)}</title>\n"
        f'<rect width="100%" height="100%" fill="#ffffff"/>\n'
        f"{_text(8, 20, title, size=15, weight='bold')}{_legend()}\n{body}\n</svg>\n"
    )


def _message_svg(title: str, message: str) -> str:
    return _svg(title, 84, _text(8, 70, message, colour="#6b7280"))


def _text(x: float, y: float, text: str, *, size: int = 12, anchor: str = "start", weight: str = "normal",
          colour: str = "#111827") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
        f'fill="{colour}">{escape(text)}</text>'
    )


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
