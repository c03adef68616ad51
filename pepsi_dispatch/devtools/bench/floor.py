"""The floor of a drain: the statements a drain sends, in a bare loop.

``--floor`` measures, beside each throughput row, what the database does
with the same statements, batch size and number of connections when nothing
else is in the way: no dispatcher, no pipes, no handlers, no Python SDK.
PARALLELISM processes each hold one connection and loop, each batch of
QUEUE_LIMIT ids in three round trips, as a worker of the shipped SDK and its
dispatcher send them at that setting:

1. the claim (``pepsi.claim_lines`` with SKIP LOCKED and no lines, without
   waiting for the WAL flush, as a single dispatcher sends it);
2. ``BEGIN`` and ``pepsi.pin_messages`` (the check before the handlers);
3. ``pepsi.finish_many`` and ``COMMIT`` (the batch's transition).

Each process claims for itself (the real drain has one more connection, the
dispatcher's, claiming for all), until the backlog is empty. One stage only:
the floor of a pipeline would be the same loop per stage.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import psycopg

from pepsi_dispatch.enqueue import enqueue_many

__all__ = ["floor"]

CLAIM = (
    "SELECT c.workqueue_id FROM set_config('synchronous_commit', 'off', true) AS a,"
    " pepsi.claim_lines(%s::bigint, ARRAY[%s::text], ARRAY[%s::int], true, NULL, NULL) AS c"
)
PIN = "SELECT workqueue_id FROM pepsi.pin_messages(%s::bigint[], %s::bigint)"
FINISH = "SELECT pepsi.finish_many(%s::bigint[], %s::text, %s::bigint)"


def _loop(dsn: str, dispatcher_id: int, stage: str, batch: int, start: Any, out: Any) -> None:
    """One connection's loop until no row is left to claim; puts how many it finished."""
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        start.wait()
        while True:
            ids = [r[0] for r in conn.execute(CLAIM, (dispatcher_id, stage, batch)).fetchall()]
            if not ids:
                break
            with conn.pipeline():
                conn.execute("BEGIN")
                pinned = conn.execute(PIN, (ids, dispatcher_id))
            pinned.fetchall()
            with conn.pipeline():
                conn.execute(FINISH, (ids, stage, dispatcher_id))
                conn.execute("COMMIT")
            done += len(ids)
    out.put(done)


def floor(dsn: str, messages: int, parallelism: int, queue_limit: int) -> dict[str, float]:
    """The floor of a one-stage drain of ``messages`` at PARALLELISM x QUEUE_LIMIT:
    messages/s and the seconds it took (clock from the start signal to the last
    loop's end)."""
    stage = "bench_floor"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM pepsi.workqueue WHERE stage = %s", (stage,))
        enqueue_many(conn, stage, ({"n": i} for i in range(messages)))
        conn.execute("ANALYZE pepsi.workqueue")
        dispatcher_id = conn.execute(
            "SELECT pepsi.register_dispatcher('bench-floor', pg_backend_pid(), true)"
        ).fetchone()[0]  # type: ignore[index]
        try:
            ctx = multiprocessing.get_context("spawn")
            start, out = ctx.Event(), ctx.Queue()
            procs = [
                ctx.Process(target=_loop, args=(dsn, dispatcher_id, stage, queue_limit, start, out))
                for _ in range(parallelism)
            ]
            for proc in procs:
                proc.start()
            time.sleep(1.5)  # every process started and connected
            t0 = time.perf_counter()
            start.set()
            done = sum(out.get(timeout=600) for _ in procs)
            elapsed = time.perf_counter() - t0
            for proc in procs:
                proc.join(30)
        finally:
            conn.execute("SELECT pepsi.unregister_dispatcher(%s)", (dispatcher_id,))
            conn.execute("DELETE FROM pepsi.workqueue WHERE stage = %s", (stage,))
    return {"msg_per_s": done / elapsed, "elapsed": elapsed, "done": done}
