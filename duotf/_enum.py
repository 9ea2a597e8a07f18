"""The base of duotf's enums of names that travel as text (TF job names, check results, feed
problem kinds): members are ``str``, so JSON, comparisons with the plain value and messages keep
the text, and a typo in code is an ``AttributeError``."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    """A ``str`` enum that prints its plain value in ``str()``, f-strings and JSON on every
    Python (3.10-3.12 differ on how a str-mixin enum formats; ``enum.StrEnum`` is 3.11+)."""

    __str__ = str.__str__
    # typeshed types the unbound str.__format__ unlike Enum.__format__; the same call
    __format__ = str.__format__  # type: ignore[assignment]
