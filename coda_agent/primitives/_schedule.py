"""A forward's pinned schedule: the GEMM config of each of its ``gemm`` calls, written beside the code.

The harness tunes a correct candidate's configs and pins the winners with ``@schedule({...})`` on its
``forward``, so the exported module runs at the tuned speed wherever it is imported. The state is one
plain module-level list (the tables of the scheduled forwards now running, innermost last): nothing an
epilogue fn captures, so QuACK's source fingerprint never meets it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ._config import Config, EpilogueError

#: A gemm call's identity in a schedule: (epilogue fn name, M, N, K).
ScheduleKey = tuple[str, int, int, int]
Forward = TypeVar("Forward", bound=Callable[..., Any])

_running: list[Mapping[ScheduleKey, Config]] = []


def _checked(table: object) -> Mapping[ScheduleKey, Config]:
    if not isinstance(table, Mapping):
        raise EpilogueError("schedule() takes a dict {(epilogue_name, M, N, K): Config(...)}, got "
                            f"{type(table).__name__}")
    for key, config in table.items():
        ok_key = (
            isinstance(key, tuple) and len(key) == 4 and isinstance(key[0], str)
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in key[1:])
        )
        if not ok_key:
            raise EpilogueError(f"schedule key {key!r} must be (epilogue_name, M, N, K) with positive "
                                "integer dims")
        if not isinstance(config, Config):
            raise EpilogueError(f"schedule entry {key!r} must map to a Config(...), got "
                                f"{type(config).__name__}")
    return MappingProxyType(dict(table))


def schedule(table: Mapping[tuple[str, int, int, int], Config]) -> Callable[[Forward], Forward]:
    """Pin the kernel config of ``forward``'s gemm calls: ``@schedule({("epi_name", M, N, K): Config(...)})``.

    The harness writes it after tuning a correct candidate (keep it when revising one, or drop it: the harness
    tunes again); a candidate may write one too. A gemm call whose fn name and (M, N, K) (A's rows, B's
    columns, A's columns; in packed mode the accumulator's N, half C's 2N) are in the table runs with that
    config, whatever its ``config=``. Only on
    ``forward``, with a literal dict.
    """
    checked = _checked(table)

    def decorate(forward: Forward) -> Forward:
        @functools.wraps(forward)
        def scheduled(*args: Any, **kwargs: Any) -> Any:
            _running.append(checked)
            try:
                return forward(*args, **kwargs)
            finally:
                _running.pop()

        return scheduled  # type: ignore[return-value]

    return decorate


def pinned_config(key: ScheduleKey) -> Config | None:
    """The config the innermost running schedule pins for this gemm call, if any."""
    for table in reversed(_running):
        found = table.get(key)
        if found is not None:
            return found
    return None
