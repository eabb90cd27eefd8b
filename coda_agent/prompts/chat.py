"""The chat sent for each candidate: the system message (contract, API reference, worked examples), the task
message, and after the first round the lead reply and the feedback on every attempt so far.

Everything here is a pure function of its arguments, so a resumed run rebuilds exactly the prompts the
interrupted one would have sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..measure.peaks import SolPoint
from ..messages import ChatMessage
from ..store.records import Attempt
from ..tasks.model import Task, delicate_operators
from ..verifier import static
from ..verifier.plan import Plan
from .api_reference import api_reference
from .examples import Example
from .feedback import feedback_prompt
from .lead import lead_attempt
from .templating import render

#: What each of a round's K candidates is asked to try (slot i takes entry i mod len), so they do not all
#: converge.
APPROACHES = (
    "refine the best candidate so far (or, with none yet, the most direct fusion of the reference): the "
    "smallest change that makes it faster",
    "a different GEMM `Config` (tile_m, tile_n, cluster, pingpong or cooperative) from the best candidate's "
    "(or, with none yet, the most direct fusion with one), suited to the bench shapes",
    "a different split of the work: what the epilogue computes, what goes into reduce sinks, and what (if "
    "anything) is left to a second gemm or to host ops",
    "a different algebra: reorder or re-associate the computation so fewer bytes move and fewer launches are "
    "needed (e.g. fold a scale into an operand, or reuse a statistic)",
)


def system_prompt(examples: Sequence[Example]) -> str:
    """The contract, the generated API reference and the worked examples (the same for every attempt). The
    host allowlist is only summarised here; the feedback on a refused module gives it in full
    (:func:`.feedback.host_allowlist`)."""
    return render(
        "system.j2",
        api_reference=api_reference().strip(),
        examples=examples,
        epilogue_functions=sorted(static.EPILOGUE_FUNCTIONS),
    )


def _init_text(ini: Any) -> str:
    """How the test data draws an input, planted special values included (a kernel must handle them)."""
    def num(v: Any) -> str:  # a number as 0, 64, 0.5; an expression over the shape symbols as written
        return f"{v:g}" if isinstance(v, int | float) else str(v)

    if ini.dist == "normal":
        text = f"normal(mean {num(ini.mean)}, std {num(ini.std)})"
    elif ini.dist == "softmax":
        text = f"softmax over the last dim of normal(mean {num(ini.mean)}, std {num(ini.std)}) logits"
    elif ini.dist == "uniform":
        text = f"uniform[{num(ini.low)}, {num(ini.high)})"
    else:
        text = f"randint[{num(ini.low)}, {num(ini.high)})"
    if ini.replace is not None:
        part = "of its rows (whole rows)" if ini.replace.rows else "of it"
        text += f", {ini.replace.fraction * 100:g}% {part} set to {ini.replace.value}"
    return text


def _shape_text(shape: Sequence[str | int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def task_prompt(
    task: Task,
    *,
    checks: str,
    target: str,
    sol: Sequence[SolPoint],
    sol_label: str,
    human_us: Mapping[str, float] | None = None,
) -> str:
    """What to compute and how it is judged: signature, tensors, reference, shapes (with the notes the task's
    author wrote on them), tolerance, budget, SoL."""
    sol_by_shape = {p.shape: p.sol_us for p in sol}
    return render(
        "task.j2",
        t=task,
        signature=", ".join([*(i.name for i in task.inputs), *task.constants]),
        returns=", ".join(f'"{o.name}": ...' for o in task.outputs),
        inputs=[
            {"name": i.name, "shape": _shape_text(i.shape), "dtype": i.dtype, "init": _init_text(i.init),
             "description": i.description}
            for i in task.inputs
        ],
        outputs=[{"name": o.name, "shape": _shape_text(o.shape), "dtype": o.dtype,
                  "description": o.description} for o in task.outputs],
        constants=task.constants,
        reference_source=task.reference_file.read_text().strip(),
        shape_sets={name: {"points": task.summary_shapes(name),
                           "notes": {p.name: " ".join(p.note.split()) for p in points if p.note}}
                    for name, points in task.shapes.items()},
        tolerances=[
            {"name": o.name, "factor": f"{f:g}", "floor": f"{fl:g}"}
            for o in task.outputs
            for f, fl in [task.tolerance.for_output(o.name)]
        ],
        sol={"peaks_label": sol_label, "points": sol},
        human_timing=[{"shape": s, "us": us,
                       "sol_us": sol_by_shape.get(s)} for s, us in (human_us or {}).items()],
        checks=checks,
        target=target,
    )


def _delicate(task: Task) -> list[str]:
    """The numerically delicate operators the task's reference calls, as the stress set's line names them."""
    try:
        found = delicate_operators(task.reference_file.read_text())
    except (OSError, SyntaxError, ValueError, TypeError):  # no reference file to read
        return []
    return ["division" if op == "/" else op for op in found]


def describe_checks(task: Task, plan: Plan) -> str:
    """One paragraph on what this run's verifier does, in order."""
    shape_set, seeds = plan.shape_set, plan.seeds
    steps = ["the static check (nothing runs if it refuses the module)"]
    shapes = ", ".join(p.name for p in task.shape(shape_set))
    seed_text = f"seed{'s' if len(seeds) != 1 else ''} {', '.join(str(s) for s in seeds)}"
    if stressed := task.stress_inits():
        draws: dict[str, list[str]] = {}
        for name, ini in stressed.items():
            draws.setdefault(_init_text(ini), []).append(f"`{name}`")
        how = "; ".join(f"{', '.join(names)} as {text}" for text, names in draws.items())
        ops = _delicate(task) or ["exp", "log", "division", "rsqrt"]
        seed_text += f" and a stress input set ({how}: {', '.join(ops)} must stay in range)"
    for name in plan.stages:
        if name == "correctness":
            steps.append(f"the CPU emulator against the FP32 reference at the `{shape_set}` shapes "
                         f"({shapes}), {seed_text}")
        elif name == "compile":
            steps.append("an sm_90a build of every kernel `forward()` launches (QuACK, no GPU needed), with "
                         "a cost estimate (bytes, launches, host ops) at the bench shapes")
        elif name == "gpu_correctness":
            steps.append(f"real kernels on the GPU against the FP32 reference at the `{shape_set}` shapes, "
                         f"{seed_text}, with the launch count checked against the budget")
        elif name == "profile":
            steps.append("GPU timing (median over repetitions) against the hand-written kernel and the "
                         "baselines")
        else:
            steps.append(f"the `{name}` stage")
    text = "Each candidate goes through " + "; then ".join(steps) + ". The first failing step ends the check."
    if task.gemms:
        gemms = ", ".join("(" + ", ".join(str(d).replace(" ", "") for d in g) + ")" for g in task.gemms)
        if gemms == "(M, N, K)":
            text += " The GEMM (M, N, K) must be a `gemm()` call of its own."
        elif len(task.gemms) == 1:
            text += f" The task's GEMM, {gemms} as (M, N, K), must be a `gemm()` call of its own."
        else:
            text += f" The task's GEMMs, {gemms} as (M, N, K), must each be a `gemm()` call of its own."
        text = text[:-1] + " (a transpose or a split counts)."
    return text


