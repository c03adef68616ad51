"""What a reconnect may find, and what the dispatcher does about it.

Two findings make the ids in our workers' hands unsafe to keep:

* **declared dead** (competing mode): another replica saw our heartbeat older
  than ORPHAN_TIMEOUT and reset our running rows; it may run them already.
  Every worker is killed and every id forgotten, the owed writes too: none of
  those rows is ours any more.
* **the server restarted** (or came back from a crash), single mode: claims
  commit without waiting for their WAL flush, so the last claims before a crash may be lost
  and their rows pending again -- claimable a second time while a worker still
  has them. Every worker is killed and no id stays in hand; the owed failures
  are kept (they are fenced by dispatcher_id, so they change only rows still
  ours), the owed answer checks are dropped (the answered commit may be lost
  too), and the rows we still hold go back to pending with the strays.

A lost connection alone (the server kept running) keeps the workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sized
from typing import Protocol

from pepsi_dispatch.coordinator.database.fence import Fence
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
        if epoch is None or epoch == known or self.db.competing:
            return False  # (competing replicas claim synchronously)
        self.server_epoch = epoch
        if known is None:
            return False
        n_workers = len(self.supervisor.all())
        held = self.supervisor.drop_all()
        self.ledger.forget_holders()
        log.warning(
            "the database server restarted while we were disconnected (started %s,"
            " last crash recovery %s); its last claims may be lost, so %d worker(s)"
            " were stopped and the %d message(s) they held go back to pending",
            epoch[0],
            epoch[1],
            n_workers,
            held,
        )
        return True


__all__ = ["Comeback", "Workers"]
