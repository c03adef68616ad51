"""What a reconnect may find, and what the dispatcher does about it.

Two findings make the ids in our workers' hands unsafe to keep:

* **declared dead** (competing mode): another replica saw our heartbeat older
  than ORPHAN_TIMEOUT and reset our running rows; it may run them already.
  Every worker is killed and every id forgotten, the owed writes too: none of
  those rows is ours any more.
* **the server restarted** (a new start time or statistics reset time: a
  crash, a failover, a clean restart): claims commit without waiting for
  their WAL flush, so the last claims before a crash may be lost and their
  rows pending (or paused) again -- claimable a second time while a worker
  still has them. Every worker is killed and no id stays in hand; the owed
  failures are kept (they are fenced by dispatcher_id, so they change only
  rows still ours), the owed answer checks are dropped (the answered commit
  may be lost too, on a standby that took over), and the rows we still hold
  go back to pending with the strays. A clean restart loses nothing, but
  nothing this side can prove a restart clean (a standby made from a cold
  copy keeps the primary's statistics), so it is treated alike.

A lost connection alone (the server kept running) keeps the workers.

In competing mode another replica could claim such a row before we come
back and stop our workers. So after connecting (at start, and after every
reconnect) a replica claims nothing until every other replica that last
heartbeated before the server restarted has come back or is ORPHAN_TIMEOUT
old (:class:`ReplicasHold`, ``pepsi.replicas_away``); a replica whose host is
gone for good is unregistered by hand (the wait names it). Our own heartbeat
after a reconnect runs only once the checks above have stopped our workers,
which is what the others wait for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sized
from typing import Protocol

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.database.link import error_line
from pepsi_dispatch.coordinator.database.port import DispatchStore, Epoch
from pepsi_dispatch.coordinator.ledger import Ledger

log = logging.getLogger("pepsi_dispatch")


class Workers(Protocol):
    """What the comeback checks do to the workers' side (the supervisor): count
    them, and stop them all, letting go of their ids."""

    def all(self) -> Sized:
        """Every worker."""
        ...

    def drop_all(self) -> int:
        """Kill and reap every worker, forget its ids; how many ids they held."""
        ...


class Comeback:
    """Checks run after a reconnect, before the strays are released."""

    def __init__(
        self,
        db: DispatchStore,
        supervisor: Workers,
        ledger: Ledger,
        declared_dead: Callable[[], bool],
        fence: Fence | None = None,
    ) -> None:
        self.db = db
        self.supervisor = supervisor
        self.ledger = ledger
        self.declared_dead = declared_dead
        #: our id, to release what we still hold once declared dead (None: nothing)
        self.fence = fence
        #: the epoch of the server we last worked with (None: not connected yet).
        self.server_epoch: Epoch | None = None

    def connected(self) -> None:
        """The first connection is up: remember which server this is."""
        self.server_epoch = self.db.server_epoch

    def check_registration(self) -> None:
        """Competing: if another replica declared us dead and reset our rows,
        kill every worker and drop every id it held, or that we owed a write
        for: none of them is ours any more (a late write would be refused by
        the fencing token anyway, but the work itself must stop). The
        heartbeat then registers us again."""
        if not self.declared_dead():
            return
        n_workers = len(self.supervisor.all())
        held = self.supervisor.drop_all()
        self.ledger.drop_all()
        log.error(
            "this replica was declared dead by another (its heartbeat was older than"
            " ORPHAN_TIMEOUT) and its rows were reset; killed %d worker(s) and dropped"
            " %d message(s) they held; registering again",
            n_workers,
            held,
        )
        # Rows still running under our id: the other replica skipped them while
        # one of our workers had them pinned (pepsi.pin_messages). Nobody resets
        # them once we are registered again, so they go back to pending first
        # (a failure raises before the heartbeat: the next check does it again).
        if self.fence is not None:
            left = self.db.release(self.fence.id, None)
            if left:
                log.info("released %d row(s) still running under our id", left)

    def check_server_restart(self) -> bool:
        """If the server restarted since we last worked with it, stop every
        worker and let go of every id in hand. True if it did."""
        epoch, known = self.db.server_epoch, self.server_epoch
        if epoch is None or epoch == known:
            return False
        self.server_epoch = epoch
        if known is None:
            return False
        n_workers = len(self.supervisor.all())
        held = self.supervisor.drop_all()
        self.ledger.forget_holders()
        log.warning(
            "the database server restarted while we were disconnected (started %s,"
            " statistics reset %s); its last claims may be lost, so %d worker(s)"
            " were stopped and the %d message(s) they held go back to pending",
            epoch[0],
            epoch[1],
            n_workers,
            held,
        )
        return True


class ReplicasHold:
    """Competing mode: no claims after connecting while another replica may
    still run rows whose claims a server restart lost (see the module's text)."""

    #: how often the other replicas are asked about while holding (seconds)
    CHECK_EVERY = 0.2
    #: holding this long is logged, with the replicas waited for (seconds)
    SAY_AFTER = 1.0
    #: after the question failed with the connections up (seconds)
    RETRY_AFTER_ERROR = 5.0
    #: such a failure is logged at most this often (seconds)
    SAY_ERROR_EVERY = 60.0

    def __init__(self, db: DispatchStore, fence: Fence, orphan_timeout: float) -> None:
        self.db = db
        self.fence = fence
        self.orphan_timeout = orphan_timeout
        #: claims wait (set at each connect in competing mode)
        self.holding = False
        self.since = 0.0
        self.next_check = 0.0
        self.said = False
        self.error_said_at = -INF

    def connected(self, now: float) -> None:
        """At start and after every reconnect (the server may have restarted, or
        be a promoted standby): hold the claims until the other replicas are
        back (competing mode only)."""
        if not self.db.competing:
            return
        self.holding, self.since, self.next_check, self.said = True, now, now, False

    def next_due(self) -> float:
        """When to ask again (INF: not holding)."""
        return self.next_check if self.holding else INF

    def failed(self, now: float, exc: BaseException) -> None:
        """The question itself failed with the connections up: keep holding the
        claims (nothing says the others are back), ask again later, say why
        (at most every :data:`SAY_ERROR_EVERY`)."""
        self.next_check = now + self.RETRY_AFTER_ERROR
        if now < self.error_said_at + self.SAY_ERROR_EVERY:
            return
        self.error_said_at = now
        log.error(
            "competing mode: cannot ask which replicas are away (%s); claiming nothing,"
            " asking again every %g s (is the schema migrated, and may this role execute"
            " pepsi.replicas_away? pepsi-dispatch serve --check tells)",
            error_line(exc),
            self.RETRY_AFTER_ERROR,
        )

    def check(self, now: float) -> None:
        """Ask which replicas claims wait for; end the hold when none. Raises StoreError."""
        if not self.holding or now < self.next_check:
            return
        away = self.db.replicas_away(self.fence.id, self.orphan_timeout)
        if not away:
            self.holding = False
            if self.said:
                log.info("the other replicas are back: claiming again")
            return
        self.next_check = now + self.CHECK_EVERY
        if not self.said and now - self.since >= self.SAY_AFTER:
            self.said = True
            log.warning(
                "the database server restarted while replica(s) %s ran: claiming nothing until"
                " each is back (it stops its workers first) or its heartbeat is older"
                " than ORPHAN_TIMEOUT (%g s), so that no message runs twice (a replica whose"
                " host is gone for good: unregister it with pepsi.unregister_dispatcher(N),"
                " as this role)",
                ", ".join(f"{i} (host {host}, pid {pid})" for i, host, pid in away),
                self.orphan_timeout,
            )


__all__ = ["Comeback", "ReplicasHold", "Workers"]
