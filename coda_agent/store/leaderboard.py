"""The leaderboard: per task, the best correct kernel of each author against the same baselines.

Numbers are compared only where they are comparable: one *group* is one task (version and content) on one
device at one bench shape. A task's identity is its content hash (``Task.content_hash``): two different tasks
under one name (an edited copy of a built-in) never share a group, and their groups are labelled apart. A
record made before hashes were recorded joins the one content its task name and version has, or, where it has
several, a group of its own ("content not recorded"). Per task, the latest version on one device (the one with
bench results, else the most recent) is the main table; every other version/content/device is listed apart.
Runs without timing (a CPU-only machine, a verdict not profiled) form the group with no shape: correctness and
cost, no invented times.

Sources: the human author and the baselines (eager, torch.compile, cuBLAS GEMM alone, speed of light)
come from the newest bench result per task/version/device/shape; where no bench result covers a shape,
from the newest agent run that timed them in its own session. Each model's best is its fastest passing
attempt over all its runs; "what it took" is that run's rounds, attempts, tokens, $ and time to its
first correct candidate. A human run record (``model: human``) competes with the bench figure. A run that
ended before its first attempt (a provider's or the set-up's error) is no author's result: it is left out, and
named.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from ..tasks.loader import BUILTIN_TASK_DIR
from .index import AttemptTiming, BenchRowRecord, Index, RunRow
from .ranking import geomean
from .rundir import Problem

BASELINES: dict[str, str] = {
    "eager_us": "eager",
    "compiled_us": "torch.compile",
    "cublas_us": "cuBLAS (GEMM alone)",
    "sol_us": "SoL",
}



class Entry(BaseModel):
    """One row of a group: an author's best kernel, or a baseline."""

    author: str
    kind: Literal["human", "model", "baseline"]
    correct: bool | None = None  # None for baselines
    time_us: float | None = None
    vs_eager: float | None = None
    vs_compiled: float | None = None
    vs_human: float | None = None
    pct_sol: float | None = None
    runs: int = 0  # this author's runs on the group's task version and device
    correct_runs: int = 0
    run: str | None = None  # run directory the figures come from
    attempt: int | None = None
    rounds: int | None = None
    attempts: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    cost_known: bool = True  # False: the model has no known price (shown "unpriced", never $0)
    seconds_to_first_correct: float | None = None
    first_correct_attempt: int | None = None
    source: str | None = None  # bench result file, for human and baselines
    note: str = ""



class Group(BaseModel):
    """Rows that may be compared with each other."""

    task: str
    task_version: int
    device: str
    shape: str | None  # None: untimed (correctness and cost only)
    entries: list[Entry]
    task_hash: str | None = None  # the task's content hash; None: not recorded
    # where one task name has several contents: which this is (a short hash and the task's file)
    content: str = ""

    @property
    def timed(self) -> bool:
        return any(e.time_us is not None for e in self.entries)

    @property
    def title(self) -> str:
        where = f"shape {self.shape}" if self.shape else "untimed (correctness and cost)"
        content = f" ({self.content})" if self.content else ""
        return f"{self.task} v{self.task_version}{content} · {self.device} · {where}"



class Leaderboard(BaseModel):
    groups: list[Group]  # the main tables: per task, its latest version on one device
    apart: list[Group]  # other versions/contents/devices, never compared with the main tables
    problems: list[Problem]
    no_attempts: list[str] = []  # runs left out: they ended before their first attempt

    @property
    def empty(self) -> bool:
        return not self.groups and not self.apart


Combo = tuple[str, int, str | None, str]  # task, version, content hash (None: not recorded), device



#: The note of a bench row whose check failed on the GPU's memory, not on the kernel.
NOT_JUDGED = "not judged: its check ran out of GPU memory beside other checks"



def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()



