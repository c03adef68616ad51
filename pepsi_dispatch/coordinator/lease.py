"""Competing mode: the lease a replica's heartbeat renews, and when it runs out.

Another replica resets our running rows (and may run them) once our heartbeat
is older than ORPHAN_TIMEOUT. While we cannot renew it -- the connection is
lost, or the heartbeat keeps failing -- our workers would run on, on rows that
may soon be someone else's. So the lease *lapses* a margin before that:
ORPHAN_TIMEOUT after the last heartbeat that went through, minus
:func:`margin`, measured from when that heartbeat was sent (the server stamped
it later, so others count from later still). Then the loop stops every worker
and claims nothing until a heartbeat goes through again (coordinator/dispatcher.py);
it releases nothing, since it cannot reach the database: once back, what it
still holds goes back to pending, or another replica has reset it already.
"""

from __future__ import annotations

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.contract import INF

__all__ = ["Lease", "lease_of", "margin"]


def margin(orphan_timeout: float, heartbeat_interval: float) -> float:
    """How long before ORPHAN_TIMEOUT the lease lapses: one heartbeat interval,
    at least a tenth of ORPHAN_TIMEOUT, at most a third of it."""
    return min(max(heartbeat_interval, orphan_timeout / 10), orphan_timeout / 3)


class Lease:
    """When our registration stops being safe from the other replicas' reset."""

    def __init__(self, competing: bool, orphan_timeout: float, heartbeat_interval: float) -> None:
        self.competing = competing
        self.orphan_timeout = orphan_timeout
        #: the lease lapses this long before ORPHAN_TIMEOUT
        self.margin = margin(orphan_timeout, heartbeat_interval)
        #: when the last heartbeat that went through was sent (monotonic seconds)
        self.renewed_at = -INF
        #: lapsed: the workers were stopped; no claims until the next heartbeat
        self.lapsed = False
        #: since a lapse: the rows we hold that no worker has go back to pending
        #: once the database is reached again (a reconnect, or the next heartbeat)
        self.strays_owed = False

    def renewed(self, sent_at: float) -> None:
        """A heartbeat (or registration) sent at ``sent_at`` went through."""
        self.renewed_at = max(self.renewed_at, sent_at)
        self.lapsed = False

    def deadline(self) -> float:
        """When the lease lapses (INF: single mode, not started, or lapsed already)."""
        if not self.competing or self.lapsed or self.renewed_at == -INF:
            return INF
        return self.renewed_at + self.orphan_timeout - self.margin

    def due(self, now: float) -> bool:
        """Has the lease just run out (and not been acted on yet)?"""
        return now >= self.deadline()


def lease_of(dispatch: DispatchConfig, heartbeat_interval: float) -> Lease:
    """The lease of a dispatcher with these ``[pepsi-dispatch]`` options."""
    return Lease(dispatch.competing, dispatch.orphan_timeout, heartbeat_interval)
