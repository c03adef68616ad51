"""Notifications, observed from a second connection (they are sent at commit).

One NOTIFY 'workqueue' per INSERT statement, however many rows; one NOTIFY
'config_changed' per statement changing pepsi.config.
"""

from __future__ import annotations

import psycopg


def drain(listener: psycopg.Connection, timeout: float = 0.5) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=timeout)]


def listening(dsn: str, *channels: str) -> psycopg.Connection:
    listener = psycopg.connect(dsn, autocommit=True)
    for channel in channels:
        listener.execute(f"LISTEN {channel}")
    return listener


def test_one_workqueue_notification_per_insert_statement(dsn: str, conn) -> None:
    with listening(dsn, "workqueue") as listener:
        conn.execute("SELECT pepsi.enqueue('a')")
        assert drain(listener) == [("workqueue", "")]

        conn.execute(
            "SELECT count(*) FROM pepsi.enqueue_many('a', array_fill('{}'::jsonb, ARRAY[5000]))"
        )
        assert drain(listener) == [("workqueue", "")], "a bulk insert is one notification"

        conn.execute("INSERT INTO pepsi.workqueue (stage) SELECT 'b' FROM generate_series(1, 100)")
        assert len(drain(listener)) == 1

        conn.execute("SELECT pepsi.enqueue('a')")
        conn.execute("SELECT pepsi.enqueue('b')")
        assert len(drain(listener)) == 2, "separate transactions notify separately"

        conn.execute("SELECT count(*) FROM pepsi.enqueue_many('a', ARRAY[]::jsonb[])")
        assert drain(listener) == [], "an empty enqueue_many inserts nothing and says nothing"

        conn.execute("SELECT count(*) FROM pepsi.claim(1, ARRAY['a'], ARRAY[10])")
        conn.execute("UPDATE pepsi.workqueue SET updated_at = now()")
        assert drain(listener) == [], "updates do not notify"


def test_rolled_back_insert_does_not_notify(dsn: str, conn) -> None:
    with listening(dsn, "workqueue") as listener:
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT pepsi.enqueue('a')")
        assert drain(listener) == []


def test_config_change_notifies_config_changed(dsn: str, conn) -> None:
    with listening(dsn, "config_changed", "workqueue") as listener:
        conn.execute(
            "INSERT INTO pepsi.config VALUES ('stage-a', 'PARALLELISM', '2'),"
            " ('stage-a', 'QUEUE_LIMIT', '3')"
        )
        assert drain(listener) == [("config_changed", "insert")]
        conn.execute("UPDATE pepsi.config SET value = '5'")
        assert drain(listener) == [("config_changed", "update")]
        conn.execute("DELETE FROM pepsi.config WHERE option = 'QUEUE_LIMIT'")
        assert drain(listener) == [("config_changed", "delete")]
        conn.execute("TRUNCATE pepsi.config")
        assert drain(listener) == [("config_changed", "truncate")]


def test_requeue_failed_notifies_workqueue_when_it_moved_rows(dsn: str, conn) -> None:
    """Requeued rows are claimed at once, not at the dispatcher's next poll."""
    conn.execute("INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'failed')")
    with listening(dsn, "workqueue") as listener:
        assert conn.execute("SELECT pepsi.requeue_failed('nothing-here')").fetchone() == (0,)
        assert drain(listener) == [], "nothing requeued, nothing said"
        assert conn.execute("SELECT pepsi.requeue_failed('a')").fetchone() == (1,)
        assert drain(listener) == [("workqueue", "")]


def test_dashboard_requeue_notifies_through_requeue_failed(dsn: str, conn) -> None:
    """dashboard_requeue v2 sends no NOTIFY of its own: requeue_failed's is the one."""
    conn.execute("INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'failed')")
    with listening(dsn, "workqueue") as listener:
        assert conn.execute("SELECT pepsi.dashboard_requeue(ARRAY[-1]::bigint[])").fetchone() == (
            0,
        )
        assert drain(listener) == [], "nothing requeued, nothing said"
        assert conn.execute(
            "SELECT pepsi.dashboard_requeue(array_agg(workqueue_id)) FROM pepsi.messages"
        ).fetchone() == (1,)
        assert drain(listener) == [("workqueue", "")]


def test_a_delayed_enqueue_also_says_delayed(dsn: str, conn) -> None:
    """The dispatcher runs requeue_due on this one only (not on every insert)."""
    with listening(dsn, "workqueue") as listener:
        conn.execute("SELECT pepsi.enqueue('a', '{}', now() + interval '1 h')")
        assert sorted(drain(listener)) == [("workqueue", ""), ("workqueue", "delayed")]
        conn.execute(
            "SELECT count(*) FROM pepsi.enqueue_many('a', ARRAY['{}']::jsonb[],"
            " now() + interval '1 h')"
        )
        assert sorted(drain(listener)) == [("workqueue", ""), ("workqueue", "delayed")]
        conn.execute("SELECT pepsi.enqueue('a', '{}', now() - interval '1 h')")
        assert drain(listener) == [("workqueue", "")], "not delayed: the plain hint only"


def test_enqueue_lines_wakes_dispatchers_as_enqueue_many_does(dsn: str, conn) -> None:
    """One notification per call (keyed or not), 'delayed' for delayed lines, none
    for a refused call; the CLI's chunks of one transaction fold into one."""
    with listening(dsn, "workqueue") as listener:
        conn.execute("SELECT count(*) FROM pepsi.enqueue_lines('a', %s::text[])", (["{}"] * 5000,))
        assert drain(listener) == [("workqueue", "")]
        conn.execute(
            "SELECT count(*) FROM pepsi.enqueue_lines('a', ARRAY['{}', '{}'],"
            " dedupe_keys => ARRAY['k1', NULL])"
        )
        assert drain(listener) == [("workqueue", "")], "keyed: one notification"
        conn.execute(
            "SELECT count(*) FROM pepsi.enqueue_lines('a', ARRAY['{}'], now() + interval '1 h')"
        )
        assert sorted(drain(listener)) == [("workqueue", ""), ("workqueue", "delayed")]
        try:
            conn.execute("SELECT count(*) FROM pepsi.enqueue_lines('a', ARRAY['{}', '[]'])")
        except psycopg.errors.InvalidParameterValue:
            pass
        assert drain(listener) == [], "a refused call inserts nothing and says nothing"
        with conn.transaction():
            for _ in range(3):
                conn.execute("SELECT count(*) FROM pepsi.enqueue_lines('a', ARRAY['{}'])")
        assert drain(listener) == [("workqueue", "")], "one transaction: one notification"
