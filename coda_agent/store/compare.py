"""What changed between two runs: header fields, summary figures, outcome per attempt, best code."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from .rundir import RunFiles

#: Header fields that differ between any two runs and say nothing about what was run.
IDENTITY_FIELDS = {"run_id", "created"}
SUMMARY_FIELDS = [
    "status", "rounds", "attempts", "passes", "best_attempt", "best_time_us", "speedup_vs_human",
    "speedup_vs_cublas", "input_tokens", "output_tokens", "cost_usd", "wall_seconds",
    "seconds_to_first_correct",
]


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys (``params.temperature``); lists and scalars as compact text."""
    if isinstance(data, dict) and data:
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(data, list):
        text = ", ".join(str(x) if not isinstance(x, dict | list) else json.dumps(x) for x in data)
    elif data is None or data == {}:
        text = "-"
    else:
        text = str(data)
    return {prefix: text}


@dataclass
class Change:
    key: str
    a: str
    b: str


@dataclass
class AttemptPair:
    index: int
    a: str | None  # outcome, None when that run has no such attempt
    b: str | None

    @property
    def changed(self) -> bool:
        return self.a != self.b


@dataclass
class RunDiff:
    a: RunFiles
    b: RunFiles
    header: list[Change]
    summary: list[Change]
    attempts: list[AttemptPair]
    code: str  # unified diff of the best code ('' when equal or both missing)
    code_note: str = ""


def _text(v: Any) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _changes(a: dict[str, str], b: dict[str, str]) -> list[Change]:
    keys = list(dict.fromkeys([*a, *b]))
    return [Change(k, a.get(k, "-"), b.get(k, "-")) for k in keys if a.get(k, "-") != b.get(k, "-")]


def best_code(run: RunFiles) -> str | None:
    """best.py, or else the code of the summary's best attempt."""
    if run.best_code is not None:
        return run.best_code
    best = run.effective_summary().best_attempt
    attempt = run.attempt(best) if best is not None else None
    return attempt.code if attempt else None


def diff_runs(a: RunFiles, b: RunFiles) -> RunDiff:
    ha = flatten(a.header.model_dump(mode="json", exclude=IDENTITY_FIELDS)) if a.header else {}
    hb = flatten(b.header.model_dump(mode="json", exclude=IDENTITY_FIELDS)) if b.header else {}
    sa, sb = a.effective_summary(), b.effective_summary()
    summary = _changes(
        {k: _text(getattr(sa, k)) for k in SUMMARY_FIELDS}, {k: _text(getattr(sb, k)) for k in SUMMARY_FIELDS}
    )
    oa = {x.index: x.outcome for x in a.attempts}
    ob = {x.index: x.outcome for x in b.attempts}
    pairs = [AttemptPair(i, oa.get(i), ob.get(i)) for i in sorted(oa.keys() | ob.keys())]
    ca, cb = best_code(a), best_code(b)
    note = ""
    if ca is None and cb is None:
        note = "neither run has a correct candidate"
    elif ca is None or cb is None:
        note = f"only {(b if ca is None else a).name} has a correct candidate"
    elif ca == cb:
        note = "identical best code"
    code = "".join(
        difflib.unified_diff(
            (ca or "").splitlines(keepends=True), (cb or "").splitlines(keepends=True),
            fromfile=f"{a.name}/best.py", tofile=f"{b.name}/best.py",
        )
    )
    return RunDiff(a, b, _changes(ha, hb), summary, pairs, code, note)
