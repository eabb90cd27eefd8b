"""The feedback message: what became of every attempt so far, in the detail a model can act on.

The latest round in full (static violations with the offending line, the error table against the FP32
reference, trimmed tracebacks, GPU timing against the human kernel and the baselines), earlier rounds as
a table, the population of best distinct correct candidates with their code, and what to do next.
A pure function of the recorded attempts, so a resumed run rebuilds exactly what the interrupted one sent.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ..measure.baselines import BASELINES
from ..store.outcomes import AttemptOutcome
from ..store.ranking import (
    ESTIMATE_GOAL,
    attempt_time_us,
    code_fingerprint,
    estimate_sol_fraction,
    shape_ratio,
)
from ..store.records import Attempt
from ..untrusted import shown
from ..verifier import static
from ..verifier.static.schedule_source import pinned_schedule, schedule_text
from ..verifier.verdict import Outcome, OutputCheck, Verdict
from .lead import lead_attempt, replied
from .templating import render

HISTORY_ROWS = 40
#: The speed targets a run can name (``RunHeader.target`` keys), as the feedback spells them.
GOAL_NAMES = {"speedup_vs_human": "the human kernel", "speedup_vs_cublas": "cuBLAS alone",
              "sol_fraction": "SoL"}
BOUND_ADVICE = {
    "memory": "memory-bound: the time goes to bytes moved. Read each input and write each output once, keep "
    "intermediates in the epilogue's registers instead of HBM, and drop host ops that make extra passes",
    "compute": "compute-bound: the time goes to the GEMM mainloop. Choose a `Config` (tile, cluster, "
               "pingpong or "
    "cooperative) that fills the SMs at this shape, and keep the epilogue light",
    "host": "host-bound: the GPU waited for forward()'s own host work between its launches. Make fewer torch "
            "ops "
    "and gemm calls per forward() (each is host time and a launch); fold host arithmetic into the epilogue",
}
#: The first next step after a round with no correct candidate, by the lead reply's outcome (a lead is a
#: reply, so it never passed here nor is it a provider error).
NEXT_STEP: dict[AttemptOutcome, str] = {
    AttemptOutcome.NO_CODE: "Answer with the whole module in one ```python block.",
    AttemptOutcome.STATIC_REJECTED: "Fix every violation listed above; the module was refused before "
                                    "anything ran.",
    AttemptOutcome.RUNTIME_ERROR: "forward() raised: the lines shown are from your module; fix the call, the "
                                  "shapes or "
    "the epilogue contract.",
    AttemptOutcome.COMPILE_ERROR: "The sm_90a build failed: keep to the value functions and modes the API "
                                  "reference "
    "lists, and check the Config rules; the lines shown are from your module.",
    AttemptOutcome.WRONG_OUTPUT: "Compare your algebra with the reference line by line, output by output; "
                                 "the table "
    "says which outputs are wrong, where, and by how much.",
    AttemptOutcome.CHEAT_DETECTED: "Keep the contract rule the reason names: each GEMM the task lists a "
                                   "gemm() call of its own, inputs read-only, no state across calls, no side "
                                   "streams.",
    AttemptOutcome.OVER_LAUNCH_BUDGET: "Launch fewer kernels: fuse host-side torch ops into the epilogue or "
                                       "a reduce sink, or merge them (an op's out= into a tensor of another "
                                       "dtype folds the cast: torch.div(h, s, out=y)); use fewer gemm calls "
                                       "or sinks (each sink's finalisation is a launch).",
    AttemptOutcome.TIMEOUT: "It ran too long: remove loops over rows or tiles in Python; one gemm() does the "
                            "whole "
    "matrix.",
    AttemptOutcome.CRASH: "The worker process died: avoid out-of-bounds indexing and huge intermediate "
                          "tensors.",
    AttemptOutcome.INFRA_ERROR: "The harness failed, not your code: resubmit the candidate (fixing anything "
                                "else you "
    "see).",
    AttemptOutcome.UNVERIFIED: "The harness recorded no verdict for it: resubmit the candidate (fixing "
                               "anything else "
    "you see).",
}
ERROR_LINES, ERROR_CHARS = 30, 2500


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _ratio(r: float) -> str:
    """An error ratio: ``0.337``, ``12.5``, ``1020``; from a million on ``2.5e+38`` (not 39 digits)."""
    return f"{r:.1e}" if r >= 1e6 else f"{r:.0f}" if r >= 100 else f"{r:.3g}"


def _times(r: float) -> str:
    return f"x{_ratio(r)}"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def trim_error(text: str, max_lines: int = ERROR_LINES, max_chars: int = ERROR_CHARS) -> str:
    """Head and tail of a long error, with a marker where lines were cut."""
    lines = text.strip().splitlines()
    if len(lines) > max_lines:
        head, tail = max_lines // 3, max_lines - max_lines // 3
        lines = [*lines[:head], f"... ({len(lines) - max_lines} lines cut) ...", *lines[-tail:]]
    out = "\n".join(lines)
    if len(out) > max_chars:
        out = out[: max_chars // 3] + "\n... (cut) ...\n" + out[-(2 * max_chars) // 3 :]
    return out


def _point_results(verdict: Verdict) -> dict[str, dict[str, bool]]:
    """output -> shape point -> passed at every seed."""
    out: dict[str, dict[str, bool]] = {}
    for st in verdict.stages:
        for c in st.checks:
            per = out.setdefault(c.output, {})
            per[c.shape_point] = per.get(c.shape_point, True) and c.ok
    return out


def _failing_outputs(verdict: Verdict) -> list[OutputCheck]:
    return [c for c in verdict.worst_checks() if not c.ok]


def first_clause(text: str) -> str:
    """``text`` up to its first ';' outside parentheses: a reason's own clause, never cut inside the
    parenthesis that says what to do (a dtype refusal's headline ended at "stored in", unclosed)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth <= 0:
            return text[:i]
    return text


def _form_only(verdict: Verdict) -> bool:
    """Whether every failing output failed on its form (missing, type, shape, dtype), none on its values."""
    failing = _failing_outputs(verdict)
    return bool(failing) and all(c.max_abs_err is None and c.worst_index is None for c in failing)


def attempt_headline(attempt: Attempt) -> str:
    """One line saying what happened to an attempt (history tables, progress display)."""
    outcome = attempt.outcome
    if outcome is AttemptOutcome.PROVIDER_ERROR:
        return f"the model request failed: {(attempt.provider_error or '').splitlines()[0]}"
    if outcome is AttemptOutcome.NO_CODE:
        return attempt.extraction_error or "the reply held no Python module"
    verdict = attempt.verdict
    if verdict is None:
        return "not verified"
    if verdict.passed:
        t = attempt.timing
        parts = ["correct"]
        if "speedup_vs_human" in t:
            parts.append(f"{t['speedup_vs_human']:.2f}x the human kernel")
        if "speedup_vs_cublas" in t:
            parts.append(f"{t['speedup_vs_cublas']:.2f}x cuBLAS alone")
        if "sol_fraction" in t:
            parts.append(f"{100 * t['sol_fraction']:.0f}% of SoL")
        if "geomean_us" in t and len(parts) == 1:
            parts.append(f"{t['geomean_us']:.1f} µs")
        tuning = attempt.tuning
        if tuning is not None and tuning.adopted and tuning.code and tuning.before.get("geomean_us"):
            pinned = schedule_text(pinned_schedule(tuning.code))
            parts.append("once the harness tuned its configs (from "
                         f"{tuning.before['geomean_us']:.1f} µs; pinned: {pinned})")
        if not t:
            ran = {s.stage for s in verdict.stages}
            where = (
                "on the GPU"
                if "gpu_correctness" in ran
                else "on the emulator"
                if "correctness" in ran
                else ""
            )
            built = " and builds for sm_90a" if "compile" in ran else ""
            fraction = estimate_sol_fraction(attempt)
            estimate = (f", {100 * fraction:.0f}% of the speed of light by the CPU's cost estimate"
                        if fraction is not None else "")
            return " ".join(p for p in ("correct", where) if p) + built + estimate
        return ", ".join(parts)
    failing = _failing_outputs(verdict)
    if verdict.outcome is Outcome.WRONG_OUTPUT and failing:
        bits = []
        for c in failing[:3]:
            r = c.error_ratio
            if r is None:
                bits.append(first_clause(c.reason) if c.reason else f"{c.output}: wrong")
            else:
                bits.append(f"{c.output} err {_num(c.max_abs_err)} > {_num(c.allowed)} ({_times(r)}) at "
                            f"{c.worst_index} {c.input_set}")
        more = f" (+{len(failing) - 3} more)" if len(failing) > 3 else ""
        return "; ".join(bits) + more
    lines = [ln.strip() for ln in verdict.reason.strip().splitlines() if ln.strip()]
    if not lines:
        return verdict.outcome.value
    if verdict.outcome is Outcome.STATIC_REJECTED and len(lines) > 1:
        return "; ".join(lines[1:3]) + (f" (+{len(lines) - 3} more)" if len(lines) > 3 else "")
    return textwrap.shorten(lines[-1], 300, placeholder=" …")  # at a word, and marked as cut


def _violations(attempt: Attempt) -> list[dict[str, Any]]:
    verdict = attempt.verdict
    if verdict is None or verdict.outcome is not Outcome.STATIC_REJECTED:
        return []
    code_lines = (attempt.code or "").splitlines()
    out = []
    for m in re.finditer(r"^line (\d+): (.+)$", verdict.reason, flags=re.MULTILINE):
        n = int(m.group(1))
        source = code_lines[n - 1].strip() if 1 <= n <= len(code_lines) else ""
        out.append({"line": n, "message": m.group(2), "source": source})
    return out


def _check_rows(verdict: Verdict) -> tuple[list[dict[str, Any]], list[str]]:
    points = _point_results(verdict)
    rows, notes = [], []
    for c in verdict.worst_checks():
        per = points.get(c.output, {})
        fails = [p for p, ok in per.items() if not ok]
        r = c.error_ratio
        rows.append({
            "output": c.output, "ok": c.ok, "err": _num(c.max_abs_err), "allowed": _num(c.allowed),
            "ratio": "-" if r is None else _ratio(r),
            "where": str(c.worst_index) if c.worst_index is not None else "-", "got": _num(c.worst_value),
            "expected": _num(c.expected_value), "at": c.input_set,
            "fails_at": ", ".join(fails) if fails else "-",
        })
        if c.ok:
            continue
        if c.rounded_to and not c.stress:  # a ratio would read as a wrong formula (x261: a manual seat's)
            notes.append(
                f"`{c.output}`'s worst element, {_num(c.worst_value)}, is the expected "
                f"{_num(c.expected_value)} rounded to {c.rounded_to}: the formula is right, but the value "
                f"was rounded to {c.rounded_to} on its way (gemm()'s out_dtype sets D's dtype; a cast or a "
                "16-bit intermediate rounds too): keep it in FP32 to the end."
            )
        elif c.expected_value == 0.0 and c.worst_value and r is not None and r > 1 and not c.stress:
            notes.append(f"`{c.output}` is {_num(c.worst_value)} at its worst element, where the expected "
                         f"value is exactly 0 (a masked or ignored element, a padding row?): check what "
                         "zeroes it in the reference.")
        elif c.factor and not c.stress:
            notes.append(f"`{c.output}` is {c.factor:.4g} times the expected values throughout: a constant "
                         "factor (a scale dropped or applied twice, a mean for a sum, a count).")
        elif r is None or c.stress:  # the stress set's reason says what it is and what fixes it
            notes.append(f"`{c.output}`: {c.reason}")
        elif r <= 1:  # within the max-abs bound: another rule (the error's norm, non-finite values) failed it
            notes.append(f"`{c.output}` is within the max-abs bound but fails another rule: {c.reason}")
        elif r <= 10:
            notes.append(
                f"`{c.output}` is close ({_times(r)} the tolerance): either lost precision (an intermediate "
                "rounded to the task dtype, a statistic taken from a rounded value instead of the FP32 "
                "accumulator) or a small slip in the formula (a constant or a term of a derivative): "
                "work the reference's formula out by hand at the worst index and compare."
            )
        else:
            notes.append(f"`{c.output}` is far off ({_times(r)} the tolerance): its formula differs from the "
                         "reference.")
        passing = [p for p, ok in per.items() if ok]
        if fails and passing:
            notes.append(
                f"`{c.output}` fails at {', '.join(fails)} but passes at {', '.join(passing)}: compare those "
                "shapes (a dimension that is not a tile multiple, or an M == N ambiguity)."
            )
    if verdict.outcome is not Outcome.WRONG_OUTPUT and all(row["ok"] for row in rows):
        checked = sorted({c.shape_point for s in verdict.stages for c in s.checks})
        notes.append(f"Every output was within tolerance where checked ({', '.join(checked)}), but the "
                     f"attempt then failed on {verdict.outcome.value} (its reason above says where): no "
                     "later shape or stage ran.")
    return rows, notes


def _timing_view(timing: Mapping[str, Any]) -> dict[str, Any] | None:
    shapes = timing.get("shapes") or {}
    if not shapes:
        return None
    present = {b for s in shapes.values() for b in s.get("baselines", {})}
    # the floor first
    baselines = [b for b in ("cublas", "compiled", "compiled_max_autotune", "eager") if b in present]

    def ratio(s: Mapping[str, Any], key: str) -> str:
        value = shape_ratio(s, key)
        return f"{value:.2f}x" if value else "-"

    rows = []
    for name, s in shapes.items():
        us = s["median_us"]
        rows.append({
            "shape": name, "us": _us(us), "human_us": _us(s.get("human_us")),
            "vs_human": ratio(s, "speedup_vs_human"),
            "vs": {b: ratio(s, f"speedup_vs_{b}") for b in baselines}, "sol_us": _us(s.get("sol_us")),
            "sol_pct": f"{100 * s['sol_us'] / us:.0f}%" if s.get("sol_us") else "-",
            "bound": s.get("bound", "-"),
        })
    return {"rows": rows, "baselines": [{"key": b, "name": BASELINES[b]} for b in baselines]}


def _attempt_view(attempt: Attempt, *, is_lead: bool) -> dict[str, Any]:
    verdict = attempt.verdict
    view: dict[str, Any] = {
        "index": attempt.index, "is_lead": is_lead,
        "outcome": attempt.outcome.value.upper().replace("_", " "), "headline": attempt_headline(attempt),
        "truncated": attempt.finish_reason in ("length", "max_tokens"), "violations": _violations(attempt),
        "error_text": "", "checks": [], "check_notes": [], "timing": None,
        "code": None if is_lead else attempt.code,
    }
    if view["violations"]:
        view["headline"] = ""  # the list below says it all
    if verdict is not None and not verdict.passed and verdict.outcome not in (Outcome.STATIC_REJECTED,
                                                                              Outcome.WRONG_OUTPUT):
        view["error_text"] = trim_error(verdict.reason)
        if "\n" not in view["error_text"]:  # one line: said once, whole, as the headline
            view["headline"], view["error_text"] = view["error_text"], ""
    if verdict is not None and any(s.checks for s in verdict.stages) and not verdict.passed:
        view["checks"], view["check_notes"] = _check_rows(verdict)
    if attempt.timing:
        view["timing"] = _timing_view(attempt.timing)
    view["cost"] = cost_summary(attempt)
    return view


def _names_the_allowlist(attempt: Attempt) -> bool:
    """A static refusal of a host name the allowlist lacks (a record from before the flag: any refusal)."""
    verdict = attempt.verdict
    if verdict is None or verdict.outcome is not Outcome.STATIC_REJECTED:
        return False
    return any(bool(st.details.get("allowlist", True)) for st in verdict.stages if st.stage == "static")


def host_allowlist() -> str:
    """The static check's allowlist for host code in full, from its own tables (shown after a refusal)."""
    return render(
        "allowlist.j2",
        torch_functions=sorted(static.TORCH_FUNCTIONS),
        torch_values=sorted(static.TORCH_VALUES),
        methods=sorted(static.METHODS),
        data_attrs=sorted(static.DATA_ATTRS),
        builtins=sorted(static.BUILTINS - {"True", "False", "None"}),
    ).strip()


def cost_summary(attempt: Attempt) -> str:
    """The compile stage's cost estimate at the bench shapes (``verifier.cost``), as text; empty when none."""
    verdict = attempt.verdict
    for stage in verdict.stages if verdict is not None else []:
        if stage.stage == "compile" and stage.details.get("cost_summary"):
            return str(stage.details["cost_summary"])
    return ""


def _ratio_text(key: str, value: float) -> str:
    """A target ratio as the feedback prints it: ``54%`` of SoL, ``0.80x`` of anything else."""
    return f"{100 * value:.0f}%" if key == "sol_fraction" else f"{value:.2f}x"


def _speed_steps(best: Attempt, goals: Mapping[str, float]) -> list[str]:
    """Where the best candidate stands against the run's target, and the shape farthest behind it."""
    t = best.timing
    steps = []
    for goal, wanted in goals.items():
        have = t.get(goal)
        if have is None:
            continue
        ratios = {name: r for name, sh in (t.get("shapes") or {}).items()
                  if (r := shape_ratio(sh, goal)) is not None}
        text = (
            f"Target: {_ratio_text(goal, wanted)} of {GOAL_NAMES.get(goal, goal)} (geomean over the bench "
            f"shapes); the best is at {_ratio_text(goal, have)}."
        )
        if ratios:
            worst = min(ratios, key=lambda n: ratios[n])
            bound = t["shapes"][worst].get("bound")
            text += f" Farthest behind: `{worst}` at {_ratio_text(goal, ratios[worst])}"
            text += f", {BOUND_ADVICE[bound]}." if bound in BOUND_ADVICE else "."
        steps.append(text)
    return steps


def _next_steps(
    lead: Attempt, latest: Sequence[Attempt], best: Attempt | None, goal_is_speed: bool,
    goals: Mapping[str, float]
) -> list[str]:
    if best is not None:
        if not goal_is_speed:
            goal, reached = goals.get(ESTIMATE_GOAL), estimate_sol_fraction(best)
            if goal is not None and (reached is None or reached < goal):
                at = f"at {100 * reached:.0f}%" if reached is not None else "not priced"
                steps = [f"A correct candidate exists, {at} of the speed of light by the CPU's cost "
                         f"estimate; the target is {100 * goal:.0f}%: keep it correct and cut what the "
                         "estimate names."]
            else:
                steps = ["A correct candidate exists; improve on it only if you see a clear gain, and keep "
                         "it correct."]
            if text := cost_summary(best):
                dominant = next((ln for ln in text.splitlines() if ln.startswith("Largest avoidable cost")),
                                "")
                steps.append("No GPU times this run, so speed is judged by the CPU's cost estimate of the "
                             "best candidate: "
                             + (dominant or "see its table above") + " A faster candidate cuts that.")
            return steps
        steps = [
            "Keep it correct and make it faster; start from the best candidates above.",
            *_speed_steps(best, goals),
            "Move every element-wise op on (M, N) data into the epilogue fn and every row/column statistic "
            "into a reduce sink; count your launches against the budget.",
            "Pick a GEMM `Config` (tile_m, tile_n, cluster, pingpong) suited to the bench shapes; the "
            "default is 128x192, 2x1 cluster, pingpong (128x128 in packed mode and for narrow N; cooperative "
            "128x256 at K >= 8192 when the epilogue reads no tile besides C and reduces nothing down the "
            "columns).",
        ]
        if not all(a.passed for a in latest):
            steps.append("Some candidates of the last round failed: do not trade correctness for speed.")
        return steps
    steps = [NEXT_STEP[lead.outcome]]
    if lead.outcome is AttemptOutcome.WRONG_OUTPUT and lead.verdict is not None and _form_only(lead.verdict):
        steps = ["The outputs' form is wrong, not (yet) their values: return every output the task declares, "
                 "by its name, as a plain tensor of its shape and dtype, as the reason above says."]
    if lead.finish_reason in ("length", "max_tokens"):
        steps.append("Your reply was cut off: reason briefly, then give the complete module.")
    steps.append("Correctness comes first; speed only counts once every output passes.")
    return steps


def _population_view(population: Sequence[Attempt], latest: Sequence[Attempt]) -> list[dict[str, Any]]:
    """The population's rows; a module the latest round's replies already show (itself, or resubmitted byte
    for byte) is not shown again, and where that leaves an untimed population nothing to show, no rows."""
    above = {code_fingerprint(a.code) for a in latest if a.code is not None}
    rows = []
    for a in population:
        t = a.timing
        rows.append({
            "index": a.index, "round": a.round, "us": _us(attempt_time_us(a)),
            "headline": attempt_headline(a),
            "vs": {k: _ratio_text(k, t[k]) if k in t else "-" for k in GOAL_NAMES},
            "code": (None if a.shipped_code == a.code and code_fingerprint(a.code or "") in above
                     else a.shipped_code),
        })
    return rows if any(r["code"] for r in rows) or any(a.timing for a in population) else []


def feedback_prompt(
    attempts: Sequence[Attempt],
    *,
    population: Sequence[Attempt],
    goal_is_speed: bool,
    goals: Mapping[str, float] | None = None,
    lead: Attempt | None = None,
) -> str:
    """Structured results of all previous attempts: the latest round in detail, earlier ones as a table, and
    the population (the best distinct correct candidates, best first, as ``store.ranking`` orders them) with
    code."""
    replies = replied(attempts)
    if not replies:
        raise ValueError("feedback needs at least one attempt with a model reply")
    lead = lead or lead_attempt(attempts)
    assert lead is not None
    last_round = max(a.round for a in replies)
    latest = sorted((a for a in replies if a.round == last_round),
                    key=lambda a: (a.index != lead.index, a.slot))
    history = [a for a in replies if a.round < last_round][-HISTORY_ROWS:]
    best = population[0] if population else None
    n, passed = len(replies), sum(a.passed for a in replies)
    overview = f"{n} attempt{'s' if n != 1 else ''} so far, {passed} correct."
    if best is not None:
        overview += f" Best so far: attempt #{best.index} ({attempt_headline(best)})."
    return shown(render(  # candidates' messages and code reach the model as text, never as control sequences
        "feedback.j2",
        overview=overview,
        population=_population_view(population, latest),
        timed=any(a.timing for a in population),
        latest=[_attempt_view(a, is_lead=a.index == lead.index) for a in latest],
        history=[
            {"index": a.index, "round": a.round, "outcome": a.outcome.value,
             "headline": attempt_headline(a).replace("|", "/")}
            for a in history
        ],
        next_steps=_next_steps(lead, latest, best, goal_is_speed, goals or {}),
        allowlist=host_allowlist() if any(_names_the_allowlist(a) for a in latest) else "",
    ))

