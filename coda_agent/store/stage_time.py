"""Where verification time went over a run's attempts: stage by stage, part by part
(:attr:`~coda_agent.verifier.verdict.StageResult.seconds_by_part`), the table ``show --breakdown`` prints."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ..verifier.verdict import StageResult

#: The part name a stage's own total is listed under, above its parts.
STAGE_TOTAL = "(stage)"


@dataclass(frozen=True)
class StagePartTime:
    """One part of one stage over the attempts that recorded it (seconds)."""

    stage: str
    part: str
    attempts: int
    total_s: float
    median_s: float
    max_s: float
    share: float  # of the stage's total time over the attempts that ran the stage


def stage_time_rows(attempts: Iterable[Iterable[StageResult]]) -> list[StagePartTime]:
    """Per stage (in the order first met) over the attempts' stages (a verdict's, then its tune stage's), its
    total then each part ('other': what no part holds); a stage that recorded no parts (static, or a record
    from before them) has its total only."""
    per_part: dict[tuple[str, str], list[float]] = {}
    for stages in attempts:
        for st in stages:
            per_part.setdefault((st.stage, STAGE_TOTAL), []).append(st.seconds)
            for part, seconds in st.time_parts().items():
                per_part.setdefault((st.stage, part), []).append(seconds)
    rows = []
    for (stage, part), values in per_part.items():
        stage_total = sum(per_part[stage, STAGE_TOTAL])
        rows.append(StagePartTime(stage, part, len(values), sum(values), statistics.median(values),
                                  max(values), sum(values) / stage_total if stage_total > 0 else 0.0))
    return rows