def build(index: Index, task: str | None = None, device: str | None = None) -> Leaderboard:
    """The leaderboard from the index (call ``index.refresh()`` first to see the latest files)."""
    runs = index.runs(task)
    bench = index.bench_rows(task)
    if device is not None:
        runs = [r for r in runs if same_device(r.device, device)]
        bench = [b for b in bench if same_device(b.device, device)]
    timings: dict[str, list[AttemptTiming]] = defaultdict(list)
    for t in index.attempt_timings(task):
        timings[t.run_dir].append(t)
    no_attempts = [r.dir for r in runs if not r.attempts and r.status != "running"]
    runs = [_replay_costs(r, index) for r in runs if r.attempts]

    content = _content_of([*runs, *bench])
    runs_by: dict[Combo, list[RunRow]] = defaultdict(list)
    for r in runs:
        runs_by[(r.task, r.task_version, content(r), r.device)].append(r)
    bench_by: dict[Combo, list[BenchRowRecord]] = defaultdict(list)
    for b in bench:
        bench_by[(b.task, b.task_version, content(b), b.device)].append(b)

    main: list[Group] = []
    apart: list[Group] = []
    combos = sorted(runs_by.keys() | bench_by.keys(), key=lambda c: (c[0], -c[1], c[2] or "", c[3]))
    primary = _primary_combos(combos, runs_by, bench_by)
    # one version, several contents
    several = {c[:2] for c in combos if len({d[2] for d in combos if d[:2] == c[:2]}) > 1}
    for combo in combos:
        groups = _combo_groups(combo, runs_by.get(combo, []), bench_by.get(combo, []), timings)
        label = _content_label(combo[2], runs_by.get(combo, [])) if combo[:2] in several else ""
        for g in groups:
            g.task_hash, g.content = combo[2], label
        (main if combo in primary else apart).extend(groups)
    return Leaderboard(groups=main, apart=apart, problems=index.problems(), no_attempts=no_attempts)


def _content_of(records: Iterable[RunRow | BenchRowRecord]) -> Callable[[RunRow | BenchRowRecord],
                                                                        str | None]:
    """Each record's task content: its own hash; for one recorded before hashes, the one hash its task name
    and version has (it was that task, as far as anyone can tell), else None (unknown: a group of its own)."""
    known: dict[tuple[str, int], set[str]] = defaultdict(set)
    for rec in records:
        if rec.task_hash:
            known[(rec.task, rec.task_version)].add(rec.task_hash)

    def content(rec: RunRow | BenchRowRecord) -> str | None:
        hashes = known.get((rec.task, rec.task_version), set())
        return rec.task_hash or (next(iter(hashes)) if len(hashes) == 1 else None)

    return content


def _content_label(task_hash: str | None, runs: list[RunRow]) -> str:
    """Which of a task name's several contents a group is: ``content 3f2a9c1e07aa,
    ./tasks/gemm_residual.yaml`` (the newest run's task file), ``content 3f2a9c1e07aa, built-in``."""
    if task_hash is None:
        return "content not recorded"
    paths = [r.task_path for r in sorted(runs, key=lambda r: r.created, reverse=True) if r.task_path]
    if not paths:
        return f"content {task_hash}"
    where = "built-in" if Path(paths[0]).is_relative_to(BUILTIN_TASK_DIR) else paths[0]
    return f"content {task_hash}, {where}"



def _primary_combos(
    combos: list[Combo], runs_by: dict[Combo, list[RunRow]], bench_by: dict[Combo, list[BenchRowRecord]]
) -> set[Combo]:
    """Per task: the latest version; among its contents and devices, one with bench results, then the most
    recent."""
    chosen: set[Combo] = set()
    for name in {c[0] for c in combos}:
        latest = max(c[1] for c in combos if c[0] == name)
        candidates = [c for c in combos if c[0] == name and c[1] == latest]

        def rank(c: Combo) -> tuple[bool, str]:
            stamps = [r.created for r in runs_by.get(c, [])] + [b.created for b in bench_by.get(c, [])]
            return (bool(bench_by.get(c)), max(stamps, default=""))

        chosen.add(max(candidates, key=rank))
    return chosen



