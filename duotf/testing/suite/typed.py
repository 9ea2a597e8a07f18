"""Whether a report returned at run time is what its :class:`typing.TypedDict` declares
(:mod:`duotf.reports`): the suite checks every report it reads with :func:`mismatches`."""

from __future__ import annotations

import types
import typing
from typing import Any, FrozenSet, List, Mapping


def mismatches(report: Mapping[str, Any], declared: type) -> List[str]:
    """What in ``report`` its TypedDict ``declared`` does not declare, one line each: a key
    declared nowhere, a value not of its key's type, a required key missing. Empty when the
    report fits.

    Types are checked as a reader of the declaration expects them: ``int`` takes no ``bool``,
    ``float`` takes an ``int``; ``Optional[X]``, ``List[X]`` and ``Dict[K, V]`` are looked
    into; a type no rule here covers raises TypeError rather than pass unchecked.
    """
    hints = typing.get_type_hints(declared)
    required: FrozenSet[str] = getattr(declared, "__required_keys__", frozenset())
    found = [f"{key!r} is missing (required by {declared.__name__})"
             for key in sorted(required - set(report))]
    for key, value in report.items():
        if key not in hints:
            found.append(f"{key!r} is not declared in {declared.__name__}: declare it, with its "
                         "type and meaning, in duotf/reports.py")
        elif not _fits(value, hints[key]):
            found.append(f"{key!r}: {value!r} is not {hints[key]!r}")
    return found


def _fits(value: Any, expected: Any) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if expected is type(None):
        return value is None
    if origin is typing.Union or origin is getattr(types, "UnionType", None):
        return any(_fits(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1])
                                               for k, v in value.items())
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is None and isinstance(expected, type):
        return isinstance(value, expected)
    raise TypeError(f"mismatches() has no rule for {expected!r}: add one")
