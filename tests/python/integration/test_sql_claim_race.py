"""Two dispatchers claiming at once, on two real connections, never get the same row.

pgTAP runs in one session, so this is where the claim's concurrency guarantee
is shown: the UPDATE re-checks status = 'pending' after waiting for the other
claimer's lock, with or without SKIP LOCKED in the pick.
"""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

STAGES = ["a", "b", "c", "d"]
PER_STAGE = 1500


@pytest.mark.parametrize("skip_locked", [False, True], ids=["plain", "skip_locked"])
def test_concurrent_claims_never_return_a_row_twice(dsn: str, conn, skip_locked: bool) -> None:
    for stage in STAGES:
        conn.execute(
            "SELECT count(*) FROM pepsi.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[%s]))",
            (stage, PER_STAGE),
        )
    total = len(STAGES) * PER_STAGE
    got: dict[int, list[tuple[int, str]]] = {1: [], 2: []}
    rounds: Counter[int] = Counter()
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def claimer(dispatcher_id: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                start.wait()
                while True:
                    rows = c.execute(
                        "SELECT workqueue_id, stage FROM pepsi.claim(%s, %s, %s, %s)",
                        (dispatcher_id, STAGES, [7, 5, 3, 1], skip_locked),
                    ).fetchall()
                    rounds[dispatcher_id] += 1
                    got[dispatcher_id].extend(rows)
                    if (
                        not rows
                        and not c.execute(
                            "SELECT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'pending')"
                        ).fetchone()[0]
                    ):
                        break
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(d,)) for d in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    ids1 = [r[0] for r in got[1]]
    ids2 = [r[0] for r in got[2]]
    assert len(ids1) == len(set(ids1)), "one claimer got a row twice"
    assert not set(ids1) & set(ids2), "both claimers got the same row"
    assert len(ids1) + len(ids2) == total, "every pending row was claimed exactly once"
    assert min(rounds.values()) > 10, f"both claimers kept claiming (rounds {dict(rounds)})"
    if skip_locked:
        # Without SKIP LOCKED the loser of a race waits, re-checks and mostly gets
        # nothing (fine for the one non-competing dispatcher); with it, both share.
        assert ids1 and ids2, f"both replicas got rows (rounds {dict(rounds)})"

    held = dict(conn.execute("SELECT workqueue_id, dispatcher_id FROM pepsi.workqueue").fetchall())
    assert all(held[i] == 1 for i in ids1) and all(held[i] == 2 for i in ids2), (
        "the database agrees on who holds each row"
    )
    counts = conn.execute("SELECT status, count(*) FROM pepsi.workqueue GROUP BY status").fetchall()
    assert counts == [("running", total)]


@pytest.mark.parametrize("skip_locked", [False, True], ids=["asked_to_wait", "skip_locked"])
def test_the_claim_never_waits_on_a_row_another_session_locked(
    dsn: str, conn, skip_locked: bool
) -> None:
    """An application's open SELECT ... FOR UPDATE on a pending row: the claim
    passes over it at once, whatever skip_locked says (before claim_lines v2 a
    false skip_locked waited until lock_timeout)."""
    first, second = (
        conn.execute("SELECT pepsi.enqueue('lk', '{}')").fetchone()[0] for _ in range(2)
    )
    with psycopg.connect(dsn) as holder:  # a transaction left open
        holder.execute("SELECT 1 FROM pepsi.workqueue WHERE workqueue_id = %s FOR UPDATE", (first,))
        with psycopg.connect(dsn, autocommit=True) as claimer:
            claimer.execute("SET lock_timeout = '2s'")
            for function in ("claim", "claim_lines"):
                got = claimer.execute(
                    f"SELECT workqueue_id FROM pepsi.{function}(7, ARRAY['lk'], ARRAY[10], %s)",
                    (skip_locked,),
                ).fetchall()
                assert got == ([(second,)] if function == "claim" else []), function
        holder.rollback()
    assert conn.execute(
        "SELECT status FROM pepsi.workqueue WHERE workqueue_id = %s", (first,)
    ).fetchone() == ("pending",)