def _replay_costs(run: RunRow, index: Index) -> RunRow:
    """A replay's tokens and cost are those of the run it replayed (it paid nothing: the replies were paid for
    once, by the run that asked for them)."""
    if not run.replay_of:
        return run
    origin = index.run(run.replay_of)
    if origin is None:
        return run
    return replace(run, input_tokens=origin.input_tokens, output_tokens=origin.output_tokens,
                   cost_usd=origin.cost_usd)



def _ratio(base: float | None, time: float | None) -> float | None:
    if base is None or time is None or time <= 0:
        return None
    return base / time



def _run_figures(run: RunRow) -> dict[str, Any]:
    return {
        "run": run.dir,
        "rounds": run.rounds,
        "attempts": run.attempts,
        "tokens": run.tokens,
        "cost_usd": run.cost_usd,
        "cost_known": run.cost_known,
        "seconds_to_first_correct": run.seconds_to_first_correct,
        "first_correct_attempt": run.first_correct_attempt,
    }



@dataclass(frozen=True)
class _Reference:
    """What a group's entries are compared with at one shape: baselines (and where they come from)."""

    eager_us: float | None
    compiled_us: float | None
    cublas_us: float | None
    sol_us: float | None
    source: str
    note: str = ""



def _session_references(
    runs: list[RunRow], timings: dict[str, list[AttemptTiming]]
) -> tuple[dict[str, _Reference], dict[str, tuple[float, str]]]:
    """Per shape, baselines and human time measured in the newest run session that has them.

    The fallback when no bench result covers a task version, device and shape: an agent run on a GPU
    times the human kernel and the baselines next to its candidates.
    """
    refs: dict[str, _Reference] = {}
    human: dict[str, tuple[float, str]] = {}
    for run in sorted(runs, key=lambda r: r.created, reverse=True):
        for shape, us in run.human_us().items():
            human.setdefault(shape, (us, run.dir))
        for t in sorted(timings.get(run.dir, []), key=lambda t: -t.idx):
            if t.shape is None:
                continue
            if t.human_us is not None:
                human.setdefault(t.shape, (t.human_us, run.dir))
            if t.shape not in refs and any(x is not None for x in (t.eager_us, t.compiled_us, t.cublas_us,
                                                                   t.sol_us)):
                refs[t.shape] = _Reference(t.eager_us, t.compiled_us, t.cublas_us, t.sol_us, run.dir,
                                           note=f"timed in the session of run {run.dir}")
    return refs, human



