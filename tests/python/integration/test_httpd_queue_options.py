"""pepsi-httpd and the queue's options: the dedupe key and priority on the message
page, the schedules table, the reschedule ("Run now") button's action."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dispatch_harness import Harness, harness_fixture  # noqa: F401
from httpd_harness import Httpd


@pytest.fixture
def httpds() -> Iterator[list[Httpd]]:
    started: list[Httpd] = []
    yield started
    for s in started:
        s.stop()


def test_message_page_schedules_and_the_reschedule_action(h: Harness, httpds: list[Httpd]) -> None:
    wid = h.conn.execute(
        "SELECT pepsi.enqueue('nowhere', '{}', now() + interval '1 h', priority => 4,"
        " dedupe_key => 'report-7')"
    ).fetchone()[0]
    h.conn.execute(
        "SELECT * FROM pepsi.register_schedules(ARRAY['pulse'], ARRAY['nowhere'],"
        " ARRAY['EVERY 30 s'], ARRAY[now() + interval '30 s'])"
    )
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log", allow_actions=True)
    httpds.append(srv)

    status, _, body = srv.get(f"/api/message/{wid}")
    assert status == 200, body
    assert '"dedupe_key": "report-7"' in body and '"priority": 4' in body

    status, _, body = srv.get("/api/schedules")
    assert status == 200 and '"name": "pulse"' in body and '"spec": "EVERY 30 s"' in body

    status, reply = srv.post("/api/reschedule", {"id": wid, "in_seconds": 0})
    assert status == 200, reply
    row = h.row(wid)
    assert row["status"] == "paused" and row["retries"] == 0
    due = h.conn.execute(
        "SELECT timeout <= now() FROM pepsi.messages WHERE workqueue_id = %s", (wid,)
    )
    assert due.fetchone()[0]

    status, reply = srv.post("/api/reschedule", {"id": wid, "in_seconds": -5})
    assert status == 400 and "in_seconds" in reply["error"]

    h.conn.execute("UPDATE pepsi.workqueue SET status = 'failed' WHERE workqueue_id = %s", (wid,))
    status, reply = srv.post("/api/reschedule", {"id": wid})
    assert status == 400, reply
    assert "requeue it instead" in reply["error"] and "pepsi-queue requeue" in reply["error"]
    status, reply = srv.post("/api/reschedule", {"id": 2**62})
    assert status == 400 and "no message" in reply["error"]
