"""Unit test of the stats flush (invariant 10 of docs/INTERNALS.md): no database, the
typed fake store in its place, so the test needs no PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from fake_store import FakeStore


def dispatcher(tmp_path: Path, db: FakeStore) -> Any:
    """A one-stage Dispatcher on the fake store, its link up."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    conf = tmp_path / "pepsi.conf"
    conf.write_text(
        "[pepsi-dispatch]\nSERVICE_USER = root\n[database]\nDSN = postgresql:///none\n"
        "[stage-a]\nPROGRAM = /bin/true\n"
    )
    d = Dispatcher(load_config(str(conf)), db=db)
    d.link.up(0)
    return d


def test_invariant_10_stats_are_cleared_only_after_a_flush_succeeds(tmp_path: Path) -> None:
    """Invariant 10: a flush that fails because the database went away keeps
    the deltas for the next flush; a flush that succeeds clears them."""
    db = FakeStore()
    d = dispatcher(tmp_path, db)
    d.stats.succeeded("a", 0.5)
    db.fail["flush_stats"] = psycopg.OperationalError("connection lost")
    db.connections_up = False
    d.stats_flush.run(d.stats_flush.last + 1000.0, force=True)
    assert d.stats.pending(), "a failed flush must keep its deltas"
    assert not d.link.connected  # the loop reconnects; the deltas wait for it
    del db.fail["flush_stats"]
    db.connections_up = True
    d.link.up(0)
    d.stats_flush.run(d.stats_flush.last + 2000.0, force=True)
    assert len(db.flushed) == 1 and db.flushed[0]["stages"] == ["a"]
    assert not d.stats.pending()


def test_a_flush_writes_the_gauges_without_the_deltas_it_flushes(tmp_path: Path) -> None:
    """Readers add the gauges' unflushed deltas to stage_stats: the flush writes
    both in one statement, the gauges with nothing left unflushed, so a live
    counter never counts a delta twice."""
    db = FakeStore()
    d = dispatcher(tmp_path, db)
    d.stats.succeeded("a", 0.5)
    d.stats.succeeded("a", 0.25)
    before = d._gauges(0.0)["unflushed"]
    assert before["stages"]["a"]["processed"] == 2, "the gauges carry what is not flushed"
    d.stats_flush.run(d.stats_flush.last + 1000.0, force=True)
    [sent] = db.gauges
    assert sent is not None, "the flush carries the gauges"
    did, gauges = sent
    assert did == d.dispatcher_id
    assert gauges["unflushed"] == {"stages": {}, "dispatch": {}}
    assert db.flushed[0]["processed"] == [2]
