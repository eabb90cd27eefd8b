"""Run records: the versioned, on-disk schema of an agent run (pydantic models, JSON files written
atomically).

Where each file goes in a run directory, and how the directory is written and read, is
:mod:`coda_agent.store.rundir`; this module is the schema, and the one way a record file is written and
parsed.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticSerializationError

from ..atomic import write_text_atomic
from ..messages import ChatMessage
from ..untrusted import storable_tree
from ..verifier.verdict import ShapeTuning, StageResult, Verdict
from .outcomes import AttemptOutcome

#: 2: a timing stage's per-shape times are typed (``StageResult.timings``); schema 1 records still read.
SCHEMA_VERSION = 2

RunStatus = Literal["running", "target_reached", "budget_exhausted", "completed", "interrupted", "failed"]
#: A run that ended so has something left to do: ``run --resume`` continues it.
RESUMABLE = ("interrupted", "failed")
#: How a run ended, as a reader should take it: ``ok`` (a correct kernel), ``bad`` (none), ``warn`` (a correct
#: kernel, but the run did not finish), ``running``.
StatusTone = Literal["ok", "bad", "warn", "running"]


def run_status(status: str, passes: int | None) -> tuple[str, StatusTone]:
    """A run's status as shown (CLI ``show``, the viewer): the recorded status, and whether it found a correct
    kernel. A run that ran every round without one "completed" only as a schedule: it is shown as a
    failure."""
    label = status.replace("_", " ")
    if status == "running":
        return (label if passes else f"{label}, no correct kernel yet"), "running"
    if not passes:
        return f"{label}, no correct kernel", "bad"
    if status in ("interrupted", "failed"):
        return f"{label}, {passes} correct", "warn"
    return f"{label}, {passes} correct", "ok"


class Budgets(BaseModel):
    """Hard stops for a run; None means unlimited."""

    rounds: int = 5
    candidates_per_round: int = 1
    max_tokens: int | None = None
    max_dollars: float | None = None
    max_wall_seconds: float | None = None


class RunHeader(BaseModel):
    """Everything a run's figures depend on, written once when the run starts."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    created: datetime
    task: str
    task_version: int
    task_path: str
    task_hash: str | None = Field(
        default=None, description="the task's content hash (Task.content_hash): its identity; None in runs "
                                  "recorded before it"
    )
    model: str = Field(description="provider/model, e.g. anthropic/claude-sonnet-4-5, or 'human'")
    params: dict[str, Any] = {}
    budgets: Budgets = Budgets()
    target: dict[str, Any] = Field(default_factory=dict, description="stopping target: correct, and (timed) "
                                   "any of e.g. {'speedup_vs_human': 0.97} or "
                                   "{'speedup_vs_cublas': 0.97}, {'sol_fraction': 0.6}")
    verifier_stages: list[str] = []
    git_commit: str | None = None
    git_dirty: bool = False
    packages: dict[str, str] = {}
    device: str = "cpu"
    host: str = ""
    human_timing: dict[str, float] = Field(
        default_factory=dict,
        description="shape -> median µs of the task's human kernel, timed in this run's session (GPU only)"
    )


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    price_known: bool = Field(default=True, description="False: the model has no price in the table, "
                                                        "cost_usd is 0 but unknown")


class Tuning(BaseModel):
    """The harness's schedule search for a correct, timed candidate, and what came of it. Where some config
    beat the ones as written, the module with its GEMM configs pinned, verified and timed again; adopted when
    correct and faster, and then ``Attempt.timing`` is the tuned module's and ``best.py`` ships it. Where none
    did, no module: the search alone, so the record still says what was tried and where the time went."""

    code: str | None = Field(default=None, description="the pinned module (None: nothing beat the configs as "
                                                       "written)")
    verdict: Verdict | None = None
    adopted: bool = False
    before: dict[str, Any] = Field(default_factory=dict,
                                   description="the model's module's timing, before tuning")
    search: dict[str, ShapeTuning] = Field(default_factory=dict,
                                           description="per shape: the configs tried, and their times")
    stage: StageResult | None = Field(default=None, description=(
        "the tune stage itself: its time by part, the builds, the configs tried and left untried"))


class Attempt(BaseModel):
    """One candidate: the messages sent, the raw reply, the extracted code and every check's result."""

    index: int = Field(ge=1, description="1-based, unique in the run")
    round: int = Field(ge=1)
    slot: int = Field(ge=0, description="which of the round's K concurrent candidates")
    started: datetime
    finished: datetime
    messages: list[ChatMessage]
    raw_response: str | None = None
    finish_reason: str = Field(default="", description="why the model stopped, as the provider said (e.g. "
                                                       "'length': cut off)")
    provider_error: str | None = Field(default=None,
                                       description="'<ErrorKind>: message' when the request failed")
    code: str | None = None
    extraction_error: str | None = None
    verdict: Verdict | None = None
    usage: Usage = Usage()
    durations: dict[str, float] = Field(default_factory=dict, description="seconds: llm, verify")
    timing: dict[str, Any] = Field(
        default_factory=dict,
        description="GPU timing of a correct candidate, if profiled: {shapes: {name: {median_us, human_us?, "
                    "sol_us?, bound?, "
        "baselines?, speedups?}}, geomean_us, speedup_vs_{human,cublas,compiled,eager}?, sol_fraction?} (see "
        "coda_agent/agent/timing.py); of the tuned module when a tuning was adopted",
    )
    tuning: Tuning | None = None

    @property
    def stages(self) -> list[StageResult]:
        """Every stage the attempt ran: its verdict's, then its tune stage (where the time went)."""
        tuned = (self.tuning.stage,) if self.tuning is not None and self.tuning.stage is not None else ()
        return [*(self.verdict.stages if self.verdict is not None else ()), *tuned]

    @property
    def shipped_code(self) -> str | None:
        """What the attempt ships as ``best.py``: the tuned module when its tuning was adopted, else the
        model's."""
        return self.tuning.code if self.tuning is not None and self.tuning.adopted else self.code

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed

    @property
    def outcome(self) -> AttemptOutcome:
        if self.provider_error:
            return AttemptOutcome.PROVIDER_ERROR
        if self.code is None:
            return AttemptOutcome.NO_CODE
        return AttemptOutcome.of_verdict(self.verdict.outcome) if self.verdict else AttemptOutcome.UNVERIFIED

    @property
    def reason(self) -> str:
        """Why the attempt ended as it did: the provider's error, the extraction's, or the verdict's reason
        ("" if none)."""
        return self.provider_error or self.extraction_error or (self.verdict.reason if self.verdict
                                                                else "") or ""


