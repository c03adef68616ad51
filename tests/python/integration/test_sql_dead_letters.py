"""Kept failed rows live in pepsi.dead_letters; the hot table stays compact at any age.

Functional: a moved row keeps its id and is still found, listed, shown,
counted, requeued and purged by the same functions. Size: ids issued in
rounds of done rows (purged) and 3% kept failures; with the failures moved
out, workqueue_pkey reuses its pages round after round; left in place (the
previous design, run here as the control), it grows by the pages of every
round.
"""

from __future__ import annotations

import psycopg

ROUND = 20_000


def fail_one(conn: psycopg.Connection, stage: str = "s", key: str | None = None) -> int:
    """A message failed from pending (its attempt is recorded by the history trigger)."""
    mid = conn.execute(
        "SELECT pepsi.enqueue(%s, '{\"n\": 1}', dedupe_key => %s)", (stage, key)
    ).fetchone()[0]
    conn.execute(
        "UPDATE pepsi.workqueue SET status = 'failed', state = '{\"error\": \"boom 7\"}'"
        " WHERE workqueue_id = %s",
        (mid,),
    )
    return mid


def where(conn: psycopg.Connection, mid: int) -> list[str]:
    return [
        t
        for t in ("workqueue", "dead_letters")
        if conn.execute(f"SELECT 1 FROM pepsi.{t} WHERE workqueue_id = %s", (mid,)).fetchone()
    ]


def test_a_kept_row_moves_out_and_every_reader_still_finds_it(conn: psycopg.Connection) -> None:
    mid = fail_one(conn)
    live = conn.execute("SELECT pepsi.enqueue('s', '{}')").fetchone()[0]
    assert conn.execute("SELECT pepsi.keep_dead_letters(1000)").fetchone()[0] == 1
    assert where(conn, mid) == ["dead_letters"] and where(conn, live) == ["workqueue"]
    assert conn.execute("SELECT status FROM pepsi.get_message(%s)", (mid,)).fetchone() == (
        "failed",
    )
    assert conn.execute("SELECT count(*) FROM pepsi.message_history(%s)", (mid,)).fetchone()[0]
    listed = conn.execute(
        "SELECT workqueue_id FROM pepsi.list_messages(ARRAY['failed'], NULL, NULL, NULL, NULL)"
    ).fetchall()
    assert listed == [(mid,)]
    assert conn.execute("SELECT count(*) FROM pepsi.failed_messages()").fetchone()[0] == 1
    counts = dict(conn.execute("SELECT status, count FROM pepsi.queue_counts()").fetchall())
    assert counts.get("failed") == 1 and counts.get("pending") == 1
    queue = conn.execute("SELECT pepsi.dashboard_snapshot() -> 'queue'").fetchone()[0]
    assert {"stage": "s", "status": "failed", "count": 1} in [
        {k: q[k] for k in ("stage", "status", "count")} for q in queue
    ]  # the dashboard and /metrics
    # requeue brings it back with its id; the next keep leaves it (pending).
    assert conn.execute(
        "SELECT pepsi.requeue_failed(ids => ARRAY[%s]::bigint[])", (mid,)
    ).fetchone()
    assert where(conn, mid) == ["workqueue"]
    assert conn.execute("SELECT status FROM pepsi.get_message(%s)", (mid,)).fetchone() == (
        "pending",
    )
    assert conn.execute("SELECT pepsi.keep_dead_letters(1000)").fetchone()[0] == 0


def test_purge_deletes_a_kept_row_and_its_history(conn: psycopg.Connection) -> None:
    mid = fail_one(conn)
    conn.execute("SELECT pepsi.keep_dead_letters(1000)")
    assert conn.execute("SELECT pepsi.purge(ARRAY['failed'], dry_run => true)").fetchone() == (1,)
    assert conn.execute("SELECT pepsi.purge(ARRAY['failed'])").fetchone() == (1,)
    assert where(conn, mid) == []
    left = conn.execute("SELECT count(*) FROM pepsi.attempts WHERE workqueue_id = %s", (mid,))
    assert left.fetchone()[0] == 0


def test_a_requeued_dead_letter_whose_key_is_taken_stays_failed(conn: psycopg.Connection) -> None:
    kept = fail_one(conn, key="k")
    conn.execute("SELECT pepsi.keep_dead_letters(1000)")
    holder = conn.execute("SELECT pepsi.enqueue('s', '{}', dedupe_key => 'k')").fetchone()[0]
    assert conn.execute("SELECT pepsi.requeue_failed()").fetchone() == (0,)
    assert conn.execute("SELECT status FROM pepsi.get_message(%s)", (kept,)).fetchone() == (
        "failed",
    )
    assert holder != kept
    conn.execute("SELECT pepsi.keep_dead_letters(1000)")
    assert where(conn, kept) == ["dead_letters"]


def pkey_pages_per_round(conn: psycopg.Connection, rounds: int, keep: bool) -> list[int]:
    """workqueue_pkey's pages after each round of ROUND ids: 3% kept failed, the rest done
    and purged, then VACUUM (twice: a page deleted by one is recycled by the next)."""
    pages = []
    for _ in range(rounds):
        conn.execute(
            "INSERT INTO pepsi.workqueue (stage) SELECT 's' FROM generate_series(1, %s)", (ROUND,)
        )
        conn.execute(
            "UPDATE pepsi.workqueue SET updated_at = now() - interval '1 day',"
            " status = CASE WHEN workqueue_id % 33 = 0 THEN 'failed' ELSE 'done' END"
            " WHERE status = 'pending'"
        )
        if keep:
            conn.execute("SELECT pepsi.keep_dead_letters(%s)", (ROUND,))
        conn.execute("SELECT pepsi.purge_done(interval '1 hour', %s)", (ROUND,))
        conn.execute("VACUUM pepsi.workqueue")
        conn.execute("VACUUM pepsi.workqueue")
        size = conn.execute("SELECT pg_relation_size('pepsi.workqueue_pkey') / 8192")
        pages.append(size.fetchone()[0])
    return pages


def test_the_primary_key_stays_compact_while_failed_rows_are_kept(
    conn: psycopg.Connection,
) -> None:
    moved = pkey_pages_per_round(conn, 4, keep=True)
    assert moved[-1] <= moved[0] * 1.1, f"pages per round with dead letters: {moved}"
    kept = conn.execute("SELECT count(*) FROM pepsi.dead_letters").fetchone()[0]
    assert kept == conn.execute("SELECT count(*) FROM pepsi.messages").fetchone()[0] > 2000
    # The control: failed rows left in the hot table pin a page per round.
    conn.execute("TRUNCATE pepsi.workqueue, pepsi.dead_letters")
    pinned = pkey_pages_per_round(conn, 4, keep=False)
    assert pinned[-1] >= pinned[0] * 3, f"pages per round without: {pinned}"