def _combo_groups(
    combo: Combo, runs: list[RunRow], bench: list[BenchRowRecord], timings: dict[str, list[AttemptTiming]]
) -> list[Group]:
    task, version, _, device = combo
    latest: dict[tuple[str, str], BenchRowRecord] = {}  # newest conclusive bench row per (shape, author)
    refs: dict[str | None, _Reference] = {}
    shapes: list[str | None] = []
    for b in bench:  # oldest first, so newer rows overwrite, but never a finding with a row that has none
        held = latest.get((b.shape, b.author))
        if held is None or b.conclusive or not held.conclusive:
            latest[(b.shape, b.author)] = b
        if b.cublas_us is not None or b.shape not in refs:
            refs[b.shape] = _Reference(b.eager_us, b.compiled_us, b.cublas_us, b.sol_us, b.bench_path)
        if b.shape not in shapes:
            shapes.append(b.shape)
    session_refs, session_human = _session_references(runs, timings)
    for ref_shape, session_ref in session_refs.items():
        refs.setdefault(ref_shape, session_ref)

    by_author: dict[str, list[RunRow]] = defaultdict(list)
    for r in runs:
        by_author[r.model].append(r)

    rows: dict[str | None, list[Entry]] = defaultdict(list)
    for (bench_shape, author), b in latest.items():
        judged = b.correct or b.conclusive
        rows[bench_shape].append(
            Entry(
                author=author, kind="human" if author == "human" else "model",
                correct=b.correct if judged else None, time_us=b.candidate_us if b.correct else None,
                source=b.bench_path,
                note="" if b.correct else (b.verdict_reason or "incorrect") if judged else NOT_JUDGED,
            )
        )
    for timed_shape, (us, run_dir) in session_human.items():
        if (timed_shape, "human") not in latest:
            rows[timed_shape].append(Entry(author="human", kind="human", correct=True, time_us=us,
                                           source=run_dir, note=f"timed in the session of run {run_dir}"))
    for author, author_runs in by_author.items():
        for at_shape, entry in _author_entries(author, author_runs, timings).items():
            same = [i for i, e in enumerate(rows[at_shape]) if e.author == author]
            if not same:
                rows[at_shape].append(entry)
            # a human run beat the bench figure
            elif _entry_order(entry) < _entry_order(rows[at_shape][same[0]]):
                rows[at_shape][same[0]] = entry
    shapes += sorted((s for s in rows if s is not None and s not in shapes), key=str)
    if rows.get(None):
        shapes.append(None)

    groups = []
    for shape in shapes:
        entries = rows.get(shape, [])
        ref = refs.get(shape)
        human = next((e.time_us for e in entries if e.author == "human" and e.correct), None)
        for e in entries:
            author_runs = by_author.get(e.author, [])
            e.runs = len(author_runs)
            e.correct_runs = sum(1 for r in author_runs if (r.passes or 0) > 0)
        if ref is not None:
            for col, label in BASELINES.items():
                t = getattr(ref, col)
                if t is not None:
                    entries.append(Entry(author=label, kind="baseline", time_us=t, source=ref.source,
                                         note=ref.note))
        for e in entries:
            e.vs_eager = _ratio(ref.eager_us if ref else None, e.time_us)
            e.vs_compiled = _ratio(ref.compiled_us if ref else None, e.time_us)
            e.vs_human = _ratio(human, e.time_us)
            sol = _ratio(ref.sol_us if ref else None, e.time_us)
            e.pct_sol = 100 * sol if sol is not None else None
        entries.sort(key=_entry_order)
        groups.append(Group(task=task, task_version=version, device=device, shape=shape, entries=entries))
    return groups



class SummaryRow(BaseModel):
    """One author's standing on one task version and device: geometric means over the shapes where it has a
    correct time, so one row per author says what the per-shape tables say at length."""

    section: Literal["main", "apart"]  # apart: another version or device than the task's main tables
    task: str
    task_version: int
    device: str
    author: str
    kind: Literal["human", "model"]
    correct: bool | None  # correct wherever it was checked; None: never checked
    shapes: int  # timed shapes behind the ratios
    of_shapes: int  # timed shapes of the task on this device
    vs_eager: float | None = None
    vs_compiled: float | None = None
    vs_cublas: float | None = None
    vs_human: float | None = None
    pct_sol: float | None = None
    runs: int = 0
    correct_runs: int = 0
    cost_usd: float | None = None  # of the run behind the figures (the cheapest, where several are)
    cost_known: bool = True
    run: str | None = None
    # for an apart row: "old version", "other content" (another task of this name) or "other device"
    apart_why: str = ""
    task_hash: str | None = None
    content: str = ""  # Group.content: which of a task name's several contents