def approach_note(slot: int, slots: int, timed: bool = True) -> str:
    """What candidate ``slot`` of a round of ``slots`` should try; empty for a round of one. A run without
    GPU timing asks for no other Config: nothing there could tell one from another (a manual seat's
    second candidate was asked for one at round 1 of a CPU run)."""
    if slots <= 1:
        return ""
    approaches = APPROACHES if timed else tuple(a for a in APPROACHES if "`Config`" not in a)
    return (
        f"You are candidate {slot + 1} of {slots} written from this same message; the others take other "
        f"approaches. Yours: {approaches[slot % len(approaches)]}."
    )


def build_messages(
    system: str,
    task_message: str,
    attempts: Sequence[Attempt],
    *,
    population: Sequence[Attempt],
    goal_is_speed: bool,
    goals: Mapping[str, float] | None = None,
    slot: int = 0,
    slots: int = 1,
) -> list[ChatMessage]:
    """The chat for candidate ``slot`` of the next round: system, task, then (after round 1) the lead reply
    and the feedback; with several candidates per round the last message asks each for a different approach.

    The model sees its own best reply of the last round as its turn, and the results of every attempt
    so far (with the code of the attempts it did not "say" in this chat) as the next user turn.
    """
    messages = [ChatMessage(role="system", content=system)]
    note = approach_note(slot, slots, timed=goal_is_speed)
    lead = lead_attempt(attempts)
    if lead is None:
        return [*messages, ChatMessage(role="user", content="\n\n".join(p for p in (task_message.rstrip(),
                                                                                    note) if p) + "\n")]
    feedback = feedback_prompt(attempts, population=population, goal_is_speed=goal_is_speed, goals=goals,
                               lead=lead)
    return [
        *messages,
        ChatMessage(role="user", content=task_message),
        ChatMessage(role="assistant", content=echoed_reply(lead.raw_response or "")),
        ChatMessage(role="user", content="\n\n".join(p for p in (feedback.rstrip(), note) if p) + "\n"),
    ]


#: The most of its own reply the model is shown again (a module is a few kB; a runaway reply is cut, not
#: resent).
MAX_ECHOED_CHARS = 60_000


def echoed_reply(raw: str) -> str:
    """The lead reply as the chat's assistant turn: thinking dropped, and a runaway reply cut to its head."""
    text = strip_thinking(raw).strip() or "(empty reply)"
    if len(text) > MAX_ECHOED_CHARS:
        text = text[:MAX_ECHOED_CHARS] + (f"\n[... the reply went on for {len(text) - MAX_ECHOED_CHARS:,} "
                                          "more characters ...]")
    return text


def strip_thinking(text: str) -> str:
    """Drop ``<think>...</think>`` sections that reasoning models served over OpenAI-compatible APIs emit."""
    return re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL)
