"""One type for every bounded wait: :class:`Deadline`, after ``distributed``'s ``Deadline.after``.

A deadline is made once, where the wait's bound is decided, and handed down; every loop under it
asks it how long is left instead of adding ``time.monotonic()`` to numbers of its own.
``Deadline.after(None)`` never expires (a wait bounded by something else: a failure, a stop).
"""

from __future__ import annotations

import time
from typing import Optional


class Deadline:
    """A point on the monotonic clock, or none (``expires_at is None``: never)."""

    __slots__ = ("started_at", "expires_at")

    def __init__(self, expires_at: Optional[float], started_at: Optional[float] = None):
        self.started_at = time.monotonic() if started_at is None else started_at
        self.expires_at = expires_at

    @classmethod
    def after(cls, duration: Optional[float]) -> "Deadline":
        """A deadline ``duration`` seconds from now (never, for ``None``)."""
        now = time.monotonic()
        return cls(None if duration is None else now + max(0.0, float(duration)), now)

    @classmethod
    def never(cls) -> "Deadline":
        return cls(None)

    @property
    def duration(self) -> Optional[float]:
        """The whole wait in seconds, as it was set (``None``: unbounded)."""
        return None if self.expires_at is None else self.expires_at - self.started_at

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def remaining(self) -> Optional[float]:
        """Seconds left, never below 0 (``None``: unbounded)."""
        if self.expires_at is None:
            return None
        return max(0.0, self.expires_at - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and time.monotonic() >= self.expires_at

    def sooner(self, seconds: Optional[float]) -> "Deadline":
        """This deadline or one ``seconds`` from now, whichever comes first."""
        other = Deadline.after(seconds)
        if other.expires_at is None:
            return self
        if self.expires_at is None or other.expires_at < self.expires_at:
            return Deadline(other.expires_at, self.started_at)
        return self

    def __repr__(self) -> str:
        left = self.remaining
        return "Deadline(never)" if left is None else f"Deadline({left:.3f} s left)"
