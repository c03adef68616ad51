"""The hot functions keep index plans in a session that began on an empty queue.

They are planned once per session (force_generic_plan), from the statistics of
their first call. A dispatcher or worker usually starts on an empty queue, and
then the backlog arrives with no ANALYZE in between (autovacuum may be off, or
not yet round). The plans made for the empty table must still be index scans
once the table holds thousands of rows: the test counts, in the session's own
transaction statistics, the sequential scans and the rows fetched.
"""

from __future__ import annotations

import psycopg
from conftest import alembic

BACKLOG = 20_000
STAGE = "grow"


def _plan_on_an_empty_table(conn: psycopg.Connection) -> None:
    """The first call of every hot function, while pepsi.workqueue is empty and
    its statistics say so: each one's plan is made now, for the session."""
    conn.execute("VACUUM ANALYZE pepsi.workqueue")
    conn.execute("SELECT * FROM pepsi.claim(1, ARRAY[%s], ARRAY[4])", (STAGE,))
    conn.execute("SELECT * FROM pepsi.get_messages('{1}')")
    conn.execute("SELECT * FROM pepsi.check_answered(1, '{1}')")
    conn.execute("SELECT * FROM pepsi.finish_many('{1}', %s, 1)", (STAGE,))
    conn.execute("SELECT * FROM pepsi.advance_many('{1}', %s, %s, 1)", (STAGE, STAGE))


def _scans_of_one_batch(dsn: str) -> tuple[int, int]:
    """(sequential scans, rows fetched) of claim, load, advance, finish and
    check of a batch of 4, in a session planned on the empty table after the
    backlog arrived."""
    with psycopg.connect(dsn, autocommit=True) as early, psycopg.connect(dsn) as other:
        _plan_on_an_empty_table(early)
        other.execute(
            "SELECT count(*) FROM pepsi.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[%s]))",
            (STAGE, BACKLOG),
        )
        other.commit()
        with early.transaction():
            ids = [
                r[0]
                for r in early.execute(
                    "SELECT workqueue_id FROM pepsi.claim(1, ARRAY[%s], ARRAY[4])", (STAGE,)
                )
            ]
            assert len(ids) == 4
            early.execute("SELECT * FROM pepsi.get_messages(%s)", (ids,)).fetchall()
            early.execute("SELECT pepsi.advance_many(%s, %s, %s, 1)", (ids[:1], STAGE, STAGE))
            early.execute("SELECT pepsi.finish_many(%s, %s, 1)", (ids[1:3], STAGE))
            early.execute("SELECT * FROM pepsi.check_answered(1, %s)", (ids[3:],))
            seq_scan, fetched = early.execute(
                "SELECT seq_scan, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
                " FROM pg_stat_xact_user_tables WHERE relid = 'pepsi.workqueue'::regclass"
            ).fetchone()  # type: ignore[misc]
    return seq_scan, fetched


def test_plans_made_on_an_empty_queue_stay_index_scans_as_the_backlog_grows(dsn: str) -> None:
    seq_scan, fetched = _scans_of_one_batch(dsn)
    assert seq_scan == 0, "a hot function scans the whole table (planned for an empty one)"
    assert fetched < 100, f"{fetched} rows fetched for a batch of 4 in a table of {BACKLOG}"


def test_the_plans_of_0023_scanned_the_whole_table_here(dsn: str) -> None:
    """The check above can fail: before 0024 the same session scans the table."""
    alembic(dsn, "downgrade", "0023")
    seq_scan, fetched = _scans_of_one_batch(dsn)
    assert seq_scan > 0
    assert fetched >= BACKLOG
