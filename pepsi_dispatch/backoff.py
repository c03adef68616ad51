"""One exponential backoff, used by every retry loop.

Before this module the doubling was written inline six times (the loop's
reconnect and query-error hold, a stage's spawn cooldown, the SDK's
reconnect, the transient-error retry). Each site keeps its own numbers; only
the arithmetic lives here.
"""

from __future__ import annotations

from pepsi_dispatch.contract import INF


class Backoff:
    """A delay that starts at ``first`` and doubles up to ``cap`` on each :meth:`next`.

    ``next()`` returns the delay to wait now and makes the following one
    twice as long; ``reset()`` goes back to ``first``. ``peek()`` tells the
    delay ``next()`` would return without advancing; ``started`` is False
    until the first ``next()`` after a reset.
    """

    __slots__ = ("first", "cap", "_delay", "started")

    def __init__(self, first: float, cap: float = INF) -> None:
        if first <= 0 or cap < first:
            raise ValueError(f"backoff needs 0 < first <= cap, got {first}, {cap}")
        self.first = first
        self.cap = cap
        self._delay = first
        self.started = False

    def next(self) -> float:
        """The delay to wait now; the one after is doubled (at most ``cap``)."""
        delay = self._delay
        self._delay = min(self.cap, delay * 2)
        self.started = True
        return delay

    def peek(self) -> float:
        """What :meth:`next` would return, without advancing."""
        return self._delay

    def reset(self) -> None:
        """Start over at ``first``."""
        self._delay = self.first
        self.started = False

    def __repr__(self) -> str:
        return f"Backoff(first={self.first}, cap={self.cap}, next={self._delay})"


__all__ = ["Backoff"]
