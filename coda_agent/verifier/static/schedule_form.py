"""The one literal form of ``@schedule({...})`` the static check accepts (and the tuner writes), read from its
source without running anything. A leaf of the check: the rules read it, and
:mod:`.schedule_source` (which pins and unpins a schedule in a module) builds on it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Collection

from ...primitives import Config


class ScheduleFormError(ValueError):
    """A ``@schedule(...)`` that is not a literal table of ``(name, M, N, K): Config(field=constant,
    ...)``."""


def literal_schedule(call: ast.Call,
                     config_names: Collection[str] = ("Config",)) -> dict[tuple[str, int, int, int], Config]:
    """The table of a ``schedule({...})`` call, read from its literal source without running anything.

    The one form accepted (and the one the harness writes): a single dict literal whose keys are
    ``("epilogue_name", M, N, K)`` tuples of constants and whose values are ``Config(...)`` calls
    (``config_names``: how the module names Config) with constant keyword fields. Raises
    :class:`ScheduleFormError` otherwise.
    """
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Dict):
        raise ScheduleFormError("schedule() takes exactly one argument, a dict literal {(epilogue_name, M, "
                                "N, K): Config(...)}")
    fields = {f.name: bool if f.type in (bool, "bool") else int for f in dataclasses.fields(Config)}
    flags = ", ".join(sorted(name for name, kind in fields.items() if kind is bool))
    table: dict[tuple[str, int, int, int], Config] = {}
    for k, v in zip(call.args[0].keys, call.args[0].values, strict=True):
        try:
            key = ast.literal_eval(k) if k is not None else None
        except (ValueError, TypeError, SyntaxError, RecursionError):
            key = None
        ok_key = (
            isinstance(key, tuple) and len(key) == 4 and isinstance(key[0], str)
            and all(type(d) is int and d > 0 for d in key[1:])
        )
        if not ok_key:
            raise ScheduleFormError("schedule keys must be literal (epilogue_name, M, N, K) tuples with "
                                    "positive integer dims")
        assert isinstance(key, tuple)
        if not (isinstance(v, ast.Call) and ast.unparse(v.func) in config_names and not v.args):
            raise ScheduleFormError(f"schedule entry {key!r} must be Config(field=value, ...) with keyword "
                                    "fields")
        values: dict[str, object] = {}
        for kw in v.keywords:
            if (
                kw.arg not in fields
                or not isinstance(kw.value, ast.Constant)
                or type(kw.value.value) is not fields[kw.arg]
            ):
                raise ScheduleFormError(f"schedule entry {key!r}: Config fields are "
                                        f"{', '.join(sorted(fields))}, each a constant integer ({flags}: "
                                        "True/False)")
            values[kw.arg] = kw.value.value
        if key in table:
            raise ScheduleFormError(f"schedule key {key!r} appears twice")
        table[key] = Config(**values)  # type: ignore[arg-type]
    return table