def summarize(board: Leaderboard) -> list[SummaryRow]:
    """Per task, version, content and device, one row per author (human first, then models, fastest first);
    per task the main tables' rows come first, then other versions, contents and devices (never compared with
    them)."""
    combos: dict[tuple[str, bool, int, str, str], list[Group]] = defaultdict(list)
    for section, groups in ((False, board.groups), (True, board.apart)):
        for g in groups:
            combos[(g.task, section, -g.task_version, g.task_hash or "", g.device)].append(g)
    rows: list[SummaryRow] = []
    latest = {g.task: (g.task_version, g.task_hash or "") for g in board.groups}
    for (task, apart, neg_version, content, device), groups in sorted(combos.items(), key=lambda kv: kv[0]):
        version = -neg_version
        main_version, main_content = latest.get(task, (version, content))
        why = ("" if not apart else "old version" if version < main_version
               else "other content" if content != main_content else "other device")
        timed_shapes = [g for g in groups if g.shape is not None and g.timed]
        pairs: dict[str, list[tuple[Group, Entry]]] = defaultdict(list)
        for g in groups:
            for e in g.entries:
                if e.kind != "baseline":
                    pairs[e.author].append((g, e))
        task_rows = []
        for author, seen in pairs.items():
            timed = [(g, e) for g, e in seen if g.shape is not None and e.correct and e.time_us is not None]
            cublas = {g.shape: b.time_us for g in groups for b in g.entries if b.author
                      == BASELINES["cublas_us"]}
            checked = [e.correct for _, e in seen if e.correct is not None]
            with_run = [e for _, e in seen if e.run is not None]
            figures = min(with_run, key=lambda e: e.cost_usd or 0.0) if with_run else seen[0][1]
            task_rows.append(SummaryRow(
                section="apart" if apart else "main", apart_why=why, task=task, task_version=version,
                device=device, author=author, task_hash=groups[0].task_hash, content=groups[0].content,
                kind="human" if seen[0][1].kind == "human" else "model",
                correct=all(checked) if checked else None, shapes=len(timed), of_shapes=len(timed_shapes),
                vs_eager=geomean(e.vs_eager for _, e in timed),
                vs_compiled=geomean(e.vs_compiled for _, e in timed),
                vs_cublas=geomean(_ratio(cublas.get(g.shape), e.time_us) for g, e in timed),
                vs_human=geomean(e.vs_human for _, e in timed), pct_sol=geomean(e.pct_sol for _, e in timed),
                runs=figures.runs, correct_runs=figures.correct_runs, cost_usd=figures.cost_usd,
                cost_known=figures.cost_known, run=figures.run,
            ))
        task_rows.sort(key=lambda r: (r.kind != "human", r.correct is not True,
                                      -(r.vs_cublas or r.vs_eager or 0.0), r.author))
        rows.extend(task_rows)
    return rows



def _entry_order(e: Entry) -> tuple[int, float, str]:
    if e.kind == "baseline":
        return (3, list(BASELINES.values()).index(e.author), e.author)
    if e.correct and e.time_us is not None:
        return (0, e.time_us, e.author)
    return (1 if e.correct else 2, 0.0, e.author)



def _author_entries(
    author: str, runs: list[RunRow], timings: dict[str, list[AttemptTiming]]
) -> dict[str | None, Entry]:
    """Per shape, this author's fastest passing attempt; with no timing at all, one untimed entry."""
    kind: Literal["human", "model"] = "human" if author == "human" else "model"
    best: dict[str | None, tuple[float, RunRow, int]] = {}
    for r in runs:
        for t in timings.get(r.dir, []):
            if t.shape is None:
                continue
            if t.shape not in best or t.median_us < best[t.shape][0]:
                best[t.shape] = (t.median_us, r, t.idx)
    if best:
        return {
            shape: Entry(author=author, kind=kind, correct=True, time_us=us, attempt=idx,
                         note=_replay_note(run), **_run_figures(run))
            for shape, (us, run, idx) in best.items()
        }
    correct = [r for r in runs if (r.passes or 0) > 0]
    if correct:
        run = min(correct, key=_cheapest_success)
        untimed = [t for t in timings.get(run.dir, []) if t.shape is None]
        note = "timed at an unnamed shape; not comparable" if untimed else ""
        return {None: Entry(author=author, kind=kind, correct=True, note=note or _replay_note(run),
                            **_run_figures(run))}
    run = max(runs, key=lambda r: r.created)
    return {None: Entry(author=author, kind=kind, correct=False, note=f"no correct kernel ({run.status})",
                        **_run_figures(run))}



def _replay_note(run: RunRow) -> str:
    return f"replayed from run {run.replay_of}" if run.replay_of else ""



def _cheapest_success(r: RunRow) -> tuple[float, float, float]:
    inf = math.inf
    s = r.seconds_to_first_correct
    a = r.first_correct_attempt
    return (s if s is not None else inf, a if a is not None else inf, r.cost_usd or 0.0)