class RunSummary(BaseModel):
    """Totals and the best candidate, rewritten after every attempt."""

    schema_version: int = SCHEMA_VERSION
    status: RunStatus = "running"
    stop_reason: str = ""
    rounds: int = 0
    attempts: int = 0
    passes: int = 0
    best_attempt: int | None = None
    best_time_us: float | None = Field(default=None,
                                       description="geometric mean over the timed shapes of the best attempt")
    speedup_vs_human: float | None = None
    speedup_vs_cublas: float | None = Field(default=None, description="best attempt: geometric mean of "
                                                                      "cuBLAS-alone time / its time")
    sol_fraction: float | None = Field(default=None,
                                       description="best attempt: geometric mean of SoL time / its time")
    estimate_sol_fraction: float | None = Field(
        default=None, description="best attempt, where untimed: geometric mean of SoL time / the CPU's cost "
                                  "estimate of its time (the sm_90a build's)")
    outcomes: dict[str, int] = Field(default_factory=dict,
                                     description="attempt count per outcome (Attempt.outcome)")
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = Field(default=True, description="False: some attempt used a model with no known price "
                                                       "(its cost counts 0)")
    wall_seconds: float = 0.0
    seconds_to_first_correct: float | None = None
    updated: datetime | None = None


class SweepMember(BaseModel):
    """One task and model of a sweep; ``run`` names its run directory once it has started."""

    task: str  # the task file
    model: str
    run: str | None = None


class SweepRecord(BaseModel):
    """A sweep: every task with every model under one set of command-line options (``coda-agent run`` with
    several tasks or models). The runs are ordinary run directories; this file only lists them."""

    schema_version: int = SCHEMA_VERSION
    sweep_id: str
    created: datetime
    options: dict[str, Any] = Field(description="the run command's options for new runs, as given")
    total_dollars: float | None = Field(default=None,
                                        description="the runs together stop once they cost this much")
    members: list[SweepMember]


def write_json_atomic(path: Path, data: BaseModel | dict[str, Any]) -> None:
    """Write JSON via temp file + fsync + rename, so a reader never sees half a file. The one way a record is
    written, so the one place text JSON in UTF-8 cannot hold (a lone surrogate from a model or a candidate) is
    made storable: no record write fails on what a reply held."""
    if not isinstance(data, BaseModel):
        text = json.dumps(storable_tree(data), indent=2, default=str)
    else:
        try:
            text = data.model_dump_json(indent=2)
        except PydanticSerializationError:
            text = (
                type(data)
                .model_validate(storable_tree(data.model_dump(mode="json")))
                .model_dump_json(indent=2)
            )
    write_text_atomic(path, text)


M = TypeVar("M", bound=BaseModel)


class UnreadableRecord(ValueError):
    """A record file that is missing, empty, not JSON or not of its schema; ``reason`` says which, in a few
    words."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def read_record_text(path: Path) -> str:
    """A record file's text; UnreadableRecord when it is missing, unreadable or not UTF-8."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UnreadableRecord(path, "missing") from None
    except UnicodeDecodeError:
        raise UnreadableRecord(path, "not UTF-8 text") from None
    except OSError as exc:
        raise UnreadableRecord(path, f"cannot read ({exc.strerror or exc})") from None


def read_json_record(path: Path, model: type[M]) -> M:
    """Parse one record file into ``model``; UnreadableRecord names the file and what is wrong with it."""
    text = read_record_text(path)
    if not text.strip():
        raise UnreadableRecord(path, "empty file")
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise UnreadableRecord(path, _what_is_wrong(text, exc)) from None


def _what_is_wrong(text: str, exc: ValidationError) -> str:
    """Where the JSON breaks (json's message says it best), else the first fields that do not match the
    schema."""
    errs = exc.errors()
    if errs[0]["type"] == "json_invalid":
        try:
            json.loads(text)
        except json.JSONDecodeError as bad:
            # "...character at"
            return f"invalid JSON ({bad.msg.removesuffix(' at')} at line {bad.lineno}, column {bad.colno})"
    parts = [f"{'.'.join(str(x) for x in e['loc']) or '(top level)'}: {e['msg']}" for e in errs[:3]]
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return "does not match the schema: " + "; ".join(parts) + more
