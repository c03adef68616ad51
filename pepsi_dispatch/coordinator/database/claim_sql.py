"""The claim's statements: ``pepsi.claim_lines`` (rows as workers' lines), alone
or with the answer checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pepsi_dispatch.coordinator.database.sqlarray import int_array

__all__ = ["ClaimArgs", "ClaimStatement"]

#: Arguments of ``pepsi.claim``: stages, their capacities, the claim floors
#: (aligned with the stages; None: unbounded).
ClaimArgs = tuple[list[str], list[int], list[int | None] | None]

# A single dispatcher's claim commits without waiting for its WAL flush
# (synchronous_commit off for that transaction alone): a claim lost to a server
# crash leaves its rows pending, never half-claimed, and every later synchronous
# commit -- the worker's answer above all -- flushes it first. The dispatcher
# notices a server restart at reconnect and stops every worker
# (coordinator/comeback.py). Competing replicas claim synchronously: another
# replica could take a lost claim's rows before we reconnect and stop ours.
#: The claim, each row also as a worker's line (workqueue_id, stage, priority,
#: line). The last argument is the line limit of each stage (0: bare ids).
SQL_CLAIM_LINES: Final = (
    "SELECT * FROM pepsi.claim_lines(%s::bigint, %s::text[], %s::int[], %s::boolean,"
    " %s::bigint[], %s::int[])"
)
SQL_CLAIM_LINES_NO_FLUSH_WAIT: Final = (
    "SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS async_commit,"
    " pepsi.claim_lines(%s::bigint, %s::text[], %s::int[], %s::boolean, %s::bigint[],"
    " %s::int[]) AS c"
)
#: The answer checks, then the claim, as ONE statement instead of a pipeline of
#: two (a busy stage's usual wake); they touch disjoint rows (running, pending).
#: Columns: workqueue_id, stage, priority, line, checked.
SQL_CHECK_AND_CLAIM: Final = (
    "SELECT a.workqueue_id, a.stage, NULL::integer AS priority, NULL::text AS line,"
    " true AS checked FROM pepsi.check_answered(%s::bigint, %s::bigint[]) AS a"
    " UNION ALL SELECT c.workqueue_id, c.stage, c.priority, {line}, false FROM ({claim}) AS c"
)


class ClaimStatement:
    """The claim as sent (``pepsi.claim_lines``): without waiting for the WAL
    flush unless ``competing``."""

    def __init__(self, competing: bool) -> None:
        self.competing = competing
        #: the claim alone
        self.sql = SQL_CLAIM_LINES if competing else SQL_CLAIM_LINES_NO_FLUSH_WAIT
        #: the answer checks and the claim in one statement
        self.with_checks = SQL_CHECK_AND_CLAIM.format(claim=self.sql, line="c.line")

    def args(
        self,
        dispatcher_id: int,
        stages: Sequence[str],
        caps: Sequence[int],
        after_ids: Sequence[int | None] | None,
        line_limits: Sequence[int] | None = None,
    ) -> tuple[Any, ...]:
        """The claim's parameters (``line_limits``: see ``Database.claim``)."""
        bounds = None if after_ids is None else int_array(after_ids)
        # skip_locked: claim_lines always skips locked rows; sent as true for clarity.
        limits = None if line_limits is None else int_array(line_limits)
        return (dispatcher_id, list(stages), int_array(caps), True, bounds, limits)
